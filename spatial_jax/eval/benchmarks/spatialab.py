"""SpatiaLab, multiple choice, scored by its paper's protocol (arXiv 2602.03916 App. D.1; SPEC 8): the options are
numbered 1-4 and the model answers with a single number; "number" (the default) is an exact match of the response,
whitespace stripped, on the gold option's number (so "2." and "Answer: 2" are wrong). No official scorer code exists
to follow: the authors' repository (SpatiaLab-Reasoning/SpatiaLab) holds the README only ("MCQ: option selection +
exact match"). "letter": the project's letter rule (extract.choice_letter) on the gold letter, for responses to the
options lettered. Overall: every question counts once (the README's Overall over 1,400); rows: the six categories in
the README's column order."""

from __future__ import annotations

from spatial_jax.benchmarks.record import BenchRecord
from spatial_jax.benchmarks.spatialab import CATEGORIES, LAYOUT
from spatial_jax.eval.benchmarks.extract import choice_letter
from spatial_jax.eval.benchmarks.table import Cell, Table, by_category

NAME = "spatialab"
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
