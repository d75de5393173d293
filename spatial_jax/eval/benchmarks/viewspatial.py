"""ViewSpatial-Bench, scored as the authors' evaluate.py (ZJU-REAL/ViewSpatial-Bench) scores it: the response's
last line (text after its last newline, so a trailing newline leaves an empty line and no answer) is searched for
the first standalone letter A-D, case-insensitive, upper-cased; the gold is the same search over the record's
answer ("A. right"). Overall: every question counts once; rows: the question types."""

from __future__ import annotations

import re

from spatial_jax.benchmarks.record import BenchRecord
from spatial_jax.eval.benchmarks.table import Cell, Table, by_category

NAME = "viewspatial"
VARIANTS = ("last_line",)
_OPTION = re.compile(r"\b([A-D])\b", re.IGNORECASE)


def _option(text: str) -> str | None:
    m = _OPTION.search(text)
    return m.group(1).upper() if m else None


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str | None]:
    pred = _option(response.split("\n")[-1])
    return float(pred == _option(record.extra["answer_text"])), pred


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    return Table(NAME, variant, by_category([r.category for r in records], scores), Cell.of(scores),
                 "accuracy over all questions (each counts once)")
