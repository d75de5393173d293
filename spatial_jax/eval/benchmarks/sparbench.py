"""SPAR-Bench, scored as its lmms-eval task (lmms_eval/tasks/sparbench/utils.py, the evaluation the SPAR authors
release) scores it, quirks included.

Multiple choice: the response and the gold, lower-cased, match when equal, when the response is contained in the
gold (so an empty response scores 1), or when the response's first character equals the gold. Numeric: the first
number in the response (the last for the *_mv tasks), scored by MRA with |pred - gt| when gt is 0; no number
scores 0. view_change_infer: both texts are read as `action:value` pairs split on "," and ":" (keys not
stripped), folded into five signed axes, and each axis scored by MRA with prediction and gold swapped (the gold
divided by the prediction), averaged; text that does not parse scores 0. Overall: the unweighted mean over the
task types present; groups Low / Middle / High as the task sorts them, where view_change_infer's key
(`view_change_infer_vci_metric`) maps to no group, so Middle leaves it out."""

from __future__ import annotations

import re

from spatial_jax.benchmarks.record import BenchRecord
from spatial_jax.benchmarks.sparbench import CHOICE_TASKS, NUMERIC_TASKS
from spatial_jax.eval.benchmarks.extract import mra
from spatial_jax.eval.benchmarks.table import Table, by_category, mean_of

NAME = "sparbench"
VARIANTS = ("lmms_eval",)
LOW = NUMERIC_TASKS
MIDDLE = ("position_matching", "camera_motion_infer")  # view_change_infer is listed there but never reached
HIGH = tuple(t for t in CHOICE_TASKS if t not in MIDDLE)
_MV = ("depth_prediction_oc_mv", "depth_prediction_oo_mv", "distance_prediction_oc_mv", "distance_prediction_oo_mv")
_AXES = (("move_right", "move_left"), ("move_up", "move_down"), ("move_forward", "move_backward"),
         ("rotate_right", "rotate_left"), ("rotate_up", "rotate_down"))


def _choice(pred: str, target: str) -> float:
    pred, target = pred.lower(), target.lower()
    return float(pred == target or pred in target or pred[0] == target)


def _number(pred: str, task: str) -> float | None:
    found = re.findall(r"(?<!\^)\d+\.\d+|(?<!\^)\d+", pred)
    if not found:
        return None
    return float(found[-1] if task in _MV else found[0])


def _commands(text: str) -> dict[str, float]:
    out = {}
    for item in text.split(","):
        key, value = item.split(":")  # ValueError when an item is not one key:value pair
        out[key] = float(value)
    return out


def _view_change(pred: str, gold: str) -> float:
    p, g = _commands(pred), _commands(gold)
    axes = [(g.get(a, 0) - g.get(b, 0), p.get(a, 0) - p.get(b, 0)) for a, b in _AXES]
    return sum(mra(gt, answer, zero_target_absolute=True) for gt, answer in axes) / len(axes)


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str | float | None]:
    task = record.category
    if record.answer_type == "choice":
        return _choice(response, str(record.answer)), response
    if record.answer_type == "number":
        value = _number(response, task)
        return (0.0 if value is None else mra(value, float(record.answer), zero_target_absolute=True)), value
    try:
        return _view_change(response, str(record.answer)), response
    except (ValueError, ZeroDivisionError):
        return 0.0, None


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    cells = by_category([r.category for r in records], scores, (*LOW, *MIDDLE, "view_change_infer", *HIGH))
    groups = {name: mean_of([cells[t] for t in tasks if t in cells])
              for name, tasks in (("Low", LOW), ("Middle", MIDDLE), ("High", HIGH)) if any(t in cells for t in tasks)}
    return Table(NAME, variant, cells, mean_of(list(cells.values())), "unweighted mean over the task types present",
                 groups)
