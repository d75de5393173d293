"""`spatial-jax data show SPEC` / `spatial-jax data check SPEC [data.KEY=VALUE ...]`: a dataset as training reads it.

show: the first N rows, one JSON object each (--json) or one line each: id, question (as the model is shown it,
without the options where the layout keeps them apart), options ([] without), answer (the gold as the reward reads
it: an option letter, a number or a short text) and answer_type, images ([{width, height}]), video ({frames, fps} or
null), and gt_boxes / scene where the row has them. check: reads and encodes every row as the job's preflight does
(`--config` and key=value overrides as `train` takes them, the main job by default: its policy's tokenizer and image
settings, its method's prompt, data.max_image_pixels, data.bucket_lengths; --sft adds the SFT target; an id given
twice is a bad row), prints the counts (rows, per category, multiple choice / numeric / text, rows without pictures,
the longest row's tokens against the largest bucket) and one line per failing row naming its file, row and field;
with data.bad_rows=skip the rows training would skip, by reason, and a refusal where they are over
data.max_bad_share.
SPEC is any data source (data/sources: a JSONL path, FORMAT:PATH[:split], mix:...). Nothing is written.
Exit status: 0, 1 for a row that cannot be read (check: any failing row that training would not skip, or an empty
source), 2 for a bad argument.
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
        else:
            q.add_argument("--config", default=None,
                           help="the job whose encoding and data settings apply (default: the main job, as train)")
            q.add_argument("--sft", action="store_true", help="encode each row's SFT target too, as SFT batches do")
            q.add_argument("overrides", nargs="*", metavar="key=value",
                           help="config overrides as train takes them, e.g. data.bad_rows=skip")


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


def _reference(sample) -> str | dict | None:
    """The SFT target: a layout's one completion, or the synthetic world's one per method prompt."""
    texts = set(sample.reference.values())
    return None if not texts else texts.pop() if len(texts) == 1 else dict(sample.reference)


def row_view(sample) -> dict:
    out = {"id": sample.id, "question": sample.question, "options": list(sample.options),
           "answer": _plain(sample.answer) if sample.answer_type == "number" else sample.answer,
           "answer_type": sample.answer_type, "category": sample.category, "reference": _reference(sample),
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
    from spatial_jax.cli.job_config import load_job
    from spatial_jax.config import ConfigError
    from spatial_jax.data.pipeline import open_source

    if args.action == "show" and args.n < 0:
        raise ConfigError(f"-n must be >= 0, got {args.n}")
    job = load_job(args.config, args.overrides) if args.action == "check" else None
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
    return check(source, job, "sft" if args.sft else "rl", not args.spec.startswith("mix:"))


KINDS = {"choice": "multiple-choice", "number": "numeric", "text": "text"}


def check(source, job, mode: str = "rl", unique_ids: bool = True) -> int:
    """Every row encoded as the job's preflight encodes it (pipeline.row_tokens), screened by data.bad_rows."""
    from spatial_jax.data.pipeline import row_tokens
    from spatial_jax.data.sample import DatasetError
    from spatial_jax.data.screen import screen
    from spatial_jax.rl.policy import policy_encoding

    data = job.data
    tok, image_cfg = policy_encoding(job.policy)
    tokens = row_tokens(tok, data, job.plugin.prompt, mode, image_cfg)
    kinds, categories, failures, longest = Counter(), Counter(), [], [0]

    def read(sample):
        longest[0] = max(longest[0], tokens(sample))
        kinds[KINDS[sample.answer_type]] += 1
        kinds["text-only"] += sample.text_only
        categories[sample.category or "(none)"] += 1

    skip = data.bad_rows == "skip"
    refusal = None
    try:
        reasons = screen(source, read, "skip", data.max_bad_share if skip else 1.0, unique_ids=unique_ids,
                         errors=failures)
    except DatasetError as e:  # over data.max_bad_share: training refuses the source
        refusal, reasons = str(e), Counter()
    counts = {"rows": len(source), "ok": len(source) - len(failures), "failed": len(failures),
              **{k: kinds[k] for k in KINDS.values()}, "text-only": kinds["text-only"],
              "categories": dict(sorted(categories.items())),
              "tokens": {"longest": longest[0], "largest_bucket": max(data.bucket_lengths), "mode": mode}}
    if skip:
        counts["skipped"] = dict(reasons.most_common()) if refusal is None else {}
    print(json.dumps(counts))
    for message in failures:
        print(f"FAIL {' '.join(message.split())}")
    if not len(source):
        print("spatial-jax data check: the source holds no row; training refuses it", file=sys.stderr)
        return 1
    if refusal is not None:
        print(f"spatial-jax data check: {' '.join(refusal.split())}", file=sys.stderr)
        return 1
    if failures and not skip:
        print(f"spatial-jax data check: {len(failures)} of {len(source)} rows fail", file=sys.stderr)
        return 1
    if failures:
        print(f"spatial-jax data check: training skips {len(failures)} of {len(source)} rows (data.bad_rows=skip)",
              file=sys.stderr)
    return 0
