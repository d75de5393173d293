"""Torch float64 reference of box IoU and CIoU, written independently of spatial_jax.rewards.geometry."""

from __future__ import annotations

import math

import torch

DTYPE = torch.float64

# Above this magnitude a product of two extents could overflow float64 (max ~1.8e308). A pair beyond it is measured
# in units where its largest magnitude lies in [0.5, 1): the same units as the main implementation, so that CIoU's
# eps means the same on both sides.
_BIG = 2.0**500


def _t(x) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=DTYPE)
    t = t.reshape(1, 4) if t.dim() == 1 else t
    # An inverted box collapses onto its first corner (zero width/height), as in the main implementation.
    return torch.stack([t[:, 0], t[:, 1], torch.max(t[:, 0], t[:, 2]), torch.max(t[:, 1], t[:, 3])], dim=1)


def _extent(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    return (hi - lo).clamp(min=0.0)


def _pairs(pred, gt) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcast [n,1,4] x [1,m,4]; a pair with a coordinate beyond _BIG is multiplied by 2**-e, 2**e the power of two
    just above its largest magnitude (exact, and IoU is scale-free, so its areas stay finite and its value is kept)."""
    p, g = _t(pred)[:, None, :], _t(gt)[None, :, :]
    big = torch.max(p.abs().amax(-1), g.abs().amax(-1))
    e = torch.where(big > _BIG, torch.floor(torch.log2(big)) + 1, torch.zeros_like(big))
    unit = torch.pow(torch.full_like(big, 2.0), -e)[..., None]  # 2**-1024 is still a (subnormal) float64
    return p * unit, g * unit


def pairwise_iou(pred, gt) -> torch.Tensor:
    """[n, m] IoU, continuous coordinates, 0 for an empty union."""
    p, g = _pairs(pred, gt)
    area_p = _extent(p[..., 0], p[..., 2]) * _extent(p[..., 1], p[..., 3])
    area_g = _extent(g[..., 0], g[..., 2]) * _extent(g[..., 1], g[..., 3])
    left = torch.max(p[..., 0], g[..., 0])
    right = torch.min(p[..., 2], g[..., 2])
    top = torch.max(p[..., 1], g[..., 1])
    bottom = torch.min(p[..., 3], g[..., 3])
    inter = _extent(left, right) * _extent(top, bottom)
    union = area_p + area_g - inter
    safe = torch.where(union > 0, union, torch.ones_like(union))
    return torch.where(union > 0, inter / safe, torch.zeros_like(union))


def iou(a, b) -> float:
    return float(pairwise_iou(a, b)[0, 0])


def pairwise_ciou(pred, gt, eps: float = 1e-7) -> torch.Tensor:
    """[n, m] CIoU = IoU - rho^2 / c^2 - alpha v (eps-guarded, as SPEC 4; eps in the rescaled units of a huge
    pair)."""
    p, g = _pairs(pred, gt)
    pw, ph = _extent(p[..., 0], p[..., 2]), _extent(p[..., 1], p[..., 3])
    gw, gh = _extent(g[..., 0], g[..., 2]), _extent(g[..., 1], g[..., 3])
    iw = _extent(torch.max(p[..., 0], g[..., 0]), torch.min(p[..., 2], g[..., 2]))
    ih = _extent(torch.max(p[..., 1], g[..., 1]), torch.min(p[..., 3], g[..., 3]))
    inter = iw * ih
    i_o_u = inter / (pw * ph + gw * gh - inter + eps)
    pcx, pcy = (p[..., 0] + p[..., 2]) / 2, (p[..., 1] + p[..., 3]) / 2
    gcx, gcy = (g[..., 0] + g[..., 2]) / 2, (g[..., 1] + g[..., 3]) / 2
    rho2 = (pcx - gcx) ** 2 + (pcy - gcy) ** 2
    enc_w = torch.max(p[..., 2], g[..., 2]) - torch.min(p[..., 0], g[..., 0])
    enc_h = torch.max(p[..., 3], g[..., 3]) - torch.min(p[..., 1], g[..., 1])
    c2 = enc_w**2 + enc_h**2 + eps
    v = 4.0 / math.pi**2 * (torch.atan(gw / (gh + eps)) - torch.atan(pw / (ph + eps))) ** 2
    a = v / ((1.0 - i_o_u) + v + eps)
    return i_o_u - rho2 / c2 - a * v


def ciou(a, b, eps: float = 1e-7) -> float:
    return float(pairwise_ciou(a, b, eps)[0, 0])
