"""Loaders for the papers' benchmarks, one module each, registered by name: `load(name, root)` reads a local copy
as its authors distribute it and returns its BenchRecords in file order; LAYOUTS[name] is how the benchmark's
protocol shows a question to the model."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.benchmarks import (
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
from spatial_jax.benchmarks.convert import to_sample
from spatial_jax.benchmarks.layout import Layout
from spatial_jax.benchmarks.record import BenchmarkError, BenchRecord, Loader

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


__all__ = ["LAYOUTS", "LOADERS", "BenchRecord", "BenchmarkError", "Layout", "load", "to_sample"]
