"""`spatial-jax score`: score rollouts from a JSONL file with one method's reward, offline.

Reward constants are overridden with the same keys as in `train`: `rewards.<method>.<name>=value`.
Exit status: 0 once the file is scored (malformed lines are reported to stderr with their line number and counted in
the summary), 1 when the input cannot be read or the output cannot be written (checked before scoring), 2 for an
unknown method, backend or config key, or an output that is the input file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from spatial_jax.cli.outputs import refuse_overwriting


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method", required=True, help="spatialcore, prosr, spatialthinker or allospatial")
    parser.add_argument("--input", required=True, help="rollouts, one JSON object per line")
    parser.add_argument("--output", default=None, help="scored JSONL (default: stdout, before the summary)")
    parser.add_argument("--backend", default="default", help="default (JAX/numpy) or torch (float64 reference)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="reward constants as in train, e.g. rewards.spatialcore.beta=0.5")


def reward_overrides(method: str, overrides: list[str]) -> dict:
    """`rewards.<method>.key=value` items -> the method config's overrides; any other key is an error."""
    from spatial_jax.config import ConfigError, parse_overrides

    parsed = parse_overrides(overrides)
    tables = parsed.pop("rewards", {})
    if parsed or not isinstance(tables, dict) or set(tables) - {method}:
        raise ConfigError(f"overrides {overrides}: reward constants of {method} are set as "
                          f"rewards.{method}.<name>=value, as in `train`")
    return tables.get(method, {})


def run(args: argparse.Namespace) -> int:
    from spatial_jax.config import ConfigError
    from spatial_jax.eval.offline_score import BACKENDS, score_rollouts
    from spatial_jax.methods import get_method

    method = get_method(args.method)
    if args.backend not in BACKENDS:
        raise ConfigError(f"unknown backend {args.backend!r}; known: {list(BACKENDS)}")
    cfg = method.config(reward_overrides(method.name, args.overrides))
    if args.output:
        refuse_overwriting({"--output": args.output}, [args.input])
        problem = _unwritable(args.output)
        if problem:
            print(f"spatial-jax score: cannot write {args.output}: {problem}", file=sys.stderr)
            return 1
    try:
        rows, summary = score_rollouts(method, cfg, args.input, args.backend, sys.stderr)
    except OSError as e:
        print(f"spatial-jax score: cannot read {args.input}: {e}", file=sys.stderr)
        return 1
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    if not args.output:
        sys.stdout.write(lines)
    else:
        try:
            with open(args.output, "w", encoding="utf-8") as out:
                out.write(lines)
        except OSError as e:  # the disk filled up while scoring, say
            print(f"spatial-jax score: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
            return 1
    print(summary)
    return 0



def _unwritable(path: str) -> str | None:
    """Why `path` cannot be opened for writing, or None. Opened for appending, so nothing is truncated yet; a file
    this creates is removed again. Space on the disk is only known when writing."""
    existed = os.path.lexists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except FileNotFoundError:
        return f"folder {os.path.dirname(path) or '.'} does not exist"
    except OSError as e:
        return e.strerror or str(e)
    if not existed:
        os.unlink(path)
    return None
