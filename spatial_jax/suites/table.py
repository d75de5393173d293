"""A benchmark's table as its paper prints it: a score per category (task type), named groups, the overall score,
each with its standard error and count; written as JSON and Markdown.

Scores are fractions in [0, 1] (the Markdown shows percent). A category's standard error is the sample's
(ddof 1) over its records; a mean of several cells carries the error of that mean of independent estimates,
sqrt(sum w_k^2 sem_k^2) / sum w_k.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from spatial_jax.eval.grounding import Estimate, estimate


@dataclasses.dataclass(frozen=True)
class Cell:
    mean: float
    sem: float
    n: int

    @staticmethod
    def of(values: Sequence[float]) -> Cell:
        e: Estimate = estimate(values)
        return Cell(e.mean, e.sem, e.n)

    def as_dict(self) -> dict[str, Any]:
        if self.n == 0 or not math.isfinite(self.mean):
            return {"mean": None, "sem": None, "n": self.n}
        return {"mean": self.mean, "sem": self.sem, "n": self.n}


EMPTY = Cell(float("nan"), float("nan"), 0)


def mean_of(cells: Sequence[Cell], weights: Sequence[float] | None = None) -> Cell:
    """The (weighted) mean of the cells' means; empty cells count as given (NaN) unless the caller drops them."""
    if not cells:
        return EMPTY
    w = list(weights) if weights is not None else [1.0] * len(cells)
    total = sum(w)
    mean = sum(wi * c.mean for wi, c in zip(w, cells)) / total
    sem = math.sqrt(sum((wi * c.sem) ** 2 for wi, c in zip(w, cells))) / total
    return Cell(mean, sem, sum(c.n for c in cells))


@dataclasses.dataclass(frozen=True)
class Table:
    """benchmark, the scorer variant, per-category cells (in the paper's order), groups (2D/3D, Low/Middle/High,
    task families...), the overall cell, and how the overall is formed (`rule`, for the reader). unparsed: the
    policy's completions that gave no final answer (scored wrong; None when responses are scored as given)."""

    benchmark: str
    variant: str
    categories: Mapping[str, Cell]
    overall: Cell
    rule: str
    groups: Mapping[str, Cell] = dataclasses.field(default_factory=dict)
    unparsed: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark, "variant": self.variant, "rule": self.rule,
            "overall": self.overall.as_dict(), "unparsed": self.unparsed,
            "groups": {k: v.as_dict() for k, v in self.groups.items()},
            "categories": {k: v.as_dict() for k, v in self.categories.items()},
        }

    def markdown(self) -> str:
        """The paper's layout: one column per category (then the groups and the overall), rows score, s.e., n."""
        cells = [*self.categories.items(), *self.groups.items(), ("**Overall**", self.overall)]
        unparsed = "" if self.unparsed is None else f"unparsed (no final answer, scored wrong): {self.unparsed}\n\n"
        return f"### {self.benchmark} ({self.variant})\n\noverall: {self.rule}\n\n{unparsed}" + columns(cells)


def columns(cells: Sequence[tuple[str, Cell]]) -> str:
    """A Markdown table with the cells as columns and rows score (%), ± s.e., n."""
    head = "| | " + " | ".join(name for name, _ in cells) + " |"
    rule = "|---|" + "---:|" * len(cells)
    rows = [f"| {label} | " + " | ".join(fmt(c) for _, c in cells) + " |"
            for label, fmt in (("score (%)", lambda c: _pct(c.mean)), ("± s.e.", lambda c: _pct(c.sem)),
                               ("n", lambda c: str(c.n)))]
    return "\n".join([head, rule, *rows])


def _pct(x: float) -> str:
    return "–" if not math.isfinite(x) else f"{100 * x:.2f}"


def by_category(categories: Sequence[str], scores: Sequence[float], order: Sequence[str] = ()) -> dict[str, Cell]:
    """Cells per category: those of `order` first (when present), then the rest sorted."""
    names = [c for c in order if c in set(categories)] + sorted(set(categories) - set(order))
    return {name: Cell.of([s for c, s in zip(categories, scores) if c == name]) for name in names}
