"""Offline scoring: rollouts from a JSONL file scored with one method's reward (`spatial-jax score`).

Each input line is one JSON object (SPEC/issue #2: id, completion, question, options, answer, and per method
gt_boxes, token_entropies/token_offsets, blank, scene/image_size, num_generated_tokens, group). Each output line
holds the id, the reward, every component and, for records sharing a group, the group-relative advantage.
Malformed lines are reported with their line number and counted in the summary; the rest are scored.
"""

from __future__ import annotations

import math
from typing import Any, TextIO

BACKENDS = ("default", "torch")


def read_rollouts(path: str, err: TextIO) -> tuple[list[Any], list[int], int]:
    """Valid records with their line numbers, and how many non-blank lines were malformed (each reported). A UTF-8
    byte-order mark is skipped; invalid UTF-8 becomes U+FFFD (a record holding it is scored or refused as it reads)."""
    from spatial_jax.data.jsonl import MalformedJSON, parse_line
    from spatial_jax.records import RecordError, Rollout

    records, lines, bad = [], [], 0
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(Rollout.from_json(parse_line(line)))
                lines.append(number)
            except MalformedJSON as e:
                bad += 1
                print(f"{path}:{number}: {e}", file=err)
            except RecordError as e:
                bad += 1
                print(f"{path}:{number}: bad record: {e}", file=err)
    return records, lines, bad


def _score_all(score_batch, records, lines, cfg, path: str, err: TextIO) -> list[dict[str, float] | None]:
    """Scores the batch; if the scorer fails on it, scores one by one so only the offending lines are lost."""
    try:
        return list(score_batch(records, cfg))
    except Exception:
        out: list[dict[str, float] | None] = []
        for ro, number in zip(records, lines):
            try:
                out.append(score_batch([ro], cfg)[0])
            except Exception as e:
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


def score_rollouts(method, cfg, path: str, backend: str, err: TextIO) -> tuple[list[dict[str, Any]], str]:
    """Scores every valid line of `path` with `method`'s reward (backend "torch": its reference); returns one output
    row per scored record (id, reward, components, and group advantage where records share a group) and the
    summary. Raises OSError when the file cannot be read."""
    from spatial_jax.rewards.advantages import advantages_by_group

    scorer = method.reference_score_batch if backend == "torch" else method.score_batch
    records, lines, n_bad = read_rollouts(path, err)
    scored = _score_all(scorer, records, lines, cfg, path, err)
    kept = [(ro, s) for ro, s in zip(records, scored) if s is not None]
    adv = advantages_by_group([s["reward"] for _, s in kept], [ro.group for ro, _ in kept], cfg.advantage.eps,
                              cfg.advantage.std)
    rows = []
    for (ro, s), a in zip(kept, adv):
        row: dict[str, Any] = {"id": ro.id}
        row.update({k: _clean(v) for k, v in s.items()})
        if a is not None:
            row["group"] = ro.group
            row["advantage"] = a
        rows.append(row)
    return rows, summarise([s for _, s in kept], n_bad, len(scored) - len(kept), method.name, backend)
