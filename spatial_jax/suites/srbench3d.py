"""3DSRBench (ccvl/3DSRBench): `3dsrbench_v1_vlmevalkit_circular.tsv`, the VLMEvalKit TSV with flip augmentation
and circular option orders, the file the authors name for reproducing their results. Columns: index, qid (the
8-character question id, `-flip` and `-N` suffixes for the flipped and rotated variants), question, A-D (empty when
a question has fewer options), answer (letter), category (one of the twelve subtypes, e.g. height_higher; any other
is an error), image (base64).

Layout: VLMEvalKit's multiple-choice prompt, which the authors' results are made with: the question, an "Options:"
line, `A. option` lines, and an instruction to pick one of them (in this project's words).

3DSRBench. Default ("authors"): the aggregation of the 3DSRBench authors' circular result script. Their circular
script (named `compute_3dsrbench_results_circular.py` in the dataset card, stored on the Hugging Face dataset
ccvl/3DSRBench as `compute_3drbench_results_circular.py`) is not in this project's reference index; the same group's
script for the same TSV is, as johnson111788/SpatialReasoner `src/eval/compute_3dsrbench_results.py` (the
SpatialReasoner repository of the 3DSRBench first author's group, run on `3dsrbench_v1_vlmevalkit_circular.tsv`), and
"authors" follows it: a row's question is its qid with a trailing `-N` rotation suffix dropped (only when the
second-to-last character is "-"; `-flip` kept), a question is right only when every one of its rows is, and the overall,
the four main-type rows and the twelve subtype rows are all means over questions (each question takes its first row's
category). That script reads the per-row hits of VLMEvalKit's MCQ judge; this project has no judge model, so every
variant extracts with lmms-eval's rules below (unverified against VLMEvalKit's matcher).

lmms-eval's 3dsrbench task (lmms_eval/tasks/3dsrbench/utils.py) gives the named variants. Extraction: the response,
stripped, is tried against, in order, `^([A-D])[.\\s)]`, `^([A-D])$`, `[Aa]nswer[:\\s]+([A-D])`, `[Tt]he answer
is[:\\s]+([A-D])`, `[Mm]y answer is[:\\s]+([A-D])`, `\\(([A-D])\\)`, `([A-D])\\.`, `\\b([A-D])\\b` (capital letters
only: a lone "b" is no answer); the first match is the prediction. "circular": a question (its qid with the `-N`
rotation suffix dropped, `-flip` kept) is right only when all its option rotations are; "flip_circular": all variants of
the 8-character base qid; "flip": a question and its flip (qid without "-flip"); "vanilla": every row once. Under these
variants the category rows are per-row accuracy per main category (height, location, orientation, multi_object), as
lmms-eval computes them; under "authors" they are per question."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import BenchmarkError, BenchRecord, Where, embedded_image, find_file, read_tsv
from spatial_jax.suites.table import Cell, Table, by_category

NAME = "3dsrbench"
# subtype -> main category, as the authors' result script groups them
MAIN = {
    "height_higher": "height", "location_above": "location", "location_closer_to_camera": "location",
    "location_next_to": "location", "orientation_in_front_of": "orientation", "orientation_on_the_left": "orientation",
    "orientation_viewpoint": "orientation", "multi_object_closer_to": "multi_object",
    "multi_object_facing": "multi_object", "multi_object_viewpoint_towards_object": "multi_object",
    "multi_object_parallel": "multi_object", "multi_object_same_direction": "multi_object",
}
LAYOUT = Layout(header="Options:", choice="Select the correct answer from the options above: its letter only.")


def load(root: Path) -> list[BenchRecord]:
    path = find_file(root, ("3dsrbench_v1_vlmevalkit_circular.tsv", "*circular*.tsv", "*.tsv"), NAME)
    out = []
    for number, row in read_tsv(path):
        where = Where(path, f"row {number}" + (f" (index {row.get('index')})" if row.get("index") else ""))
        where.category(row, "category", tuple(MAIN), NAME)
        for key in ("index", "question", "answer", "image", "A", "B"):
            if not row.get(key):
                raise where.error(f"missing field '{key}'")
        options = tuple(row[c] for c in "ABCD" if row.get(c) and row[c].lower() != "nan")
        answer = row["answer"].strip()
        if answer not in "ABCD"[: len(options)] or len(answer) != 1:
            raise where.error(f"field 'answer' = {answer!r} names none of the {len(options)} options")
        index = row["index"]
        out.append(BenchRecord(
            benchmark=NAME, id=index, question=row["question"], options=options, answer=answer,
            answer_type="choice", category=row["category"],
            images=(embedded_image(row["image"], where, "image"),),
            extra={"qid": row.get("qid") or None}, origin=str(where)))
    return out


VARIANTS = ("authors", "circular", "flip_circular", "flip", "vanilla")
ORDER = ("height", "location", "orientation", "multi_object")
SUBTYPES = tuple(sub for main in ORDER for sub in MAIN if MAIN[sub] == main)
_PATTERNS = [re.compile(p) for p in (
    r"^([A-D])[\.\s\)]", r"^([A-D])$", r"[Aa]nswer[:\s]+([A-D])", r"[Tt]he answer is[:\s]+([A-D])",
    r"[Mm]y answer is[:\s]+([A-D])", r"\(([A-D])\)", r"([A-D])\.", r"\b([A-D])\b")]


def extract(text: str) -> str | None:
    text = text.strip()
    for p in _PATTERNS:
        m = p.search(text)
        if m:
            return m.group(1)
    return None


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str | None]:
    pred = extract(response)
    return float(pred == record.answer), pred


def group_key(qid: str, variant: str) -> str:
    if variant == "authors":
        return qid[:-2] if len(qid) >= 2 and qid[-2] == "-" else qid
    if variant == "flip_circular":
        return qid[:8]
    if variant == "flip":
        return qid.replace("-flip", "")
    if variant == "circular":
        return qid[:13] if "-flip" in qid else qid[:8]
    return qid


def grouped(records: list[BenchRecord], scores: list[float], variant: str) -> tuple[list[float], list[str]]:
    """Per-question scores and each question's category (its first row's)."""
    if variant == "vanilla":
        return list(scores), [r.category for r in records]
    if any(r.extra["qid"] is None for r in records):
        raise BenchmarkError(f"3DSRBench's {variant} score groups rows by their qid column, which this copy lacks "
                             "(use the circular TSV, or --variant vanilla)")
    groups: dict[str, list[float]] = defaultdict(list)
    cats: dict[str, str] = {}
    for r, s in zip(records, scores):
        key = group_key(r.extra["qid"], variant)
        groups[key].append(s)
        cats.setdefault(key, r.category)
    return [float(all(v == 1.0 for v in g)) for g in groups.values()], list(cats.values())


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    per_question, question_cats = grouped(records, scores, variant)
    rule = {"vanilla": "accuracy over all rows", "circular": "share of questions (flips apart) right in every "
            "option rotation", "flip_circular": "share of base questions right in every rotation and flip",
            "flip": "share of (question, flip) pairs both right",
            "authors": "share of questions (qid less its -N suffix) right in every row; rows per question"}[variant]
    if variant == "authors":
        rows = {**by_category([MAIN[c] for c in question_cats], per_question, ORDER),
                **by_category(question_cats, per_question, SUBTYPES)}
    else:
        rows = by_category([MAIN[r.category] for r in records], scores, ORDER)
    return Table(NAME, variant, rows, Cell.of(per_question), rule)
