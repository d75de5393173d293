"""`spatial-jax data show SPEC` / `spatial-jax data check SPEC`: a dataset as training reads it.

show: the first N rows, one JSON object each (--json) or one line each: id, question (as the model is shown it,
without the options where the layout keeps them apart), options ([] when open-ended), answer (the gold as the reward
reads it: an option letter or a number), images ([{width, height}]), video ({frames, fps} or null), and gt_boxes /
scene where the row has them. check: reads every row and picture, prints the counts (rows, per category, multiple
choice / numeric / open-ended) and one line per failing row naming its file, row and field.
SPEC is any data source (data/sources: a JSONL path, FORMAT:PATH[:split], mix:...). Nothing is written.
Exit status: 0, 1 for a row that cannot be read (check: any failing row), 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    for name, help_ in (("show", "print the first rows as training reads them"),
                        ("check", "read every row and picture; count them and list the failing rows")):
        q = sub.add_parser(name, help=help_, description=help_)
        q.add_argument("spec", help="data source: a JSONL path, FORMAT:PATH[:split] or mix:W*SPEC|W*SPEC")
        q.add_argument("--column", action="append", default=[], metavar="FIELD=COLUMN",
                       help="rename a layout's field (data.columns), repeatable")
        q.add_argument("--seed", type=int, default=0, help="a mixture's draw (data.seed)")
        if name == "show":
            q.add_argument("-n", type=int, default=5, help="rows to show (default 5)")
            q.add_argument("--json", action="store_true", help="one JSON object per row")


def _size(sample, ref) -> dict:
    if isinstance(ref, str):
        from PIL import Image

        try:
            with Image.open(ref) as im:
                return {"width": im.width, "height": im.height}
        except (OSError, SyntaxError, ValueError) as e:
            raise sample.error(f"image {ref}: {e}") from None
    return {"width": int(ref.shape[1]), "height": int(ref.shape[0])}


def _video(sample) -> dict | None:
    v = sample.video
    if v is None:
        return None
    if v.path is None:
        return {"frames": len(v.frames), "fps": v.fps}
    import av

    try:
        with av.open(v.path) as container:
            stream = container.streams.video[0]
            frames = stream.frames or sum(1 for _ in container.decode(stream))
            fps = v.fps or float(stream.average_rate or stream.guessed_rate or 0) or None
    except (av.FFmpegError, IndexError, ValueError, OSError) as e:
        raise sample.error(f"video {v.path}: cannot be read ({e})") from None
    return {"frames": int(frames), "fps": fps}


def row_view(sample) -> dict:
    out = {"id": sample.id, "question": sample.question, "options": list(sample.options),
           "answer": sample.answer if sample.answer_type == "choice" else _plain(sample.answer),
           "images": [_size(sample, r) for r in sample.image_refs], "video": _video(sample)}
    if sample.gt_boxes:
        out["gt_boxes"] = [{"bbox_2d": list(b.bbox), "label": b.label, "validity": b.validity}
                           for b in sample.gt_boxes]
    if sample.scene is not None:
        out["scene"] = sample.scene
    return out


def _plain(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def run(args) -> int:
    from spatial_jax.config import ConfigError
    from spatial_jax.data.pipeline import open_source

    if args.action == "show" and args.n < 0:
        raise ConfigError(f"-n must be >= 0, got {args.n}")
    source = open_source(args.spec, columns=tuple(args.column), seed=args.seed)
    if args.action == "show":
        for i in range(min(args.n, len(source))):
            view = row_view(source[i])
            if args.json:
                print(json.dumps(view, ensure_ascii=False))
            else:
                sizes = ", ".join(f"{d['width']}x{d['height']}" for d in view["images"])
                seen = f"video {view['video']['frames']} frames" if view["video"] else f"images [{sizes}]"
                opts = " | ".join(f"{chr(65 + k)}. {o}" for k, o in enumerate(view["options"]))
                print(f"{view['id']}: {view['question']!r} {opts} -> {view['answer']} ({seen})")
        return 0
    return check(source)


def check(source) -> int:
    from spatial_jax.data.pipeline import load_visuals
    from spatial_jax.data.sample import DatasetError
    from spatial_jax.data.sources.fields import OpenAnswer

    kinds, categories, failures = Counter(), Counter(), []
    for i in range(len(source)):
        try:
            sample = source[i]
            load_visuals(sample)
        except OpenAnswer as e:
            kinds["open"] += 1
            failures.append(str(e))
            continue
        except DatasetError as e:
            failures.append(str(e))
            continue
        kinds["multiple-choice" if sample.answer_type == "choice" else "numeric"] += 1
        categories[sample.category or "(none)"] += 1
    print(json.dumps({"rows": len(source), "ok": len(source) - len(failures), "failed": len(failures),
                      "multiple-choice": kinds["multiple-choice"], "numeric": kinds["numeric"], "open": kinds["open"],
                      "categories": dict(sorted(categories.items()))}))
    for message in failures:
        print(f"FAIL {' '.join(message.split())}")
    if failures:
        print(f"spatial-jax data check: {len(failures)} of {len(source)} rows fail", file=sys.stderr)
    return 1 if failures else 0
