"""Torch float64 reference of the ProSR reward (SPEC 3), written apart from spatial_jax.rewards.prosr.

Shares only the string parsers; trajectories, resampling, similarity and segment statistics are computed here.
"""

from __future__ import annotations

import torch

from spatial_jax.reference.trace_torch import usable_tokens
from spatial_jax.rewards.parse_think import parse_think, resolve_gold

DTYPE = torch.float64


def reasoning_entropies(completion: str, entropies, offsets, end: int) -> torch.Tensor:
    """Entropies of the usable tokens (trace_torch) that end by `end` (inside the span), in order."""
    spans, ent = usable_tokens(completion, entropies, offsets)
    inside = [e <= end for _, e in spans]
    return ent[torch.tensor(inside, dtype=torch.bool)] if spans else ent


def resample(e: torch.Tensor, t: int) -> torch.Tensor:
    """Linear interpolation of e (positions 0..L-1) at T evenly spaced points from 0 to L-1."""
    n = e.numel()
    if n == 0:
        return torch.zeros(t, dtype=DTYPE)
    if n == 1:
        return e.repeat(t)
    x = torch.linspace(0.0, n - 1, t, dtype=DTYPE)
    lo = torch.clamp(torch.floor(x).long(), 0, n - 1)
    hi = torch.clamp(lo + 1, max=n - 1)
    frac = x - lo.to(DTYPE)
    return e[lo] * (1 - frac) + e[hi] * frac


def normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x / (x.abs().sum() + eps)


def similarity(e: torch.Tensor, e_blank: torch.Tensor, t: int, eps: float) -> float:
    """Eq. 8."""
    return float(1 - 0.5 * (normalise(resample(e, t), eps) - normalise(resample(e_blank, t), eps)).abs().sum())


def segment_means(e: torch.Tensor, mid_start: float, late_start: float) -> tuple[float, float, float]:
    n = e.numel()
    cuts = [0, round(mid_start * n), round(late_start * n), n]
    out = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        out.append(float(e[a:b].mean()) if b > a else 0.0)
    return out[0], out[1], out[2]


def score_one(ro, cfg) -> dict[str, float]:
    p = parse_think(ro.completion)
    gold = resolve_gold(ro.answer, ro.options)
    closed = p.think_close_count > 0
    r_acc = 1.0 if closed and gold is not None and p.answer == gold else 0.0
    tail = p.after_think.strip()
    r_fmt = 1.0 if p.think_close_count == 1 and len(tail) == 1 and tail.isupper() and tail.isascii() else 0.0
    end = ro.completion.find("</think>")
    e = reasoning_entropies(ro.completion, ro.trace.entropies, ro.trace.offsets, end) if closed else torch.zeros(0)
    b = parse_think(ro.blank.completion) if ro.blank is not None else None
    b_end = ro.blank.completion.find("</think>") if ro.blank is not None else -1
    if b is not None and b_end >= 0:
        eb = reasoning_entropies(ro.blank.completion, ro.blank.trace.entropies, ro.blank.trace.offsets, b_end)
    else:
        eb = torch.zeros(0)
    drift_on = closed and e.numel() >= cfg.min_span_tokens
    cf_on = drift_on and b_end >= 0 and eb.numel() >= cfg.min_span_tokens
    same = cf_on and p.answer is not None and p.answer == b.answer
    s_cf = similarity(e, eb, cfg.resample_len, cfg.l1_eps) if cf_on else 0.0
    r_cf = -min(1.0, max(0.0, (s_cf - cfg.tau_cf) / (1 - cfg.tau_cf))) if same else 0.0
    h_e, h_m, h_l = segment_means(e, cfg.mid_start, cfg.late_start)
    delta = max(0.0, h_l - h_m - cfg.margin)
    r_drift = -min(1.0, delta) if drift_on else 0.0
    return dict(
        reward=r_acc + cfg.lambda_fmt * r_fmt + cfg.lambda_cf * r_cf + cfg.lambda_drift * r_drift,
        r_acc=r_acc,
        r_fmt=r_fmt,
        r_cf=r_cf,
        r_drift=r_drift,
        s_cf=s_cf,
        delta_tail=delta if drift_on else 0.0,
        h_early=h_e,
        h_mid=h_m,
        h_late=h_l,
        span_len=float(e.numel()),
        blank_span_len=float(eb.numel()),
        cf_active=float(cf_on),
        drift_active=float(drift_on),
        same_answer=float(same),
        has_blank=float(b is not None),
        think_closed=float(closed),
        answer_parsed=float(p.answer is not None),
        gold_resolved=float(gold is not None),
        well_formed=r_fmt,
    )


def score_batch(rollouts, cfg) -> list[dict[str, float]]:
    return [score_one(ro, cfg) for ro in rollouts]
