"""Preview the synthetic spatial world: a contact sheet of scenes with their pseudo-GT boxes, plus prompts and targets.

    python tools/make_synthetic.py --out /tmp/preview --num 8 --corrupt-fraction 0.4 --method spatialcore

Clean object boxes are drawn in black, pseudo-GT boxes in magenta (thicker = higher validity). The datasets
themselves are written by `spatial-jax gen-data`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image, ImageDraw

from spatial_jax.cli import one_line_errors
from spatial_jax.config import ConfigError, FieldError
from spatial_jax.data import prompts, synthetic
from spatial_jax.methods import METHODS

# a contact sheet to look at: past these it is no preview (and the sheet's pixels grow with num x (size x scale)^2)
MAX_NUM, MAX_SIDE = 64, 4096


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--num", type=int, default=8)
    p.add_argument("--split", default="train", choices=sorted(synthetic.SPLITS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--scale", type=int, default=3, help="upscale factor of the sheet")
    p.add_argument("--corrupt-fraction", type=float, default=0.0)
    p.add_argument("--method", default="spatialcore", choices=sorted(METHODS))
    args = p.parse_args(argv)
    return one_line_errors("make_synthetic.py", lambda: preview(args))


def preview(args: argparse.Namespace) -> int:
    if not 1 <= args.num <= MAX_NUM:
        raise ConfigError(f"--num must lie in [1, {MAX_NUM}], got {args.num}")
    if args.scale < 1 or args.size * args.scale > MAX_SIDE:
        raise ConfigError(f"--scale must be >= 1 with --size x --scale <= {MAX_SIDE} pixels, got {args.scale} "
                          f"(--size {args.size})")
    try:
        cfg = synthetic.SyntheticConfig(
            width=args.size,
            height=args.size,
            seed=args.seed,
            corrupt_fraction=args.corrupt_fraction,
            question_types=synthetic.QUESTION_TYPES,
        )
    except FieldError as e:
        flag = {"width": "--size", "height": "--size"}.get(e.field, "--" + e.field.replace("_", "-"))
        raise ConfigError(f"{flag}: {e}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    k = args.scale
    tiles = []
    lines = []
    for i in range(args.num):
        s = synthetic.make_sample(cfg, args.split, i)
        im = Image.fromarray(s.image).resize((cfg.width * k, cfg.height * k), Image.Resampling.NEAREST)
        draw = ImageDraw.Draw(im)
        for o in s.meta["objects"]:
            draw.rectangle([c * k for c in o["bbox"]], outline=(0, 0, 0))
        for b in s.gt_boxes:
            x1, y1, x2, y2 = b.bbox
            sx, sy = cfg.width * k / 1000, cfg.height * k / 1000
            box = [x1 * sx, y1 * sy, x2 * sx, y2 * sy]
            draw.rectangle(box, outline=(220, 0, 220), width=1 + int(2 * b.validity))
        tiles.append(im)
        fmt = METHODS[args.method].prompt
        corruption = [r["kind"] for r in s.meta["corruption"]]
        lines += [f"== {s.id} [{s.category}] gold {s.answer}", prompts.user_text(s, fmt), f"corruption: {corruption}",
                  "-- target:", s.reference[fmt.reference_key], ""]
    cols = min(4, len(tiles))
    rows = (len(tiles) + cols - 1) // cols
    sheet = Image.new("RGB", (cols * cfg.width * k, rows * cfg.height * k), (255, 255, 255))
    for j, t in enumerate(tiles):
        sheet.paste(t, ((j % cols) * cfg.width * k, (j // cols) * cfg.height * k))
    sheet.save(out / "sheet.png")
    (out / "samples.txt").write_text("\n".join(lines))
    print(f"wrote {out / 'sheet.png'} and {out / 'samples.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
