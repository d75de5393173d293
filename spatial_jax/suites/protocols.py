"""The papers' protocols: which benchmarks a paper's table reports, how each benchmark's score is formed from the
official table, how the paper averages them, and the decoding the paper evaluates with (the defaults of
`spatial-jax eval --protocol`, each overridable).

Benchmark scores: "official" takes the benchmark's own overall; "category_size" weights the per-category
accuracies by the benchmark's official category sizes (SpatialCORE A.5; over the categories present, so a partial
copy is weighted as the full one would be); "task_mean" is the unweighted mean over the table's task types
(AlloSpatial: "the unweighted average over all task types within each benchmark").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from spatial_jax.config import Registry
from spatial_jax.eval.grounding import OMNISPATIAL_SIZES, SPATIALAB_SIZES, weighted_accuracy
from spatial_jax.suites.table import Cell, Table, mean_of

CATEGORY_SIZES = {"omnispatial": OMNISPATIAL_SIZES, "spatialab": SPATIALAB_SIZES}
RULES = ("official", "category_size", "task_mean")


@dataclasses.dataclass(frozen=True)
class Protocol:
    """name; benchmarks in the paper's column order; rule (see RULES); average: the paper reports the unweighted
    mean of the benchmark scores; temperature (0 greedy), max_new_tokens (0 = the run's eval.max_new_tokens) and
    max_tool_turns the decoding the paper states; video_frames: frames sampled uniformly from each video (0: the
    whole clip to the video processor); variants: a benchmark's scoring variant when not its default."""

    name: str
    benchmarks: tuple[str, ...]
    rule: str = "official"
    average: bool = True
    temperature: float = 0.0
    max_new_tokens: int = 0
    max_tool_turns: int = 0
    video_frames: int = 0
    variants: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"protocol {self.name}: rule must be one of {RULES}, got {self.rule!r}")


PROTOCOLS: Registry[Protocol] = Registry("protocol")
register = PROTOCOLS.register
get_protocol = PROTOCOLS.lookup


def decoding_protocol(protocol: Protocol | None, method: str, benchmarks: tuple[str, ...]) -> Protocol | None:
    """The protocol whose decoding an evaluation follows: the one asked for, else the paper of the run's method when
    its table reports every benchmark asked for (an AlloSpatial policy on VSI-Bench-tiny decodes as its paper does),
    else none (greedy, the run's eval settings)."""
    if protocol is not None:
        return protocol
    own = PROTOCOLS.get(method)
    return own if own is not None and set(benchmarks) <= set(own.benchmarks) else None


def benchmark_score(protocol: Protocol, table: Table) -> Cell:
    """One benchmark's score under the protocol's rule."""
    if protocol.rule == "category_size":
        sizes = CATEGORY_SIZES[table.benchmark]
        present = [k for k in sizes if k in table.categories and table.categories[k].n > 0]
        if not present:
            return Cell.of([])
        spread = mean_of([table.categories[k] for k in present], [sizes[k] for k in present])
        mean = weighted_accuracy({k: table.categories[k].mean for k in present}, {k: sizes[k] for k in present})
        return Cell(mean, spread.sem, spread.n)
    if protocol.rule == "task_mean":
        cells = [c for c in table.categories.values() if c.n > 0]
        return mean_of(cells) if cells else Cell.of([])
    return table.overall


def summary(protocol: Protocol, tables: Mapping[str, Table]) -> dict[str, Cell]:
    """benchmark -> its score, plus "average" when the paper averages (over the benchmarks scored)."""
    out = {name: benchmark_score(protocol, tables[name]) for name in protocol.benchmarks if name in tables}
    scored = [c for c in out.values() if c.n > 0]
    if protocol.average and scored:
        out["average"] = mean_of(scored)
    return out


# The papers' tables (seeds 000-003). SpatialCORE: OmniSpatial and SpatiaLab, accuracy weighted by category size.
# ProSR: five benchmarks and their average. AlloSpatial: the tiny splits, MRA / accuracy, unweighted task-type
# means, temperature 1.0, up to 8 turns of 8,192 new tokens, 7 uniformly sampled frames (the limited-observation
# setting of their main table), answers read from the <Answer> tags (its appendix, "Evaluation configuration").
# SpatialThinker: greedy, its benchmarks among these.
register(Protocol("spatialcore", ("omnispatial", "spatialab"), rule="category_size", average=False))
register(Protocol("prosr", ("3dsrbench", "mindcube-tiny", "viewspatial", "embspatial", "sparbench")))
register(Protocol("allospatial", ("vsibench-tiny", "mindcube-tiny"), rule="task_mean", temperature=1.0,
                  max_new_tokens=8192, max_tool_turns=8, video_frames=7))
register(Protocol("spatialthinker", ("cvbench", "3dsrbench")))
