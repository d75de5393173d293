"""OmniSpatial, scored as the authors' vlms_eval/qwenvl_eval.py (qizekun/OmniSpatial) scores it.

Variant "re" (their default eval_type): the last match of `Answer\\s*:\\s*([A-D])\\b`, case-insensitive, is the
prediction, "A" when nothing matches; it must equal the gold letter exactly, so a lower-case "answer: b" is wrong
and a response without an "Answer:" line counts as "A". Variant "direct": the response's first character,
upper-cased (the variant a policy's final answer, the letter alone, is scored with: its layout asks for that).
Overall: every question counts once (their Total); groups: the four task types; rows: the ten
sub-task types in their blank_stats order. (They average five repeats of the whole set; one response per id
here.)"""

from __future__ import annotations

import re

from spatial_jax.benchmarks.omnispatial import SUB_TASK_TYPES, TASK_TYPES
from spatial_jax.benchmarks.record import BenchRecord
from spatial_jax.eval.benchmarks.table import Cell, Table, by_category

NAME = "omnispatial"
VARIANTS = ("re", "direct")
ANSWER_VARIANT = "direct"  # a policy's final answer is the letter alone, as the direct format asks
_PATTERN = re.compile(r"Answer\s*:\s*([A-D])\b", re.IGNORECASE)


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str]:
    if variant == "direct":
        pred = response.strip().upper()[:1]
    else:
        hits = _PATTERN.findall(response)
        pred = hits[-1] if hits else "A"
    return float(pred == record.answer), pred


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    cats = [r.category for r in records]
    groups = {t: Cell.of([s for r, s in zip(records, scores) if r.extra["task_type"] == t]) for t in TASK_TYPES
              if any(r.extra["task_type"] == t for r in records)}
    return Table(NAME, variant, by_category(cats, scores, SUB_TASK_TYPES), Cell.of(scores),
                 "accuracy over all questions (each counts once)", groups)
