"""MindCube (MLL-Lab/MindCube): `raw/MindCube.jsonl` (full test) or `raw/MindCube_tinybench.jsonl` (MindCube-Tiny,
1,050 questions) with the images under `other_all_image/` next to `raw/`. Records {id, question (options inline as
`A. ... B. ...`), gt_answer (letter), images (paths relative to the data folder)}; the setting (around, rotation,
translation, among, other) comes from the id as the authors' src/evaluation/core/extractors.py get_setting_from_id
reads it.

Layout: the question as the file holds it (its options inline, `A. ...`), then an instruction to answer with the
option's letter (this project's words: the authors' prompt templates were not read for it)."""

from __future__ import annotations

import re
from pathlib import Path

from spatial_jax.benchmarks.layout import Layout
from spatial_jax.benchmarks.record import BenchRecord, Where, find_file, local_file, read_jsonl
from spatial_jax.data.sources.mindcube_train import setting

LAYOUT = Layout(inline=True, choice="Answer with the letter of the correct option only.")


def inline_options(question: str) -> tuple[str, ...]:
    """The option texts of `... A. x B. y C. z` (lettered in order from A)."""
    parts = re.split(r"(?:^|\s)([A-E])\.\s", question)
    letters, texts = parts[1::2], [t.strip() for t in parts[2::2]]
    options = []
    for expected, (letter, text) in zip("ABCDE", zip(letters, texts)):
        if letter != expected:
            break
        options.append(text)
    return tuple(options)


def _load(root: Path, names: tuple[str, ...], name: str) -> list[BenchRecord]:
    path = find_file(root, names, name)
    base = path.parent.parent if path.parent.name == "raw" else path.parent
    out = []
    for number, obj in read_jsonl(path):
        where = Where(path, f"line {number}" + (f" (id {obj.get('id')})" if isinstance(obj, dict) else ""))
        rid = where.ident(obj, "id")
        question = where.text(obj, "question")
        images = where.field(obj, "images", list)
        if not images or not all(isinstance(p, str) for p in images):
            raise where.error("field 'images' must be a non-empty list of paths")
        options = inline_options(question)
        answer = where.text(obj, "gt_answer").strip()
        if len(answer) != 1 or answer not in "ABCDE"[: max(len(options), 1)]:
            raise where.error(f"field 'gt_answer' = {answer!r} names none of the {len(options)} inline options")
        out.append(BenchRecord(
            benchmark=name, id=rid, question=question, options=options, answer=answer, answer_type="choice",
            category=setting(rid), images=tuple(local_file(base, p, where, "images") for p in images),
            origin=str(where)))
    return out


def load(root: Path) -> list[BenchRecord]:
    return _load(root, ("raw/MindCube.jsonl", "MindCube.jsonl"), "mindcube")


def load_tiny(root: Path) -> list[BenchRecord]:
    return _load(root, ("raw/MindCube_tinybench.jsonl", "MindCube_tinybench.jsonl"), "mindcube-tiny")
