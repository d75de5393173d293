"""SPAR-Bench (jasonzhango/SPAR-Bench): parquet shards with {id, task, question, answer, image (list of embedded
images), format_type, img_type, source}. Task families as the authors' lmms-eval task (sparbench/utils.py) splits
them: multiple choice (answer a letter), numeric (MRA) and view_change_infer (camera commands, its own metric).

Layout: the question as the table holds it (a multiple-choice question lists its lettered options), then an
instruction like the lmms-eval task's post-prompts (this project's words): the option's letter directly, or a
single number."""

from __future__ import annotations

import re
from pathlib import Path

from spatial_jax.benchmarks.layout import Layout
from spatial_jax.benchmarks.record import BenchRecord, Where, embedded_image, find_file, read_parquet

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
