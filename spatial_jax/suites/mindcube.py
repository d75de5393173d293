"""MindCube (MLL-Lab/MindCube): `raw/MindCube.jsonl` (full test) or `raw/MindCube_tinybench.jsonl` (MindCube-Tiny,
1,050 questions) with the images under `other_all_image/` next to `raw/`. Records {id, question (options inline as
`A. ... B. ...`), gt_answer (letter), images (paths relative to the data folder)}; the setting (around, rotation,
translation, among, other) comes from the id as the authors' src/evaluation/core/extractors.py get_setting_from_id
reads it.

Layout: the question as the file holds it (its options inline, `A. ...`), then an instruction to answer with the
option's letter (this project's words: the authors' prompt templates were not read for it).

MindCube and MindCube-Tiny, scored as the authors' src/evaluation (mll-lab-nu/MindCube) scores them: the basic
evaluator's extract_answer (core/extractors.py) and its settings (core/base_metrics.py).

Extraction, first rule that finds anything wins (case-sensitive letters A-E):
1. the last `X.` anywhere (so "I rule out A. The answer is B" reads A... unless a later `B.` follows);
2. inside the text after `<Answer>` (to the next `<` or the end): the last "my answer is X", "the answer is X",
   `X.`, then any standalone X;
3. the last match of, in turn: `X. words` up to a line end / period / quote, `X. words`, `X` followed by a period,
   the end or whitespace, the same at a line start, `*X*` / `"X"`, "Answer: X", "my answer is X", "answer is X";
4. line by line: the last line holding `X. words`; else, from the bottom, the first line with a standalone X.
A response with nothing is wrong. Overall: correct / total over every setting but translation (the authors
exclude it from the overall and still report it); rows: the settings around, rotation, translation, among,
other."""

from __future__ import annotations

import re
from pathlib import Path

from spatial_jax.data.sources.mindcube_train import setting
from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import BenchRecord, Where, find_file, local_file, read_jsonl
from spatial_jax.suites.table import Cell, Table, by_category

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


VARIANTS = ("basic",)
ORDER = ("around", "rotation", "translation", "among", "other")
EXCLUDED = ("translation",)

_TAGGED = [r"[Mm]y answer is ([A-E])", r"[Mm]y answer is ([A-E])\.", r"[Tt]he answer is ([A-E])",
           r"(?:Answer: )?([A-E])\.", r"\b([A-E])\b"]
_GENERAL = [
    r"(?:Answer: )?([A-E])\. [A-Za-z0-9 \-\(\)\'\",]+(?=(?:\n|$|\.|\"))",
    r"(?:Answer: )?([A-E])\. [A-Za-z0-9 \-\(\)\'\"]+",
    r"(?:Answer: )?([A-E])(?:\.|$|\s)", r"(?:^|\n)(?:Answer: )?([A-E])(?:\.|$|\s)", r"[\*\"]([A-E])[\*\"]",
    r"\bAnswer:?\s*([A-E])\b", r"[Mm]y answer is ([A-E])", r"[Mm]y answer is ([A-E])\.", r"answer is ([A-E])",
]


def _last(pattern: str, text: str) -> str | None:
    hits = list(re.finditer(pattern, text))
    return hits[-1].group(1) if hits else None


def extract(text: str) -> str | None:
    if not text:
        return None
    found = _last(r"([A-E])\.", text)
    if found:
        return found
    tagged = re.search(r"<Answer>(.*?)(?:<|$)", text, re.DOTALL)
    if tagged:
        for pattern in _TAGGED:
            found = _last(pattern, tagged.group(1))
            if found:
                return found
    for pattern in _GENERAL:
        found = _last(pattern, text)
        if found:
            return found
    lines = text.split("\n")
    described = [m.group(1) for line in lines if (m := re.search(r"([A-E])\. [A-Za-z0-9 \-\(\)\'\",]+", line))]
    if described:
        return described[-1]
    for line in reversed(lines):
        m = re.search(r"\b([A-E])\b", line)
        if m:
            return m.group(1)
    return None


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str | None]:
    pred = extract(response)
    return float(pred is not None and pred == record.answer), pred


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    kept = [s for r, s in zip(records, scores) if r.category not in EXCLUDED]
    return Table(records[0].benchmark if records else "mindcube", variant,
                 by_category([r.category for r in records], scores, ORDER), Cell.of(kept),
                 "accuracy over all questions but the translation setting's (each counts once)")
