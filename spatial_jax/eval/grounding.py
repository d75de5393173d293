"""Grounding analyses (SpatialCORE §4.3) and benchmark accuracy summaries over scored rollouts.

Pure functions over per-rollout (or per-box) numbers; the eval command feeds them the scorers' components.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A sample mean with its standard error and sample count (NaN inputs are dropped)."""

    mean: float
    sem: float
    n: int

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON-ready: an empty estimate has mean and sem None (JSON has no NaN)."""
        if self.n == 0:
            return {"mean": None, "sem": None, "n": 0}
        return {"mean": self.mean, "sem": self.sem, "n": self.n}


def estimate(values: Sequence[float]) -> Estimate:
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return Estimate(float("nan"), float("nan"), 0)
    sem = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    return Estimate(float(x.mean()), sem, n)


def accuracy_by_category(correct: Sequence[float], categories: Sequence[str]) -> dict[str, Estimate]:
    """Accuracy per category plus "overall", the sample-weighted mean (each question counts once)."""
    if len(correct) != len(categories):
        raise ValueError(f"{len(correct)} scores but {len(categories)} categories")
    out: dict[str, Estimate] = {"overall": estimate(correct)}
    for cat in sorted(set(categories)):
        out[cat] = estimate([c for c, k in zip(correct, categories) if k == cat])
    return out


def weighted_accuracy(per_category: Mapping[str, float], sizes: Mapping[str, int]) -> float:
    """Benchmark accuracy weighted by the official category sizes (OmniSpatial / SpatiaLab, SPEC 2 A.5)."""
    missing = sorted(set(sizes) - set(per_category))
    if missing:
        raise ValueError(f"categories without a score: {missing}")
    total = sum(sizes.values())
    return float(sum(per_category[k] * n for k, n in sizes.items()) / total)


OMNISPATIAL_SIZES = {
    "Manipulation": 74, "Motion_Analysis": 346, "Traffic_Analysis": 85, "Localization": 105,
    "Geospatial_Strategy": 110, "Pattern_Recognition": 97, "Geometric_Reasoning": 155, "Egocentric": 102,
    "Allocentric": 376, "Hypothetical": 83,
}  # fmt: skip
SPATIALAB_SIZES = {
    "3D Geometry": 238, "Depth & Occlusion": 259, "Orientation": 202, "Relative Positioning": 212,
    "Size & Scale": 252, "Spatial Navigation": 237,
}  # fmt: skip


def iou_by_uncertainty_quartile(uncertainty: Sequence[float], matched_iou: Sequence[float]) -> list[Estimate]:
    """Mean matched IoU in each quartile of box uncertainty H (SpatialCORE §4.3); pairs with a NaN are dropped."""
    h = np.asarray(uncertainty, dtype=np.float64)
    iou = np.asarray(matched_iou, dtype=np.float64)
    if h.shape != iou.shape:
        raise ValueError(f"uncertainty {h.shape} and IoU {iou.shape} differ in shape")
    keep = np.isfinite(h) & np.isfinite(iou)
    h, iou = h[keep], iou[keep]
    if h.size == 0:
        return [Estimate(float("nan"), float("nan"), 0) for _ in range(4)]
    edges = np.quantile(h, [0.25, 0.5, 0.75])
    bins = np.searchsorted(edges, h, side="right")
    return [estimate(iou[bins == q].tolist()) for q in range(4)]


def uncertainty_iou_spearman(uncertainty: Sequence[float], matched_iou: Sequence[float]) -> float:
    """Spearman rho between box uncertainty and matched IoU (paper: +0.38 baseline -> -0.42 trained); NaN if < 3."""
    h = np.asarray(uncertainty, dtype=np.float64)
    iou = np.asarray(matched_iou, dtype=np.float64)
    keep = np.isfinite(h) & np.isfinite(iou)
    if keep.sum() < 3 or np.ptp(h[keep]) == 0 or np.ptp(iou[keep]) == 0:
        return float("nan")
    return float(stats.spearmanr(h[keep], iou[keep]).statistic)
