"""SPAR-Bench (jasonzhango/SPAR-Bench): parquet shards with {id, task, question, answer, image (list of embedded
images), format_type, img_type, source}. Task families as the authors' lmms-eval task (sparbench/utils.py) splits
them: multiple choice (answer a letter), numeric (MRA) and view_change_infer (camera commands, its own metric).

Layout: the question as the table holds it (a multiple-choice question lists its lettered options), then an
instruction like the lmms-eval task's post-prompts (this project's words): the option's letter directly, or a
single number.

SPAR-Bench, scored as its lmms-eval task (lmms_eval/tasks/sparbench/utils.py, the evaluation the SPAR authors
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
from pathlib import Path

from spatial_jax.suites.extract import mra
from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import BenchRecord, Where, embedded_image, find_file, read_parquet
from spatial_jax.suites.table import Table, by_category, mean_of

NAME = "sparbench"
LAYOUT = Layout(inline=True, choice="Answer with the letter of the correct option only.",
                number="Answer with a single number.")

CHOICE_TASKS = (
    "obj_spatial_relation_oo", "obj_spatial_relation_oc_mv", "obj_spatial_relation_oo_mv", "spatial_imagination_oc",
    "spatial_imagination_oo", "spatial_imagination_oc_mv", "spatial_imagination_oo_mv", "position_matching",
    "camera_motion_infer", "distance_infer_center_oo", "distance_infer_center_oo_mv",
)
NUMERIC_TASKS = (
    "depth_prediction_oc", "depth_prediction_oo", "distance_prediction_oc", "distance_prediction_oo",
    "depth_prediction_oc_mv", "depth_prediction_oo_mv", "distance_prediction_oo_mv", "distance_prediction_oc_mv",
)
TEXT_TASKS = ("view_change_infer",)


def _options(question: str) -> tuple[str, ...]:
    """Lettered option lines of the question (`A. text`), for prompting; the scorer compares the letter."""
    return tuple(m.group(2).strip() for m in re.finditer(r"(?m)^\s*([A-F])[.)]\s*(.+)$", question))


def load(root: Path) -> list[BenchRecord]:
    path = find_file(root, ("data", "*.parquet"), NAME)
    out = []
    for i, row in enumerate(read_parquet(path)):
        where = Where(path, f"row {i}" + (f" (id {row.get('id')})" if row.get("id") is not None else ""))
        task = where.text(row, "task")
        answer: str | float = where.text(row, "answer") if not isinstance(row.get("answer"), (int, float)) \
            else row["answer"]
        if task in NUMERIC_TASKS:
            kind = "number"
            try:
                answer = float(answer)
            except ValueError:
                raise where.error(f"field 'answer' = {answer!r} of numeric task {task} is no number") from None
        elif task in CHOICE_TASKS:
            kind = "choice"
        elif task in TEXT_TASKS:
            kind = "text"
        else:
            raise where.error(f"field 'task' = {task!r} is none of SPAR-Bench's task types")
        images = where.field(row, "image", list)
        if not images:
            raise where.error("field 'image' holds no image")
        out.append(BenchRecord(
            benchmark=NAME, id=where.ident(row, "id"), question=where.text(row, "question"),
            options=_options(row["question"]) if kind == "choice" else (), answer=answer if kind == "number"
            else str(answer), answer_type=kind, category=task,
            images=tuple(embedded_image(im, where, "image") for im in images),
            extra={"format_type": row.get("format_type") or "", "img_type": row.get("img_type") or ""},
            origin=str(where)))
    return out


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
