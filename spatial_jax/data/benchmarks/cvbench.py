"""CV-Bench (nyu-visionx/CV-Bench): `test.parquet` with the images embedded, or `test.jsonl` with `img/` (the card
names both). Records {idx, type (2D/3D), task (Count, Relation, Depth, Distance), question, choices (list), answer
("(A)"), source (ADE20K, COCO, Omni3D), image or filename}."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.benchmarks.record import (
    BenchRecord,
    Where,
    embedded_image,
    find_file,
    local_file,
    read_jsonl,
    read_parquet,
)

NAME = "cvbench"


def load(root: Path) -> list[BenchRecord]:
    path = find_file(root, ("test.parquet", "test-*.parquet", "test.jsonl"), NAME)
    rows = ([(f"line {n}", obj) for n, obj in read_jsonl(path)] if path.suffix == ".jsonl"
            else [(f"row {i}", row) for i, row in enumerate(read_parquet(path))])
    out = []
    for what, row in rows:
        where = Where(path, what + (f" (idx {row.get('idx')})" if isinstance(row, dict) else ""))
        choices = where.field(row, "choices", list)
        if not choices:
            raise where.error("field 'choices' must be a non-empty list")
        answer = where.text(row, "answer").strip()
        letter = answer.strip("()")[:1]
        if not (answer.startswith("(") and letter in "ABCDEF"[: len(choices)]):
            raise where.error(f"field 'answer' = {answer!r} is no '(letter)' of the {len(choices)} choices")
        if path.suffix == ".jsonl":
            image = local_file(path.parent, where.text(row, "filename"), where, "filename")
        else:
            image = embedded_image(where.field(row, "image"), where, "image")
        out.append(BenchRecord(
            benchmark=NAME, id=where.ident(row, "idx"), question=where.text(row, "question"),
            options=tuple(str(c) for c in choices), answer=letter, answer_type="choice",
            category=where.text(row, "source"), images=(image,),
            extra={"task": where.text(row, "task"), "type": where.text(row, "type")}, origin=str(where)))
    return out
