"""Independent float64 torch implementation of the rollout correction and the sampler-trainer gap metrics
(spatial_jax/rl/rollout_correction.py), for parity tests only, written from verl 0.9.1's code
(`verl/trainer/ppo/rollout_corr_helper.py`): `compute_rollout_correction_weights` and `compute_is_metrics` for TIS
(token: exp of each log-ratio clamped to +-20; sequence: exp of the unclamped masked sum clamped to +-20; weights
clamp(max=C); rollout_is_mean over the truncated weights; the high fraction from the raw weights per token and from
the unclamped log-sum against log C per sequence), `compute_rollout_rejection_mask` and `compute_rs_metrics` for the
k1 rejection options (token_k1 = -clamp(log-ratio, +-20); seq_sum_k1 / seq_mean_k1 its masked sum / mean; kept
where log lower <= statistic <= log upper), and `compute_offpolicy_metrics`' k3 for the gap.

Row by row: each rollout's selected tokens are taken out first, so masked positions are never read. Shares over
sequences count the rows holding at least one token, and an empty batch gives 0 (verl divides its batch-wide
sequence shares by every row and refuses an empty mask: SPEC §10's two differences).
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


def _tis(d: torch.Tensor, level: str, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(truncated weights, over-threshold flags) of one row's tokens."""
    if level == "token":
        raw = torch.exp(d.clamp(-BOUND, BOUND))
        over = raw > threshold
    else:
        log_sum = d.sum()
        raw = torch.exp(log_sum.clamp(-BOUND, BOUND)).expand(d.shape)
        over = (log_sum > math.log(threshold)).expand(d.shape)
    return raw.clamp(max=threshold), over


def _k1(d: torch.Tensor, level: str) -> torch.Tensor:
    """verl's k1 rejection statistic of one row's tokens, log(pi_sampler / pi_old) clamped per token first."""
    k1 = -d.clamp(-BOUND, BOUND)
    if level == "token":
        return k1
    return (k1.sum() if level == "sequence" else k1.mean()).expand(d.shape)


def correction(old: Any, sampler: Any, mask: Any, tis: str = "off", tis_threshold: float = 2.0,
               mis: str = "off", mis_upper: float = 2.0, mis_lower: float | None = None):
    """(weights [B, T], mask [B, T], metrics) as rl.rollout_correction.rollout_correction defines them."""
    mask_t = torch.as_tensor(mask).to(F64)
    B, T = mask_t.shape
    rows = _rows(old, sampler, mask)
    weights = torch.zeros(B, T, dtype=F64)
    keep = torch.zeros(B, T, dtype=F64)
    lower = 1.0 / mis_upper if mis_lower is None else mis_lower
    log_lower, log_upper = math.log(lower), math.log(mis_upper)
    tokens = sum(len(d) for d in rows)
    seqs = sum(1 for d in rows if len(d))
    metrics: dict[str, float] = {}
    weight_sum = truncated = masked = seq_masked = high = low = 0.0
    for i, d in enumerate(rows):
        where = mask_t[i] > 0
        if not len(d):
            continue
        w = torch.ones_like(d)
        if tis != "off":
            w, over = _tis(d, tis, tis_threshold)
            weight_sum += float(w.sum())
            truncated += float(over.sum()) if tis == "token" else float(over.any())
        weights[i, where] = w
        kept = torch.ones_like(d, dtype=torch.bool)
        if mis != "off":
            stat = _k1(d, mis)
            hi, lo = stat > log_upper, stat < log_lower
            kept = (stat >= log_lower) & (stat <= log_upper)
            masked += float((~kept).sum())
            seq_masked += float((~kept).any())
            high += float(hi.sum()) if mis == "token" else float(hi.any())
            low += float(lo.sum()) if mis == "token" else float(lo.any())
        keep[i, where] = kept.to(F64)
    if tis != "off":
        metrics["tis_weight_mean"] = weight_sum / max(tokens, 1)
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
