"""SpatiaLab, multiple choice. No official scorer exists to follow: the authors' repository
(SpatiaLab-Reasoning/SpatiaLab) holds the README only, which describes MCQ scoring as option selection plus exact
match, and no evaluation code for it is in this project's reference index. The prediction is the project's letter
rule (extract.choice_letter) and must equal the gold letter. Overall: every question counts once (the README's
Overall over 1,400); rows: the six categories in the README's column order."""

from __future__ import annotations

from spatial_jax.data.benchmarks.record import BenchRecord
from spatial_jax.eval.benchmarks.extract import choice_letter
from spatial_jax.eval.benchmarks.table import Cell, Table, by_category

NAME = "spatialab"
VARIANTS = ("letter",)
ORDER = ("3D Geometry", "Depth & Occlusion", "Orientation", "Relative Positioning", "Size & Scale",
         "Spatial Navigation")


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str | None]:
    pred = choice_letter(response, len(record.options))
    return float(pred == record.answer), pred


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    return Table(NAME, variant, by_category([r.category for r in records], scores, ORDER), Cell.of(scores),
                 "accuracy over all questions (each counts once)")
