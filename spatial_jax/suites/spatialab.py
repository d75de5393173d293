"""SpatiaLab (ciol-research/SpatiaLab), the multiple-choice split. Nothing official fixes the field names: the
authors' repository (SpatiaLab-Reasoning/SpatiaLab) holds only its README (categories, counts, "MCQ: option selection
+ exact match"), and neither the Hugging Face card's feature list nor the Kaggle copy is in this project's reference
index. The fields read here are therefore this project's assumption, not a verified layout: the Hugging Face parquet
(`data/*.parquet` or `*.parquet`) with {id, question, options (list), answer (option letter or index), category,
subcategory, image (embedded)}. A real copy whose names differ fails with an error naming the file, row and field; a
category that is none of the README's six is an error too.

Layout: arXiv 2602.03916 (SpatiaLab) App. D.1, its multiple-choice protocol: the options numbered 1-4 and "Answer
with a single number (1-4)"; the number is matched exactly and maps back to the record's option letter.

SpatiaLab, multiple choice, scored by its paper's protocol (arXiv 2602.03916 App. D.1; SPEC 8): the options are
numbered 1-4 and the model answers with a single number; "number" (the default) is an exact match of the response,
whitespace stripped, on the gold option's number (so "2." and "Answer: 2" are wrong). No official scorer code exists
to follow: the authors' repository (SpatiaLab-Reasoning/SpatiaLab) holds the README only ("MCQ: option selection +
exact match"). "letter": the project's letter rule (extract.choice_letter) on the gold letter, for responses to the
options lettered. Overall: every question counts once (the README's Overall over 1,400); rows: the six categories in
the README's column order."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.sample import LETTERS
from spatial_jax.suites.extract import choice_letter
from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import BenchRecord, Where, embedded_image, find_file, read_parquet
from spatial_jax.suites.table import Cell, Table, by_category

NAME = "spatialab"
CATEGORIES = ("3D Geometry", "Depth & Occlusion", "Orientation", "Relative Positioning", "Size & Scale",
              "Spatial Navigation")
LAYOUT = Layout(labels="numbers", choice="Answer with a single number (1-{last}).")


def load(root: Path) -> list[BenchRecord]:
    path = find_file(root, ("data", "*.parquet"), NAME)
    out = []
    for i, row in enumerate(read_parquet(path)):
        where = Where(path, f"row {i}" + (f" (id {row.get('id')})" if row.get("id") is not None else ""))
        options = where.strings(row, "options")
        raw = where.field(row, "answer", (str, int))
        letter = LETTERS[raw] if isinstance(raw, int) and 0 <= raw < len(options) else str(raw).strip()[:1].upper()
        if letter not in LETTERS[: len(options)]:
            raise where.error(f"field 'answer' = {raw!r} names none of the {len(options)} options")
        out.append(BenchRecord(
            benchmark=NAME, id=where.ident(row, "id"), question=where.text(row, "question"), options=tuple(options),
            answer=letter, answer_type="choice", category=where.category(row, "category", CATEGORIES, NAME),
            images=(embedded_image(where.field(row, "image"), where, "image"),),
            extra={"subcategory": row.get("subcategory") or ""}, origin=str(where)))
    return out


VARIANTS = ("number", "letter")


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str | None]:
    if variant == "letter":
        pred = choice_letter(response, len(record.options))
        return float(pred == record.answer), pred
    pred = response.strip()
    return float(pred == LAYOUT.label(str(record.answer))), pred or None


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    return Table(NAME, variant, by_category([r.category for r in records], scores, CATEGORIES), Cell.of(scores),
                 "accuracy over all questions (each counts once)")
