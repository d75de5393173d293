"""EmbSpatial-Bench. No official scorer exists to follow: the authors' repository (mengfeidu/EmbSpatial-Bench)
holds a README and figures, no evaluation code. The README names two ways to evaluate the multiple-choice questions,
generation and likelihood; this scorer is the generation one (a model that answers in text), and no other authors'
code for it is in this project's reference index (third-party ports exist, e.g. lmms-eval's; they are not the
authors'). The prediction is the project's letter rule (extract.choice_letter), right when it equals the gold
option's letter. Overall: every question counts once; rows: the six spatial relations."""

from __future__ import annotations

from spatial_jax.benchmarks.record import BenchRecord
from spatial_jax.eval.benchmarks.extract import choice_letter
from spatial_jax.eval.benchmarks.table import Cell, Table, by_category

NAME = "embspatial"
VARIANTS = ("letter",)


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str | None]:
    pred = choice_letter(response, len(record.options))
    return float(pred == record.answer), pred


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    return Table(NAME, variant, by_category([r.category for r in records], scores), Cell.of(scores),
                 "accuracy over all questions (each counts once)")
