"""VSI-Bench (and its tiny split), scored as the authors' lmms_eval/tasks/vsibench/utils.py
(vision-x-nyu/thinking-in-space) scores it, quirks included.

The prediction is the response's first space-separated token with trailing periods stripped, then whitespace
(so "B.\\n" keeps its period and misses, "3 meters" reads 3). Multiple choice: that token equals the gold letter,
case-insensitive. Numeric: the token as a float, scored by MRA over thresholds 0.50:0.95:0.05
(|pred - gt| / gt <= 1 - threshold); a token that is no number ("3m", "Answer:") scores 0. Table: the mean per
question type, where object_rel_direction_{easy,medium,hard} merge into object_rel_direction as the sum of the
three means over 3 (a missing one adds 0, and the merged row is always present); overall: the unweighted mean of
the rows."""

from __future__ import annotations

from spatial_jax.benchmarks.record import BenchRecord
from spatial_jax.benchmarks.vsibench import CHOICE_TYPES
from spatial_jax.eval.benchmarks.extract import mra
from spatial_jax.eval.benchmarks.table import Cell, Table, by_category, mean_of

VARIANTS = ("thinking_in_space",)
DIRECTIONS = ("object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard")
ORDER = ("object_counting", "object_abs_distance", "object_size_estimation", "room_size_estimation",
         "object_rel_distance", "object_rel_direction", "route_planning", "obj_appearance_order")


def token(response: str) -> str:
    return response.split(" ")[0].rstrip(".").strip()


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str]:
    pred = token(response)
    if record.category in CHOICE_TYPES:
        return float(pred.lower() == str(record.answer).lower()), pred
    value = _float(pred)
    return (0.0 if value is None else mra(value, float(record.answer))), pred


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    cells = by_category([r.category for r in records], scores)
    parts = [cells.pop(d, Cell(0.0, 0.0, 0)) for d in DIRECTIONS]
    cells["object_rel_direction"] = mean_of(parts)
    rows = {k: cells[k] for k in ORDER if k in cells}
    rows.update({k: v for k, v in cells.items() if k not in rows})
    return Table(records[0].benchmark if records else "vsibench", variant, rows, mean_of(list(rows.values())),
                 "unweighted mean over the question types (relative direction merged from its three levels)")
