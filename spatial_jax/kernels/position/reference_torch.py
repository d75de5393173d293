"""Torch reference for position entropy: float64 entropy at the chosen rows only (parity only)."""

from __future__ import annotations

import torch


def position_entropy(h: torch.Tensor, w: torch.Tensor, positions: torch.Tensor,
                     temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the next-token distribution at rows `positions` of h only, float64."""
    z = (h[positions.long()].double() @ w.double()) / temperature
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)
