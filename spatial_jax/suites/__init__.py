"""The papers' benchmarks, one module each (its loader, layout and scorer), registered by name.

`load(name, root)` reads a local copy as its authors distribute it and returns its BenchRecords in file order;
LAYOUTS[name] is how the benchmark's protocol shows a question to the model; each is scored as its official
evaluation code scores it (the module's docstring names the code it follows), and protocols.py holds the papers'
protocols over them.

`score_responses(name, records, responses)` scores the records that have a response and returns the per-record
rows and the benchmark's table. A policy's completions pass the method's `final_answer`: the official extraction
then reads that span alone (under the module's ANSWER_VARIANT when it names one), and a completion without a final
answer is wrong and counted unparsed; responses from elsewhere are read as given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from spatial_jax.suites import (
    cvbench,
    embspatial,
    mindcube,
    omnispatial,
    sparbench,
    spatialab,
    srbench3d,
    viewspatial,
    vsibench,
)
from spatial_jax.suites.convert import to_sample
from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import BenchmarkError, BenchRecord, Loader
from spatial_jax.suites.table import Table

LOADERS: dict[str, Loader] = {
    "omnispatial": omnispatial.load,
    "spatialab": spatialab.load,
    "3dsrbench": srbench3d.load,
    "mindcube": mindcube.load,
    "mindcube-tiny": mindcube.load_tiny,
    "viewspatial": viewspatial.load,
    "embspatial": embspatial.load,
    "sparbench": sparbench.load,
    "vsibench": vsibench.load,
    "vsibench-tiny": vsibench.load_tiny,
    "cvbench": cvbench.load,
}


LAYOUTS: dict[str, Layout] = {
    "omnispatial": omnispatial.LAYOUT,
    "spatialab": spatialab.LAYOUT,
    "3dsrbench": srbench3d.LAYOUT,
    "mindcube": mindcube.LAYOUT,
    "mindcube-tiny": mindcube.LAYOUT,
    "viewspatial": viewspatial.LAYOUT,
    "embspatial": embspatial.LAYOUT,
    "sparbench": sparbench.LAYOUT,
    "vsibench": vsibench.LAYOUT,
    "vsibench-tiny": vsibench.LAYOUT,
    "cvbench": cvbench.LAYOUT,
}


def load(name: str, root: str | Path) -> list[BenchRecord]:
    if name not in LOADERS:
        raise BenchmarkError(f"unknown benchmark {name!r}; known: {sorted(LOADERS)}")
    records = LOADERS[name](Path(root))
    if not records:  # else every response would read as another benchmark's
        raise BenchmarkError(f"{name}: the copy at {root} holds no record")
    seen: set[str] = set()
    for r in records:
        if r.id in seen:
            raise BenchmarkError(f"{r.origin}: id {r.id!r} repeats an earlier record's (ids key the predictions)")
        seen.add(r.id)
    return records


SCORERS: dict[str, ModuleType] = {
    "omnispatial": omnispatial, "spatialab": spatialab, "3dsrbench": srbench3d, "mindcube": mindcube,
    "mindcube-tiny": mindcube, "viewspatial": viewspatial, "embspatial": embspatial, "sparbench": sparbench,
    "vsibench": vsibench, "vsibench-tiny": vsibench, "cvbench": cvbench,
}


@dataclasses.dataclass(frozen=True)
class Scored:
    """rows: one per answered record (id, category, score, prediction, response); missing: ids without a response."""

    table: Table
    rows: list[dict[str, Any]]
    missing: list[str]


def scorer(name: str) -> ModuleType:
    if name not in SCORERS:
        raise BenchmarkError(f"unknown benchmark {name!r}; known: {sorted(SCORERS)}")
    return SCORERS[name]


def check_variant(name: str, variant: str | None) -> str:
    variants = scorer(name).VARIANTS
    if variant is None:
        return variants[0]
    if variant not in variants:
        raise BenchmarkError(f"{name} has no scoring variant {variant!r}; known: {list(variants)}")
    return variant


def score_responses(name: str, records: list[BenchRecord], responses: Mapping[str, str],
                    variant: str | None = None,
                    final_answer: Callable[[str], str | None] | None = None) -> Scored:
    module = scorer(name)
    if variant is None and final_answer is not None:
        variant = getattr(module, "ANSWER_VARIANT", None)
    variant = check_variant(name, variant)
    known = {r.id for r in records}
    stray = [k for k in responses if k not in known]
    if stray:
        raise BenchmarkError(f"{len(stray)} response ids are no {name} record ids (first: {stray[:3]}); are these "
                             "the predictions of another benchmark?")
    answered = [r for r in records if r.id in responses]
    rows, scores = [], []
    for r in answered:
        response = responses[r.id]
        answer = response if final_answer is None else final_answer(response)
        s, pred = module.score(r, answer, variant) if answer is not None else (0.0, None)
        scores.append(s)
        row = {"id": r.id, "category": r.category, "score": s, "prediction": pred, "response": response}
        rows.append(row if final_answer is None else {**row, "final_answer": answer})
    table = module.tabulate(answered, scores, variant)
    if final_answer is not None:
        table = dataclasses.replace(table, unparsed=sum(1 for row in rows if row["final_answer"] is None))
    return Scored(table, rows, [r.id for r in records if r.id not in responses])


__all__ = ["LAYOUTS", "LOADERS", "SCORERS", "BenchRecord", "BenchmarkError", "Layout", "Scored", "check_variant",
           "load", "score_responses", "scorer", "to_sample"]
