"""MindCube's training split (HF MLL-Lab/MindCube), read as the benchmark loader reads its test file
(spatial_jax/benchmarks/mindcube.py, after the authors' data layout): JSON lines {id, question (options inline,
`A. ... B. ...`), gt_answer (letter), images (paths relative to the data folder, under `other_all_image/`)}. The
training file's name (`raw/MindCube_train.jsonl`) is inferred from the test files' (`raw/MindCube.jsonl`,
`raw/MindCube_tinybench.jsonl`); a file path is read as given. The category is the setting the id names
(around, rotation, translation, among), as the authors' get_setting_from_id reads it.
Columns: question, answer, images, id, reference."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.sample import DatasetError
from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import JsonLines, Row, Source

NAME = "mindcube-train"
FIELDS = {"question": "question", "answer": "gt_answer", "images": "images", "id": "id", "reference": ""}
FILES = ("raw/MindCube_train.jsonl", "MindCube_train.jsonl")
# the settings the ids name; the test split's loader reads its categories with the same function
SETTINGS = ("around", "rotation", "translation", "among")


def setting(record_id: str) -> str:
    low = record_id.lower()
    return next((s for s in SETTINGS if s in low), "other")


def convert(row: Row, ctx: F.Context):
    col = {k: ctx.col(k, v) for k, v in FIELDS.items()}
    rid = str(row.need(col["id"], (str, int)))
    question, options = F.split_options(row.need(col["question"], str))
    if not options:
        raise row.error(f"field '{col['question']}' lists no options (`A. ...`)")
    return F.sample(row, sid=rid, question=question, options=options, answer=row.need(col["answer"], str),
                    answer_field=col["answer"], pictures=F.media_list(row, row.need(col["images"]), col["images"], ctx),
                    category=setting(rid), reference=row.get(col["reference"]) if col["reference"] else None)


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    path = Path(path)
    if path.is_dir():
        hits = [path / f for f in FILES if (path / f).is_file()]
        if not hits:
            raise DatasetError(f"{path}: none of {list(FILES)} (MindCube's training split)")
        path = hits[0]
    base = path.parent.parent if path.parent.name == "raw" else path.parent
    ctx = F.Context(ctx.columns, base, ctx.check)
    return Source(JsonLines(path), lambda row: convert(row, ctx), NAME)
