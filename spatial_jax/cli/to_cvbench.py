"""`spatial-jax to-cvbench`: a dataset's multiple-choice image questions (default: the config's data.eval, the
synthetic world's held-out questions for the main job) written as a CV-Bench copy
(spatial_jax/suites/to_cvbench.py), for `spatial-jax eval --benchmark cvbench --layout method` to evaluate them
as plain `spatial-jax eval` does.

Exit status: 0 once written, 1 for a sample that has no CV-Bench record or an unwritable folder, 2 for a bad
argument or a folder already holding a name the copy writes (cli/outputs.new_files: nothing is left behind).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spatial_jax.suites.to_cvbench import TWO_D

    p.add_argument("--config", default=None, help="the TOML config whose data.synthetic world a synthetic source draws "
                   "from (default: the README main job, configs/tiny_cpu.toml)")
    p.add_argument("--data", default=None, help="JSONL, synthetic:<split>:<n> or FORMAT:PATH (default: data.eval)")
    p.add_argument("--out", required=True, help="the copy's folder (test_2d.jsonl and img/ are written in it)")
    p.add_argument("--source", choices=TWO_D, default="COCO",
                   help="the CV-Bench 2D source the records are filed under (the table's row; both score alike)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


def run(args) -> int:
    from spatial_jax.cli.job_config import job_files, load_job
    from spatial_jax.cli.outputs import check_folder, new_files, refuse_overwriting
    from spatial_jax.data.pipeline import open_source
    from spatial_jax.data.sources import refuse_writing_into_copies, spec_paths
    from spatial_jax.suites.to_cvbench import write

    cfg = load_job(args.config, args.overrides)
    data = args.data or cfg.data.eval
    refuse_overwriting({"--out": args.out}, [*job_files(args.config), *spec_paths(data)])
    refuse_writing_into_copies({"--out": args.out}, data)
    check_folder(args.out, "--out")
    with new_files(args.out, "--out") as stage:
        n = write(open_source(data, cfg.data.synthetic), stage, args.source)
    print(f"wrote {n} CV-Bench records of {data} to {args.out}")
    return 0
