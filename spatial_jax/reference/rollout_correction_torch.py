"""Independent float64 torch implementation of the rollout correction and the sampler-trainer gap metrics
(spatial_jax/rl/rollout_correction.py), written from verl's formulas (rollout_corr_helper: rho = pi_old /
pi_rollout from log-ratios clamped to +-20; TIS w = min(rho, C) over the whole mask; rejection keeps
lower <= rho <= upper, lower defaulting to 1 / upper; k3 = E[rho - log rho - 1]), for parity tests only.

Row by row: each rollout's selected tokens are taken out first, so masked positions are never read. Shares over
sequences count the rows holding at least one token (verl divides by every row of the batch).
"""

from __future__ import annotations

import math
from typing import Any

import torch

F64 = torch.float64
BOUND = 20.0


def _rows(old: Any, sampler: Any, mask: Any) -> list[torch.Tensor]:
    """Per row, the log-ratios log pi_old - log pi_sampler of its selected tokens (1-D, possibly empty)."""
    old, sampler, mask = (torch.as_tensor(x).to(F64) for x in (old, sampler, mask))
    return [old[i][mask[i] > 0] - sampler[i][mask[i] > 0] for i in range(mask.shape[0])]


def _level_log_rho(d: torch.Tensor, level: str) -> torch.Tensor:
    """log rho of each selected token of a row, clamped to +-BOUND."""
    if level == "token":
        value = d
    elif level == "sequence":
        value = d.sum().expand(d.shape)
    else:  # geometric
        value = d.mean().expand(d.shape)
    return value.clamp(-BOUND, BOUND)


def correction(old: Any, sampler: Any, mask: Any, tis: str = "off", tis_threshold: float = 2.0,
               mis: str = "off", mis_upper: float = 2.0, mis_lower: float | None = None):
    """(weights [B, T], mask [B, T], metrics) as rl.rollout_correction.rollout_correction defines them."""
    mask_t = torch.as_tensor(mask).to(F64)
    B, T = mask_t.shape
    rows = _rows(old, sampler, mask)
    weights = torch.zeros(B, T, dtype=F64)
    keep = torch.zeros(B, T, dtype=F64)
    lower = 1.0 / mis_upper if mis_lower is None else mis_lower
    tokens = sum(len(d) for d in rows)
    seqs = sum(1 for d in rows if len(d))
    metrics: dict[str, float] = {}
    rho_sum = truncated = masked = seq_masked = high = low = 0.0
    for i, d in enumerate(rows):
        where = mask_t[i] > 0
        if not len(d):
            continue
        w = torch.ones_like(d)
        if tis != "off":
            rho = torch.exp(_level_log_rho(d, tis))
            rho_sum += float(rho.sum())
            over = rho > tis_threshold
            truncated += float(over.sum()) if tis == "token" else float(over.any())
            w = torch.minimum(rho, torch.tensor(tis_threshold, dtype=F64))
        weights[i, where] = w
        kept = torch.ones_like(d, dtype=torch.bool)
        if mis != "off":
            rho = torch.exp(_level_log_rho(d, mis))
            hi, lo = rho > mis_upper, rho < lower
            kept = ~(hi | lo)
            masked += float((~kept).sum())
            seq_masked += float((~kept).any())
            high += float(hi.sum()) if mis == "token" else float(hi.any())
            low += float(lo.sum()) if mis == "token" else float(lo.any())
        keep[i, where] = kept.to(F64)
    if tis != "off":
        metrics["tis_weight_mean"] = rho_sum / max(tokens, 1)
        metrics["tis_truncated_frac"] = truncated / max(tokens if tis == "token" else seqs, 1)
    if mis != "off":
        per = max(tokens if mis == "token" else seqs, 1)
        metrics.update(mis_masked_frac=masked / max(tokens, 1), mis_seq_masked_frac=seq_masked / max(seqs, 1),
                       mis_high_frac=high / per, mis_low_frac=low / per)
    return weights, keep, metrics


def gap(trainer: Any, sampler: Any, mask: Any) -> dict[str, float]:
    """The sampler-trainer gap metrics of rl.rollout_correction.gap_metrics."""
    rows = [d for d in _rows(trainer, sampler, mask) if len(d)]
    if not rows:
        return dict.fromkeys(("abs_mean", "abs_max", "kl", "kl_k1", "seq_log_ratio_std", "seq_log_ratio_abs_max"),
                             0.0)
    d = torch.cat(rows)
    dc = d.clamp(-BOUND, BOUND)
    seq = torch.stack([r.sum() for r in rows])
    return {
        "abs_mean": float(d.abs().mean()),
        "abs_max": float(d.abs().max()),
        "kl": float((torch.exp(dc) - 1.0 - dc).mean()),
        "kl_k1": float((-d).mean()),
        "seq_log_ratio_std": math.sqrt(float(((seq - seq.mean()) ** 2).mean())),
        "seq_log_ratio_abs_max": float(seq.abs().max()),
    }
