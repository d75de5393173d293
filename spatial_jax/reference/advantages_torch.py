"""Torch float64 reference of group-relative advantages (eq. 2), independent of spatial_jax.rewards.advantages;
std "none" is Dr. GRPO's r_i - mean_G r (Liu et al. 2025, Sec. 3.1)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def group_advantages(rewards, eps: float = 1e-4, std: str = "population") -> torch.Tensor:
    """One group's rewards [G] -> advantages; one member, no spread or a non-finite reward -> zeros."""
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    if r.numel() < 2 or not bool(torch.isfinite(r).all()) or bool(torch.all(r == r[0])):
        return torch.zeros_like(r)
    centred = r - r.mean()
    if std == "none":
        return centred
    return centred / (torch.std(r, correction=0 if std == "population" else 1) + eps)


def advantages_by_group(
    rewards: Sequence[float], groups: Sequence[Hashable | None], eps: float = 1e-4, std: str = "population"
) -> list[float | None]:
    out: list[float | None] = [None] * len(rewards)
    for g in dict.fromkeys(x for x in groups if x is not None):
        idx = [i for i, x in enumerate(groups) if x == g]
        adv = group_advantages([rewards[i] for i in idx], eps, std)
        for i, a in zip(idx, adv.tolist()):
            out[i] = a
    return out
