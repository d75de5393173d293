"""Torch float64 reference of DAPO's soft overlong punishment (Yu et al. 2025, Sec. 3.4, eq. 13), written one
length at a time, independent of spatial_jax.rewards.overlong."""

from __future__ import annotations

import torch


def overlong_penalty(length: int, max_length: int, cache: int) -> float:
    if length > max_length:
        return -1.0
    excess = torch.tensor(length - (max_length - cache), dtype=torch.float64)
    return float(-torch.clamp(excess, min=0) / cache)
