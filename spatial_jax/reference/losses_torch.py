"""Independent float64 torch implementation of the SPEC §6 policy losses and the SFT loss, for parity tests only.

Written row by row (one rollout at a time) so that it shares no structure with the vectorised JAX code in
spatial_jax/rl/losses.py. Semantics it pins down: masked positions are never read; a row without completion
tokens adds nothing (and is left out of the per-sequence mean); metrics are means over completion tokens.
"""

from __future__ import annotations

import math
from typing import Any

import torch

F64 = torch.float64


def _as64(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(F64)
    return torch.as_tensor(x, dtype=F64)


def kl_estimate(l_ref: torch.Tensor, estimator: str, k3_inner_clamp: float = 20.0, k3_out_clamp: float = 10.0):
    """KL(pi_theta || pi_ref) estimators of a 1-D tensor of log pi_theta - log pi_ref (Schulman's k1, k2, k3)."""
    if estimator == "k1":
        return l_ref
    if estimator == "k2":
        return l_ref * l_ref / 2.0
    if estimator == "k3":
        log_q_over_p = torch.clamp(-l_ref, min=-k3_inner_clamp, max=k3_inner_clamp)
        value = torch.exp(log_q_over_p) - 1.0 - log_q_over_p
        return torch.clamp(value, min=-k3_out_clamp, max=k3_out_clamp)
    raise ValueError(estimator)


def _row_ratios(new: torch.Tensor, old: torch.Tensor, kind: str, clamp: float, cap: float) -> torch.Tensor:
    """Importance ratios of the selected tokens of one rollout."""
    log_r = torch.clamp(new - old, min=-clamp, max=clamp)
    if kind == "grpo":
        return torch.exp(log_r)
    seq = log_r.mean()
    if kind == "gspo":
        s = torch.exp(torch.clamp(seq, max=cap))
        return s.expand(new.shape[0])
    if kind == "gspo_token":
        # log s_it = sg(log s_i) + logp_t - sg(logp_t) (GSPO paper, token variant), capped as a whole as verl does:
        # where the cap binds, clamp passes no gradient.
        return torch.exp(torch.clamp(new - new.detach() + seq.detach(), max=cap))
    raise ValueError(kind)


def policy_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    kind: str = "grpo",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    kl_coef: float = 0.01,
    kl_estimator: str = "k3",
    aggregation: str = "token_mean",
    max_completion_length: int = 3072,
    entropy_coef: float = 0.0,
    log_ratio_clamp: float = 20.0,
    gspo_log_ratio_cap: float = 10.0,
    k3_log_ratio_clamp: float = 20.0,
    k3_clamp: float = 10.0,
    ref_logp=None,
    entropy=None,
    is_weights=None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Returns (loss as a float64 tensor with autograd to `logp` when it requires grad, metrics as floats)."""
    logp = logp if isinstance(logp, torch.Tensor) and logp.dtype == F64 else _as64(logp)
    old_logp, advantages = _as64(old_logp), _as64(advantages)
    keep = _as64(mask) > 0
    ref = None if ref_logp is None else _as64(ref_logp)
    ent = None if entropy is None else _as64(entropy)
    weights = None if is_weights is None else _as64(is_weights)
    batch = logp.shape[0]

    row_losses, row_pg, row_counts = [], [], []
    tokens = {"ratio": [], "clip_low": [], "clip_high": [], "dual": [], "kl_old": [], "kl_ref": [], "ent": []}
    for i in range(batch):
        sel = keep[i]
        n = int(sel.sum())
        row_counts.append(n)
        if n == 0:
            row_losses.append(None)
            row_pg.append(None)
            continue
        new_i = logp[i][sel]
        old_i = old_logp[i][sel]
        a = advantages[i]
        r = _row_ratios(new_i, old_i, kind, log_ratio_clamp, gspo_log_ratio_cap)
        lower, upper = 1.0 - clip_low, 1.0 + clip_high
        objective = torch.minimum(r * a, torch.clamp(r, min=lower, max=upper) * a)
        pg = -objective
        if dual_clip is not None and float(a) < 0:
            bound = dual_clip * (-a)
            tokens["dual"].append((pg > bound).to(F64))
            pg = torch.minimum(pg, bound.expand_as(pg))
        elif dual_clip is not None:
            tokens["dual"].append(torch.zeros(n, dtype=F64))
        if weights is not None:  # rollout correction (verl: pg_losses * rollout_is_weights, KL not weighted)
            pg = pg * weights[i][sel]
        total = pg
        if ref is not None:
            k = kl_estimate(new_i - ref[i][sel], kl_estimator, k3_log_ratio_clamp, k3_clamp)
            tokens["kl_ref"].append(k.detach())
            if kl_coef > 0:
                total = total + kl_coef * k
        if ent is not None:
            e = ent[i][sel]
            tokens["ent"].append(e)
            if entropy_coef > 0:
                total = total - entropy_coef * e
        row_losses.append(total)
        row_pg.append(pg)
        rd = r.detach()
        tokens["ratio"].append(rd)
        tokens["clip_low"].append(((rd < lower) & (a < 0)).to(F64).expand(n))
        tokens["clip_high"].append(((rd > upper) & (a > 0)).to(F64).expand(n))
        lr_tok = torch.clamp(new_i.detach() - old_i, min=-log_ratio_clamp, max=log_ratio_clamp)
        tokens["kl_old"].append(torch.exp(lr_tok) - 1.0 - lr_tok)

    def reduce(rows: list) -> torch.Tensor:
        present = [x for x in rows if x is not None]
        zero = logp.sum() * 0.0  # keeps the graph when nothing is selected
        if aggregation == "token_mean":
            if not present:
                return zero
            return torch.cat(present).sum() / sum(x.numel() for x in present)
        if aggregation == "seq_mean_token_mean":
            if not present:
                return zero
            return torch.stack([x.mean() for x in present]).mean()
        if aggregation == "seq_mean_token_sum_norm":
            if not present:
                return zero
            return torch.cat(present).sum() / (batch * max_completion_length)
        raise ValueError(aggregation)

    loss = reduce(row_losses)
    total_tokens = sum(row_counts)

    def token_mean(key: str) -> float:
        if not tokens[key]:
            return 0.0
        return float(torch.cat(tokens[key]).sum()) / max(total_tokens, 1)

    clip_lo, clip_hi = token_mean("clip_low"), token_mean("clip_high")
    metrics = {
        "loss": float(loss.detach()),
        "pg_loss": float(reduce(row_pg).detach()),
        "ratio_mean": token_mean("ratio"),
        "ratio_max": max((float(x.max()) for x in tokens["ratio"]), default=0.0),
        "ratio_dev_max": max((float((x - 1.0).abs().max()) for x in tokens["ratio"]), default=0.0),
        "ratio_std": float(torch.cat(tokens["ratio"]).std(correction=0)) if total_tokens else 0.0,
        "clip_frac_low": clip_lo,
        "clip_frac_high": clip_hi,
        "clip_frac": clip_lo + clip_hi,
        "approx_kl_old": token_mean("kl_old"),
        "num_tokens": float(total_tokens),
        "num_seqs": float(sum(1 for c in row_counts if c > 0)),
    }
    if dual_clip is not None:
        metrics["dual_clip_frac"] = token_mean("dual")
    if ref is not None:
        metrics["kl_ref"] = token_mean("kl_ref")
    if ent is not None:
        metrics["entropy"] = token_mean("ent")
    return loss, metrics


def sft_loss(logits, targets, mask, temperature: float = 1.0) -> torch.Tensor:
    """Mean negative log-likelihood of `targets` under softmax(logits / temperature) over tokens with mask > 0."""
    logits = _as64(logits) / temperature
    keep = _as64(mask) > 0
    if not bool(keep.any()):
        return logits.sum() * 0.0
    logprobs = torch.log_softmax(logits, dim=-1)
    nll = -logprobs.gather(-1, torch.as_tensor(targets, dtype=torch.long).unsqueeze(-1)).squeeze(-1)
    return nll[keep].sum() / keep.sum()


def cosine_schedule(step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup 0 -> lr over warmup_steps, then cosine from lr to min_lr at total_steps (float reference)."""
    if step < warmup_steps:
        return lr * step / warmup_steps
    progress = min(max((step - warmup_steps) / max(total_steps - warmup_steps, 1), 0.0), 1.0)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
