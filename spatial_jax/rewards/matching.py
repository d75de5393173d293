"""One-to-one assignment (Hungarian) on small score or cost matrices."""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment


def _as_matrix(a, what: str) -> np.ndarray:
    m = np.asarray(a, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"{what} must be a 2-D matrix, got shape {m.shape}")
    if not np.all(np.isfinite(m)):
        raise ValueError(f"{what} must be finite")
    return m


def max_weight_matching(score) -> list[tuple[int, int]]:
    """Pairs (row j, column k) maximising the summed score; exactly min(n, m) pairs, zero-score pairs included."""
    m = _as_matrix(score, "score")
    if m.size == 0:
        return []
    rows, cols = linear_sum_assignment(m, maximize=True)
    return [(int(j), int(k)) for j, k in zip(rows, cols)]


def min_cost_matching(cost) -> list[tuple[int, int]]:
    """Pairs (row j, column k) minimising the summed cost; exactly min(n, m) pairs."""
    m = _as_matrix(cost, "cost")
    if m.size == 0:
        return []
    rows, cols = linear_sum_assignment(m)
    return [(int(j), int(k)) for j, k in zip(rows, cols)]
