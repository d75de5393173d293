"""`spatial-jax gen-data`: writes the synthetic spatial world as train / held-out JSONL files plus PNG images.

Exit status: 0 once written, 1 when writing fails (disk full, no permission), 2 for a bad argument (checked before
anything is written).
"""

from __future__ import annotations

import argparse
import json
import sys


def _size(text: str) -> tuple[int, int]:
    """`96` -> (96, 96); `128x96` -> (128, 96) as width x height."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"image size {text!r} must read N or WxH") from None
    if len(parts) == 1:
        return parts[0], parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise argparse.ArgumentTypeError(f"image size {text!r} must read N or WxH")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output folder (train.jsonl, heldout.jsonl, images/)")
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--num-eval", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image-size", type=_size, default=(96, 96), help="N or WxH pixels (default 96)")
    parser.add_argument("--corrupt-fraction", type=float, default=0.0, help="share of pseudo-GT boxes corrupted (A.3)")
    parser.add_argument(
        "--question-types",
        default="relative_position,size,nearest,counting",
        help="comma-separated subset of relative_position,size,nearest,counting,distance",
    )
    parser.add_argument("--min-objects", type=int, default=4)
    parser.add_argument("--max-objects", type=int, default=6)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from spatial_jax.data.jsonl import write_jsonl
    from spatial_jax.data.synthetic import SyntheticConfig, SyntheticSource

    if args.num_train < 0 or args.num_eval < 0:
        print("spatial-jax gen-data: --num-train and --num-eval must be >= 0", file=sys.stderr)
        return 2
    try:
        cfg = SyntheticConfig(
            width=args.image_size[0],
            height=args.image_size[1],
            min_objects=args.min_objects,
            max_objects=args.max_objects,
            question_types=tuple(q.strip() for q in args.question_types.split(",") if q.strip()),
            corrupt_fraction=args.corrupt_fraction,
            seed=args.seed,
        )
    except ValueError as e:
        print(f"spatial-jax gen-data: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"spatial-jax gen-data: --out {out} is a file, not a folder", file=sys.stderr)
        return 2
    counts = {}
    try:
        for split, num in (("train", args.num_train), ("heldout", args.num_eval)):
            counts[split] = write_jsonl(SyntheticSource(cfg, split, num), out / f"{split}.jsonl",
                                        out / "images" / split)
        (out / "config.json").write_text(json.dumps({**cfg.__dict__, "counts": counts}, indent=1) + "\n")
    except OSError as e:
        print(f"spatial-jax gen-data: cannot write to {out}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {counts['train']} train and {counts['heldout']} held-out samples to {out}")
    return 0
