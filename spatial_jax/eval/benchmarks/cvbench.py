"""CV-Bench. The card (nyu-visionx/CV-Bench) fixes the aggregation: accuracy per source, CV-Bench 2D = the mean of
the ADE20K and COCO accuracies, 3D = the Omni3D accuracy, overall = the mean of 2D and 3D. Cambrian's own
answer matcher is not in this project's reference index, so the prediction is the project's letter rule
(extract.choice_letter), right when it equals the gold "(X)" letter. Rows: the three sources, then the four
tasks."""

from __future__ import annotations

from spatial_jax.data.benchmarks.record import BenchRecord
from spatial_jax.eval.benchmarks.extract import choice_letter
from spatial_jax.eval.benchmarks.table import Cell, Table, by_category, mean_of

NAME = "cvbench"
VARIANTS = ("letter",)


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str | None]:
    pred = choice_letter(response, len(record.options))
    return float(pred == record.answer), pred


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    sources = by_category([r.category for r in records], scores, ("ADE20K", "COCO", "Omni3D"))
    tasks = by_category([r.extra["task"] for r in records], scores, ("Count", "Relation", "Depth", "Distance"))
    groups = {}
    two_d = [sources[s] for s in ("ADE20K", "COCO") if s in sources]
    if two_d:
        groups["2D"] = mean_of(two_d)
    if "Omni3D" in sources:
        groups["3D"] = sources["Omni3D"]
    overall = mean_of(list(groups.values())) if groups else Cell.of([])
    return Table(NAME, variant, {**sources, **{f"task {k}": v for k, v in tasks.items()}}, overall,
                 "mean of 2D (mean of ADE20K and COCO) and 3D (Omni3D)", groups)
