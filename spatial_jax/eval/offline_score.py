"""`spatial-jax score`: score rollouts from a JSONL file with one method's reward, offline.

Each input line is one JSON object (SPEC/issue #2: id, completion, question, options, answer, and per method
gt_boxes, token_entropies/token_offsets, blank, scene/image_size, num_generated_tokens, group). Each output line
holds the id, the reward, every component and, for records sharing a group, the group-relative advantage.
Exit status: 0 once the file is scored (malformed lines are reported to stderr with their line number and
counted in the summary), 1 when the input cannot be read, 2 for an unknown method, backend or config key.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, TextIO

from spatial_jax.config import ConfigError

BACKENDS = ("default", "torch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method", required=True, help="spatialcore, prosr, spatialthinker or allospatial")
    parser.add_argument("--input", required=True, help="rollouts, one JSON object per line")
    parser.add_argument("--output", default=None, help="scored JSONL (default: stdout, before the summary)")
    parser.add_argument("--backend", default="default", help="default (JAX/numpy) or torch (float64 reference)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="reward constants, e.g. beta=0.5")


def read_rollouts(path: str, err: TextIO) -> tuple[list[Any], list[int], int]:
    """Valid records with their line numbers, and how many non-blank lines were malformed (each reported)."""
    from spatial_jax.rewards.records import RecordError, Rollout

    records, lines, bad = [], [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(Rollout.from_json(json.loads(line)))
                lines.append(number)
            except json.JSONDecodeError as e:
                bad += 1
                print(f"{path}:{number}: malformed JSON: {e.msg} (column {e.colno})", file=err)
            except RecordError as e:
                bad += 1
                print(f"{path}:{number}: bad record: {e}", file=err)
    return records, lines, bad


def _score_all(score_batch, records, lines, cfg, path: str, err: TextIO) -> list[dict[str, float] | None]:
    """Scores the batch; if the scorer fails on it, scores one by one so only the offending lines are lost."""
    try:
        return list(score_batch(records, cfg))
    except Exception:  # noqa: BLE001 - any scorer failure is isolated per record below
        out: list[dict[str, float] | None] = []
        for ro, number in zip(records, lines):
            try:
                out.append(score_batch([ro], cfg)[0])
            except Exception as e:  # noqa: BLE001
                print(f"{path}:{number}: scoring failed: {type(e).__name__}: {e}", file=err)
                out.append(None)
        return out


def _clean(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def summarise(results: list[dict[str, float]], n_bad: int, n_failed: int, method: str, backend: str) -> str:
    """One screen: counts, mean reward and every mean component, parse-failure counts."""
    keys = list(dict.fromkeys(k for r in results for k in r))
    lines = [f"method {method}  backend {backend}  scored {len(results)}  malformed lines {n_bad}"
             + (f"  scoring failures {n_failed}" if n_failed else "")]
    if results:
        lines.append(f"{'component':<22}{'mean':>12}")
        for k in keys:
            vals = [r[k] for r in results if k in r]
            lines.append(f"{k:<22}{sum(vals) / len(vals):>12.6f}")
        flags = [("think_closed", "no </think>"), ("answer_parsed", "no answer letter"),
                 ("gold_resolved", "gold not resolved"), ("well_formed", "malformed answer tail")]
        fails = [(label, sum(1 for r in results if r.get(k, 1.0) == 0.0)) for k, label in flags if k in keys]
        if "n_invalid" in keys:
            fails.append(("invalid boxes", int(sum(r.get("n_invalid", 0.0) for r in results))))
        lines.append("parse failures: " + ", ".join(f"{label} {n}" for label, n in fails) if fails else
                     "parse failures: none reported by this method")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from spatial_jax.rewards.advantages import advantages_by_group
    from spatial_jax.rewards.registry import get_method

    method = get_method(args.method)
    if args.backend not in BACKENDS:
        raise ConfigError(f"unknown backend {args.backend!r}; known: {list(BACKENDS)}")
    cfg = method.config(args.overrides)
    scorer = method.reference_score_batch if args.backend == "torch" else method.score_batch
    try:
        records, lines, n_bad = read_rollouts(args.input, sys.stderr)
    except OSError as e:
        print(f"spatial-jax score: cannot read {args.input}: {e}", file=sys.stderr)
        return 1
    scored = _score_all(scorer, records, lines, cfg, args.input, sys.stderr)
    kept = [(ro, s) for ro, s in zip(records, scored) if s is not None]
    adv = advantages_by_group(
        [s["reward"] for _, s in kept],
        [ro.group for ro, _ in kept],
        eps=getattr(cfg, "adv_eps", 1e-4),
        std=getattr(cfg, "adv_std", "population"),
    )
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        for (ro, s), a in zip(kept, adv):
            row: dict[str, Any] = {"id": ro.id}
            row.update({k: _clean(v) for k, v in s.items()})
            if a is not None:
                row["group"] = ro.group
                row["advantage"] = a
            out.write(json.dumps(row) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    print(summarise([s for _, s in kept], n_bad, len(scored) - len(kept), args.method, args.backend))
    return 0
