"""SpatiaLab (ciol-research/SpatiaLab), the multiple-choice split. Nothing official fixes the field names: the
authors' repository (SpatiaLab-Reasoning/SpatiaLab) holds only its README (categories, counts, "MCQ: option selection
+ exact match"), and neither the Hugging Face card's feature list nor the Kaggle copy is in this project's reference
index. The fields read here are therefore this project's assumption, not a verified layout: the Hugging Face parquet
(`data/*.parquet` or `*.parquet`) with {id, question, options (list), answer (option letter or index), category,
subcategory, image (embedded)}. A real copy whose names differ fails with an error naming the file, row and field; a
category that is none of the README's six is an error too.

Layout: arXiv 2602.03916 (SpatiaLab) App. D.1, its multiple-choice protocol: the options numbered 1-4 and "Answer
with a single number (1-4)"; the number is matched exactly and maps back to the record's option letter."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.benchmarks.layout import Layout
from spatial_jax.benchmarks.record import BenchRecord, Where, embedded_image, find_file, read_parquet
from spatial_jax.data.sample import LETTERS

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
