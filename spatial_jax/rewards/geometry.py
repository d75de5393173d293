"""Box geometry in float64 numpy: IoU, CIoU (pairwise forms too) and the SpatialCORE box validity rule.

Boxes are [x1, y1, x2, y2]. A box with x2 < x1 (y2 < y1) is read as x2 = x1 (y2 = y1): zero width (height).
So every function returns a finite value for any finite input, zero-area boxes included. A pair with a coordinate
beyond 2**HUGE_EXP is first scaled by a power of two (exact) so that its areas cannot overflow: IoU is scale-free,
and CIoU's eps then acts in the scaled units, where it is as negligible as in any box of ordinary size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

CIOU_EPS = 1e-7

# Coordinates up to 2**HUGE_EXP keep every product of two extents finite (2 * 2**(2 * HUGE_EXP) < float64 max), so
# ordinary boxes are never rescaled and their values stay bit for bit what the plain formulas give.
HUGE_EXP = 500


def _boxes(a, what: str) -> np.ndarray:
    b = np.asarray(a, dtype=np.float64)
    if b.ndim == 1:
        b = b[None]
    if b.ndim != 2 or b.shape[1] != 4:
        raise ValueError(f"{what} must have shape [n, 4], got {np.shape(a)}")
    return np.concatenate([b[:, :2], np.maximum(b[:, 2:], b[:, :2])], axis=1)


def _parts(p: np.ndarray, g: np.ndarray):
    """Broadcast [n,1,4] x [1,m,4]: intersection, both areas, widths and heights (negative extents -> 0)."""
    p = p[:, None, :]
    g = g[None, :, :]
    big = np.maximum(np.abs(p).max(axis=-1), np.abs(g).max(axis=-1))  # [n, m]
    exp = np.where(big > 2.0**HUGE_EXP, np.frexp(big)[1], 0)[..., None]
    if np.any(exp):
        p, g = np.ldexp(p, -exp), np.ldexp(g, -exp)
    wp = np.maximum(p[..., 2] - p[..., 0], 0.0)
    hp = np.maximum(p[..., 3] - p[..., 1], 0.0)
    wg = np.maximum(g[..., 2] - g[..., 0], 0.0)
    hg = np.maximum(g[..., 3] - g[..., 1], 0.0)
    iw = np.maximum(np.minimum(p[..., 2], g[..., 2]) - np.maximum(p[..., 0], g[..., 0]), 0.0)
    ih = np.maximum(np.minimum(p[..., 3], g[..., 3]) - np.maximum(p[..., 1], g[..., 1]), 0.0)
    return p, g, iw * ih, wp, hp, wg, hg


def pairwise_iou(pred, gt) -> np.ndarray:
    """[n, m] IoU with continuous coordinates (no +1); 0 when the union is empty (SPEC 7)."""
    p, g = _boxes(pred, "pred"), _boxes(gt, "gt")
    _, _, inter, wp, hp, wg, hg = _parts(p, g)
    union = wp * hp + wg * hg - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def iou(a, b) -> float:
    return float(pairwise_iou(a, b)[0, 0])


def pairwise_ciou(pred, gt, eps: float = CIOU_EPS) -> np.ndarray:
    """[n, m] complete IoU (SPEC 4): IoU - rho^2 / c^2 - alpha v, with eps in every denominator; in [-1.5, 1]."""
    p, g = _boxes(pred, "pred"), _boxes(gt, "gt")
    p, g, inter, wp, hp, wg, hg = _parts(p, g)
    union = wp * hp + wg * hg - inter + eps
    iou_ = inter / union
    rho2 = ((p[..., 0] + p[..., 2]) - (g[..., 0] + g[..., 2])) ** 2 / 4.0 + (
        (p[..., 1] + p[..., 3]) - (g[..., 1] + g[..., 3])
    ) ** 2 / 4.0
    cw = np.maximum(p[..., 2], g[..., 2]) - np.minimum(p[..., 0], g[..., 0])
    ch = np.maximum(p[..., 3], g[..., 3]) - np.minimum(p[..., 1], g[..., 1])
    c2 = cw**2 + ch**2 + eps
    v = (4.0 / math.pi**2) * (np.arctan(wg / (hg + eps)) - np.arctan(wp / (hp + eps))) ** 2
    alpha = v / ((1.0 - iou_) + v + eps)
    return iou_ - rho2 / c2 - alpha * v


def ciou(a, b, eps: float = CIOU_EPS) -> float:
    return float(pairwise_ciou(a, b, eps)[0, 0])


def valid_box(coords: Any, label: Any = "", lo: int = 0, hi: int = 1000, need_label: bool = True) -> bool:
    """SPEC 7: four integers with lo <= x1 < x2 <= hi and lo <= y1 < y2 <= hi, and (when asked) a non-blank label."""
    if not isinstance(coords, (list, tuple)) or len(coords) != 4:
        return False
    if not all(type(c) is int or isinstance(c, np.integer) for c in coords):
        return False
    x1, y1, x2, y2 = (int(c) for c in coords)
    if not (lo <= x1 < x2 <= hi and lo <= y1 < y2 <= hi):
        return False
    if need_label and (not isinstance(label, str) or not label.strip()):
        return False
    return True
