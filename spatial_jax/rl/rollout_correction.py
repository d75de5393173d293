"""The sampler-trainer gap and its correction (verl's rollout correction; SPEC §6).

The sampler decodes from its own copy of the policy (a bfloat16 decoding copy, paged attention) and the trainer
computes the loss with another implementation (its own dtype, attention kernel and fused log-prob kernel), so for
the same weights log pi_sampler and log pi_trainer differ by numerics. With `rl.old_logp = "sampler"` that
difference enters the PPO ratio as if it were a policy change; with `"trainer"` pi_old is recomputed by the trainer
and the remaining gap pi_old / pi_sampler can be corrected here:

- TIS (truncated importance sampling): the policy-gradient term of each token is multiplied by
  w = min(rho, C), rho = pi_old / pi_sampler per token ("token") or the product over the sequence ("sequence").
- MIS (masked importance sampling, verl's rejection sampling): tokens ("token") or whole sequences ("sequence":
  the product of the token ratios, "geometric": their geometric mean) whose rho lies outside [lower, upper] are
  dropped from the loss, numerator and denominator alike.

Pure, jittable functions of [B, T] arrays; positions where mask == 0 are never read (they may hold -inf or NaN).
Every log-ratio is clamped to [-20, 20] before exp, as verl does (its SAFETY_BOUND), so no weight or metric is
infinite. Shares and means are over completion tokens, or over the sequences holding at least one token.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from spatial_jax.config import check_positive, require

SAFETY_BOUND = 20.0  # |log rho| cap before exp (verl's rollout correction)

TISLevel = Literal["off", "token", "sequence"]
MISLevel = Literal["off", "token", "sequence", "geometric"]
Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class CorrectionConfig:
    """Rollout correction of pi_old (the trainer's, rl.old_logp = "trainer") against pi_sampler.

    tis: "off", "token" or "sequence"; tis_threshold: C, the truncation of the importance weight (verl's
      rollout_is_threshold, default 2).
    mis: "off", "token", "sequence" or "geometric"; mis_upper / mis_lower: the interval of rho that is kept
      (verl's rollout_rs_threshold / rollout_rs_threshold_lower; mis_lower None = 1 / mis_upper).
    Both may be on at once (verl's order: the weights from the whole mask, then the rejection).
    """

    tis: TISLevel = "off"
    tis_threshold: float = 2.0
    mis: MISLevel = "off"
    mis_upper: float = 2.0
    mis_lower: float | None = None

    def __post_init__(self) -> None:
        require("tis", self.tis, self.tis in ("off", "token", "sequence"), "be 'off', 'token' or 'sequence'")
        require("mis", self.mis, self.mis in ("off", "token", "sequence", "geometric"),
                "be 'off', 'token', 'sequence' or 'geometric'")
        check_positive(self, "tis_threshold", "mis_upper")
        if self.mis_lower is not None:
            check_positive(self, "mis_lower")
            require("mis_lower", self.mis_lower, self.mis_lower <= self.mis_upper,
                    f"be at most mis_upper={self.mis_upper}")

    @property
    def enabled(self) -> bool:
        return self.tis != "off" or self.mis != "off"

    @property
    def lower(self) -> float:
        return 1.0 / self.mis_upper if self.mis_lower is None else self.mis_lower


def _dtype(x: jax.Array) -> jnp.dtype:
    return jnp.promote_types(x.dtype, jnp.float32)


def _masked(x: jax.Array, valid: jax.Array) -> jax.Array:
    return jnp.where(valid, x, 0.0)


def _mean(x: jax.Array, valid: jax.Array) -> jax.Array:
    return jnp.sum(_masked(x, valid)) / jnp.maximum(jnp.sum(valid), 1)


def _log_rho(log_ratio: jax.Array, valid: jax.Array, level: str) -> jax.Array:
    """log rho per token [B, T] for `level` (0 where masked), clamped to +-SAFETY_BOUND: the token's own log-ratio,
    or its sequence's sum ("sequence") or mean ("geometric") broadcast over the row."""
    if level == "token":
        out = log_ratio
    else:
        total = jnp.sum(log_ratio, axis=-1, keepdims=True)
        if level == "geometric":
            total = total / jnp.maximum(jnp.sum(valid, axis=-1, keepdims=True), 1)
        out = jnp.broadcast_to(total, log_ratio.shape)
    return _masked(jnp.clip(out, -SAFETY_BOUND, SAFETY_BOUND), valid)


def _share(flag: jax.Array, valid: jax.Array, level: str, dtype) -> jax.Array:
    """Share of tokens (token level) or of sequences with a token (sequence levels: the flag is per row) flagged."""
    if level == "token":
        return _mean(flag.astype(dtype), valid)
    rows = jnp.any(valid, axis=-1)
    row_flag = jnp.any(flag & valid, axis=-1)
    return (jnp.sum(row_flag & rows) / jnp.maximum(jnp.sum(rows), 1)).astype(dtype)


def rollout_correction(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array,
                       cfg: CorrectionConfig) -> tuple[jax.Array, jax.Array, Metrics]:
    """(weights [B, T], mask [B, T], metrics) for the policy-gradient terms of pi_old vs pi_sampler.

    weights: the TIS weight min(rho, C) of each token (1 with tis off; 0 where the input mask is 0), constant
    (stop-gradient). mask: the input mask with the tokens (or sequences) MIS rejects set to 0.
    metrics: with TIS, tis_weight_mean (mean rho over tokens before truncation, as verl reports it) and
    tis_truncated_frac (share of tokens, or sequences, whose rho exceeds C); with MIS, mis_masked_frac (share of
    tokens dropped), mis_seq_masked_frac (share of sequences losing at least one token), mis_high_frac and
    mis_low_frac (share of tokens or sequences above upper / below lower).
    """
    if not (old_logp.shape == sampler_logp.shape == mask.shape) or old_logp.ndim != 2:
        raise ValueError(f"old_logp {old_logp.shape}, sampler_logp {sampler_logp.shape} and mask {mask.shape} must "
                         "be one [B, T] shape")
    dtype = _dtype(old_logp)
    valid = mask > 0
    log_ratio = _masked(jax.lax.stop_gradient(old_logp).astype(dtype) - sampler_logp.astype(dtype), valid)
    metrics: Metrics = {}
    weights = valid.astype(dtype)
    if cfg.tis != "off":
        rho = _masked(jnp.exp(_log_rho(log_ratio, valid, cfg.tis)), valid)
        metrics["tis_weight_mean"] = _mean(rho, valid)
        metrics["tis_truncated_frac"] = _share(rho > cfg.tis_threshold, valid, cfg.tis, dtype)
        weights = jnp.minimum(rho, cfg.tis_threshold)
    out_mask = valid
    if cfg.mis != "off":
        rho = jnp.exp(_log_rho(log_ratio, valid, cfg.mis))
        high, low = rho > cfg.mis_upper, rho < cfg.lower
        out_mask = valid & ~(high | low)
        metrics["mis_masked_frac"] = _mean((~out_mask).astype(dtype), valid)
        metrics["mis_seq_masked_frac"] = _share(~out_mask, valid, "sequence", dtype)
        metrics["mis_high_frac"] = _share(high, valid, cfg.mis, dtype)
        metrics["mis_low_frac"] = _share(low, valid, cfg.mis, dtype)
    return jax.lax.stop_gradient(weights), out_mask.astype(mask.dtype), metrics


def gap_metrics(trainer_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array) -> Metrics:
    """How far the sampler's log-probs are from the trainer's on the tokens that carry loss, d = log pi_trainer -
    log pi_sampler per token:

    abs_mean, abs_max: mean and max |d| over tokens;
    kl: verl's k3 estimate of KL(pi_sampler || pi_trainer) from the sampled tokens, mean(exp(d) - d - 1), with d
      clamped to +-20 inside the exp; kl_k1: mean(-d), the plain estimate (verl's rollout_corr/kl);
    seq_log_ratio_std, seq_log_ratio_abs_max: the spread of the per-sequence log-ratio sum_t d (the log of the
      sequence-level importance weight) over sequences with a token: population std and max |.|.
    An empty mask gives 0 for each.
    """
    dtype = _dtype(trainer_logp)
    valid = mask > 0
    d = _masked(trainer_logp.astype(dtype) - sampler_logp.astype(dtype), valid)
    dc = jnp.clip(d, -SAFETY_BOUND, SAFETY_BOUND)
    rows = jnp.any(valid, axis=-1)
    n_rows = jnp.maximum(jnp.sum(rows), 1)
    seq = jnp.sum(d, axis=-1)
    seq_mean = jnp.sum(_masked(seq, rows)) / n_rows
    seq_var = jnp.sum(_masked(jnp.square(seq - seq_mean), rows)) / n_rows
    return {
        "abs_mean": _mean(jnp.abs(d), valid),
        "abs_max": jnp.max(jnp.abs(d), initial=0.0),
        "kl": _mean(jnp.expm1(dc) - dc, valid),
        "kl_k1": _mean(-d, valid),
        "seq_log_ratio_std": jnp.sqrt(seq_var),
        "seq_log_ratio_abs_max": jnp.max(_masked(jnp.abs(seq), rows), initial=0.0),
    }
