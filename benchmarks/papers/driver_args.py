"""The one argument check of the benchmark drivers (papers.py, uncertain.py, learning.py, rollout_gap.py), made before
the first run with the commands' own guards (spatial_jax/cli/outputs.py, script_guard.py): --results is an existing
Markdown file that is none of the inputs, --out is a folder that is none of them, seeds are distinct and lie in
[0, 2**31), every count lies within its bounds and fits on the disk, and no key=value override sets what the driver
sets per run itself. When its runs start, a driver claims --out (script_guard.claim_folder): new, empty or its own."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from pathlib import Path

from spatial_jax.cli.outputs import check_folder, check_room, refuse_overwriting
from spatial_jax.cli.script_guard import check_counts
from spatial_jax.config import ConfigError, parse_overrides


def _keys(tree: dict, prefix: str = "") -> Iterable[str]:
    for key, value in tree.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _keys(value, f"{prefix}{key}.")


def check(args: argparse.Namespace, owned: Mapping[str, str], inputs: Iterable[str | None] = (),
          counts: Mapping[str, tuple[int, int, int]] = {}, room: int = 0) -> None:
    """ConfigError naming the first bad argument. `args` holds config, seeds, out, results and overrides; `owned`
    maps each setting the driver sets per run to what sets it (`{"run_dir": "--out"}`); `inputs` are files the runs
    read besides --config; `counts` maps a count flag to (its value, its least, its most); `room` is the bytes the
    driver writes under --out before its first run (refused when the disk has less free)."""
    seeds = list(args.seeds)
    if len(set(seeds)) != len(seeds) or min(seeds) < 0 or max(seeds) >= 2**31:
        raise ConfigError(f"--seeds must be distinct integers in [0, 2**31), got {seeds}")
    for key in _keys(parse_overrides(args.overrides)):
        if key in owned:
            raise ConfigError(f"{key}= is set by the driver for each run ({owned[key]}): leave it out of the "
                              "overrides")
    check_counts(counts)
    check_folder(args.out, "--out")
    refuse_overwriting({"--out": args.out, "--results": args.results}, [args.config, *inputs])
    if args.results:
        if not Path(args.results).is_file():
            raise ConfigError(f"--results {args.results}: no such file (the tables go into an existing RESULTS.md)")
        if Path(args.results).suffix.lower() != ".md":
            raise ConfigError(f"--results {args.results} is not a Markdown file: the tables go into RESULTS.md")
    if room:
        check_room(args.out, room, f"--out {args.out}")
