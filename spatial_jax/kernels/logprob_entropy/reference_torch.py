"""Torch reference for the fused log-prob / entropy kernels: materialised float64 logits, autograd for gradients
(parity only)."""

from __future__ import annotations

import torch


def logprob_entropy(
    h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """h [N, D], w [D, V], targets [N] -> (log p(target) [N], entropy [N]) of softmax(h @ w / temperature).

    Computed in float64 on whatever device the inputs live; gradients flow to h and w through autograd.
    """
    z = (h.double() @ w.double()) / temperature
    logp = torch.log_softmax(z, dim=-1)
    lp = logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent
