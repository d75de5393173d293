"""3DSRBench, scored as lmms-eval's 3dsrbench task (lmms_eval/tasks/3dsrbench/utils.py) scores it: the authors'
compute_3dsrbench_results_circular.py is not in this project's reference index, so lmms-eval's port of it is the
default and its aggregations are the variants.

Extraction: the response, stripped, is tried against, in order, `^([A-D])[.\\s)]`, `^([A-D])$`,
`[Aa]nswer[:\\s]+([A-D])`, `[Tt]he answer is[:\\s]+([A-D])`, `[Mm]y answer is[:\\s]+([A-D])`, `\\(([A-D])\\)`,
`([A-D])\\.`, `\\b([A-D])\\b` (capital letters only: a lone "b" is no answer); the first match is the prediction.
Variants: "circular" (default): a question (its qid with the `-N` rotation suffix dropped, `-flip` kept) is right
only when all its option rotations are; "flip_circular": all variants of the 8-character base qid; "flip": a
question and its flip (qid without "-flip"); "vanilla": every row once. Category rows are per-row accuracy per
main category (height, location, orientation, multi_object) under every variant, as lmms-eval computes them."""

from __future__ import annotations

import re
from collections import defaultdict

from spatial_jax.data.benchmarks.record import BenchmarkError, BenchRecord
from spatial_jax.eval.benchmarks.table import Cell, Table, by_category

NAME = "3dsrbench"
VARIANTS = ("circular", "flip_circular", "flip", "vanilla")
MAIN = {
    "height_higher": "height", "location_above": "location", "location_closer_to_camera": "location",
    "location_next_to": "location", "orientation_in_front_of": "orientation", "orientation_on_the_left": "orientation",
    "orientation_viewpoint": "orientation", "multi_object_closer_to": "multi_object",
    "multi_object_facing": "multi_object", "multi_object_viewpoint_towards_object": "multi_object",
    "multi_object_parallel": "multi_object", "multi_object_same_direction": "multi_object",
}
ORDER = ("height", "location", "orientation", "multi_object")
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
    if variant == "flip_circular":
        return qid[:8]
    if variant == "flip":
        return qid.replace("-flip", "")
    if variant == "circular":
        return qid[:13] if "-flip" in qid else qid[:8]
    return qid


def grouped(records: list[BenchRecord], scores: list[float], variant: str) -> list[float]:
    if variant == "vanilla":
        return list(scores)
    if any(r.extra["qid"] is None for r in records):
        raise BenchmarkError(f"3DSRBench's {variant} score groups rows by their qid column, which this copy lacks "
                             "(use the circular TSV, or --variant vanilla)")
    groups: dict[str, list[float]] = defaultdict(list)
    for r, s in zip(records, scores):
        groups[group_key(r.extra["qid"], variant)].append(s)
    return [float(all(v == 1.0 for v in g)) for g in groups.values()]


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    cats = [MAIN.get(r.category, "other") for r in records]
    rule = {"vanilla": "accuracy over all rows", "circular": "share of questions (flips apart) right in every "
            "option rotation", "flip_circular": "share of base questions right in every rotation and flip",
            "flip": "share of (question, flip) pairs both right"}[variant]
    return Table(NAME, variant, by_category(cats, scores, ORDER), Cell.of(grouped(records, scores, variant)), rule)
