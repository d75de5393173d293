"""ViewSpatial-Bench (ZJU-REAL/ViewSpatial-Bench): `eval/ViewSpatial-Bench.json` (or at the top of the copy), a JSON
list of {question_type, image_path (list, relative to the copy's top folder), question, answer ("A. right"),
choices ("A. right\\nB. ...")}, read as the authors' evaluate.py reads it. Records have no id field: the id is the
record's position in the list, as evaluate.py numbers its rows.

Layout: the question, then the record's lettered choices (`A. right`), then an instruction to answer with the
option's letter (this project's words).

ViewSpatial-Bench, scored as the authors' evaluate.py (ZJU-REAL/ViewSpatial-Bench) scores it: the response's
last line (text after its last newline, so a trailing newline leaves an empty line and no answer) is searched for
the first standalone letter A-D, case-insensitive, upper-cased; the gold is the same search over the record's
answer ("A. right"). Overall: every question counts once; rows: the question types."""

from __future__ import annotations

import re
from pathlib import Path

from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import BenchRecord, Where, find_file, local_file, options_from_lines, read_json_list
from spatial_jax.suites.table import Cell, Table, by_category

NAME = "viewspatial"
LAYOUT = Layout(choice="Answer with the letter of the correct option only.")


def load(root: Path) -> list[BenchRecord]:
    path = find_file(root, ("eval/ViewSpatial-Bench.json", "ViewSpatial-Bench.json"), NAME)
    base = path.parent.parent if path.parent.name == "eval" else path.parent
    out = []
    for i, obj in enumerate(read_json_list(path)):
        where = Where(path, f"record {i}")
        images = where.field(obj, "image_path", list)
        if not images or not all(isinstance(p, str) for p in images):
            raise where.error("field 'image_path' must be a non-empty list of paths")
        letters, texts = options_from_lines(where.text(obj, "choices"), where, "choices")
        answer = where.text(obj, "answer")
        out.append(BenchRecord(
            benchmark=NAME, id=str(i), question=where.text(obj, "question"), options=texts,
            answer=answer.strip()[:1], answer_type="choice", category=where.text(obj, "question_type"),
            images=tuple(local_file(base, p, where, "image_path") for p in images),
            extra={"answer_text": answer, "choices": obj["choices"]}, origin=str(where)))
    return out


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
