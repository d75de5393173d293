"""`spatial-jax gen-data`: writes the synthetic spatial world as train / held-out JSONL files plus PNG images.

`--config` takes a job's TOML file and writes its world (`data.synthetic`) and as many questions as the job draws
(`data.train`, `data.eval` when synthetic): `--config configs/tiny_cpu.toml` writes the main job's data. Flags and
`key=value` settings of the world (`grid=2`, `anchor=blue`, `mirror_colors=["green"]`, ...) go on top.
Exit status: 0 once written, 1 when writing fails (disk full, no permission), 2 for a bad argument (checked before
anything is written), a count the disk cannot hold or a folder already holding a name it writes (cli/outputs.new_files:
nothing is left behind).
"""

from __future__ import annotations

import argparse
import json
import sys

# flag -> the world's setting it gives; None (not given) leaves the config's
FLAGS = {"seed": "seed", "corrupt_fraction": "corrupt_fraction", "min_objects": "min_objects",
         "max_objects": "max_objects"}
# split -> (its count without a config, the DataConfig source a job draws it from)
COUNTS = {"train": (1000, "train"), "heldout": (200, "eval")}


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
    parser.add_argument("--config", default=None,
                        help="a job's TOML file: its data.synthetic world and data.train / data.eval counts "
                             "(configs/tiny_cpu.toml: the main job's data; default: the world's defaults)")
    parser.add_argument("--num-train", type=int, default=None, help="default: the config's, else 1000")
    parser.add_argument("--num-eval", type=int, default=None, help="default: the config's, else 200")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--image-size", type=_size, default=None, help="N or WxH pixels (default 96)")
    parser.add_argument("--corrupt-fraction", type=float, default=None,
                        help="share of pseudo-GT boxes corrupted (A.3)")
    parser.add_argument("--question-types", default=None,
                        help="comma-separated subset of relative_position,size,nearest,counting,distance")
    parser.add_argument("--min-objects", type=int, default=None)
    parser.add_argument("--max-objects", type=int, default=None)
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help='settings of the world (data.synthetic\'s keys), e.g. grid=2 anchor=blue '
                             'mirror_colors=["green"] mirror_rate=0.7')


def world(args: argparse.Namespace):
    """(SyntheticConfig, {split: count}) from --config, the flags and the key=value settings, in that order."""
    from spatial_jax.cli.job_config import load_job
    from spatial_jax.config import apply_overrides, parse_overrides
    from spatial_jax.data.pipeline import open_source
    from spatial_jax.data.synthetic import SyntheticConfig

    cfg, counts = SyntheticConfig(), {split: default for split, (default, _) in COUNTS.items()}
    if args.config:
        job = load_job(args.config, [])
        cfg = job.data.synthetic
        for split, (_, field) in COUNTS.items():
            spec = getattr(job.data, field)
            source = open_source(spec, cfg) if spec.startswith("synthetic:") else None
            if source is not None and source.split == split:
                counts[split] = source.num
    settings = {name: getattr(args, flag) for flag, name in FLAGS.items() if getattr(args, flag) is not None}
    if args.image_size is not None:
        settings["width"], settings["height"] = args.image_size
    if args.question_types is not None:
        settings["question_types"] = [q.strip() for q in args.question_types.split(",") if q.strip()]
    cfg = apply_overrides(cfg, {**settings, **parse_overrides(args.overrides)})
    for split, given in (("train", args.num_train), ("heldout", args.num_eval)):
        counts[split] = given if given is not None else counts[split]
    return cfg, counts


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from spatial_jax.cli.outputs import check_folder, check_room, new_files
    from spatial_jax.data.jsonl import write_jsonl
    from spatial_jax.data.synthetic import SyntheticSource, written_bytes

    if (args.num_train or 0) < 0 or (args.num_eval or 0) < 0:
        print("spatial-jax gen-data: --num-train and --num-eval must be >= 0", file=sys.stderr)
        return 2
    cfg, wanted = world(args)
    check_folder(args.out, "--out")
    out = Path(args.out)
    check_room(out, sum(written_bytes(cfg, n) for n in wanted.values()), f"--out {out}: {sum(wanted.values())} samples")
    counts = {}
    try:
        with new_files(args.out, "--out") as stage:
            stage.mkdir(parents=True)
            for split, num in wanted.items():
                counts[split] = write_jsonl(SyntheticSource(cfg, split, num), stage / f"{split}.jsonl",
                                            stage / "images" / split)
            (stage / "config.json").write_text(json.dumps({**cfg.__dict__, "counts": counts}, indent=1) + "\n")
    except OSError as e:
        print(f"spatial-jax gen-data: cannot write to {out}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {counts['train']} train and {counts['heldout']} held-out samples to {out}")
    return 0
