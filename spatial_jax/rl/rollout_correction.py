"""The sampler-trainer gap and its correction (verl 0.9.1's rollout correction; SPEC §10).

The sampler decodes from its own copy of the policy (a bfloat16 decoding copy, paged attention) and the trainer
computes the loss with another implementation (its own dtype, attention kernel and fused log-prob kernel), so for
the same weights log pi_sampler and log pi_trainer differ by numerics. With `rl.old_logp = "sampler"` that
difference enters the PPO ratio as if it were a policy change; with `"trainer"` pi_old is recomputed by the trainer
and the remaining gap between pi_old and pi_sampler can be corrected here, as verl 0.9.1 does it
(`verl/trainer/ppo/rollout_corr_helper.py`, `compute_rollout_correction_and_rejection_mask`):

- TIS (truncated importance sampling, verl's `rollout_is`): the policy-gradient term of each token is multiplied by
  w = min(rho, C), rho = pi_old / pi_sampler per token ("token", the token's log-ratio clamped to +-20 before exp) or
  the product over the sequence ("sequence": the unclamped sum of log-ratios, clamped to +-20 before exp).
- MIS (verl's rejection sampling `rollout_rs` with its k1 statistics): the statistic is log(pi_sampler / pi_old),
  each token's value clamped to +-20 first, then taken per token ("token": verl's token_k1), summed over the
  sequence ("sequence": seq_sum_k1) or averaged over it ("geometric": seq_mean_k1). Tokens, or whole sequences, whose
  statistic lies outside [log lower, log upper] leave the loss, numerator and denominator alike. So the bounds limit
  pi_sampler / pi_old, verl's direction (a sampler that overrates a token is cut by `mis_upper`).

Pure, jittable functions of [B, T] arrays; positions where mask == 0 are never read (they may hold -inf or NaN).
Shares over sequences count the sequences holding at least one token, and an empty batch gives 0 for every figure:
verl divides its batch-wide sequence shares by every row and refuses an empty mask (SPEC §10's two differences).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp

from spatial_jax.config import check_positive, require

SAFETY_BOUND = 20.0  # |log-ratio| cap before exp, and per token before MIS's sum or mean (verl's SAFETY_BOUND)

TISLevel = Literal["off", "token", "sequence"]
MISLevel = Literal["off", "token", "sequence", "geometric"]
Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class CorrectionConfig:
    """Rollout correction of pi_old (the trainer's, rl.old_logp = "trainer") against pi_sampler, as verl 0.9.1.

    tis: "off", "token" or "sequence" (verl's rollout_is); tis_threshold: C, the truncation of the importance weight
      pi_old / pi_sampler (verl's rollout_is_threshold as one number, default 2).
    mis: "off", "token", "sequence" or "geometric" (verl's rollout_rs = token_k1, seq_sum_k1, seq_mean_k1);
      mis_lower / mis_upper: the kept interval of pi_sampler / pi_old (token), its product over the sequence
      (sequence) or its geometric mean (geometric): verl's rollout_rs_threshold "lower_upper"; mis_lower None =
      1 / mis_upper, as verl reads a single number, which therefore must be at least 1.
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
        if self.mis_lower is None:
            # verl refuses the same: one bound b keeps [1/b, b], which is empty for b < 1
            require("mis_upper", self.mis_upper, self.mis_upper >= 1.0,
                    f"be at least 1 while mis_lower is unset (the kept interval [1/mis_upper, mis_upper] = "
                    f"[{1.0 / self.mis_upper:g}, {self.mis_upper:g}] would be empty; set mis_lower too)")
        else:
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


def _per_row(total: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jnp.broadcast_to(total[:, None], shape)


def _row_share(flag: jax.Array, valid: jax.Array, dtype) -> jax.Array:
    """Share of the sequences holding a token that have a flagged token."""
    rows = jnp.any(valid, axis=-1)
    row_flag = jnp.any(flag & valid, axis=-1)
    return (jnp.sum(row_flag & rows) / jnp.maximum(jnp.sum(rows), 1)).astype(dtype)


def _share(flag: jax.Array, valid: jax.Array, level: str, dtype) -> jax.Array:
    """Share of tokens (token level) or of sequences with a token (sequence levels: the flag is per row) flagged."""
    return _mean(flag.astype(dtype), valid) if level == "token" else _row_share(flag, valid, dtype)


def _tis(log_ratio: jax.Array, valid: jax.Array, cfg: CorrectionConfig, dtype) -> tuple[jax.Array, Metrics]:
    """verl's compute_rollout_correction_weights and the two of its compute_is_metrics figures logged here."""
    if cfg.tis == "token":
        rho = jnp.exp(jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
        over = rho > cfg.tis_threshold
    else:
        log_sum = jnp.sum(log_ratio, axis=-1)  # unclamped: the clamp comes after the sum for the weight
        rho = _per_row(jnp.exp(jnp.clip(log_sum, -SAFETY_BOUND, SAFETY_BOUND)), log_ratio.shape)
        over = _per_row(log_sum > math.log(cfg.tis_threshold), log_ratio.shape)
    weights = _masked(jnp.minimum(rho, cfg.tis_threshold), valid)
    return weights, {
        "tis_weight_mean": _mean(weights, valid),  # verl's rollout_is_mean: of the truncated weights
        "tis_truncated_frac": _share(over, valid, cfg.tis, dtype),  # rollout_is_ratio_fraction_high
    }


def _mis(log_ratio: jax.Array, valid: jax.Array, cfg: CorrectionConfig, dtype) -> tuple[jax.Array, Metrics]:
    """verl's compute_rollout_rejection_mask for token_k1 / seq_sum_k1 / seq_mean_k1 and its logged shares."""
    stat = _masked(-jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND), valid)  # k1 = log(pi_sampler / pi_old)
    if cfg.mis != "token":
        total = jnp.sum(stat, axis=-1)
        if cfg.mis == "geometric":
            total = total / jnp.maximum(jnp.sum(valid, axis=-1), 1)
        stat = _per_row(total, log_ratio.shape)
    high, low = stat > math.log(cfg.mis_upper), stat < math.log(cfg.lower)
    kept = valid & ~(high | low)
    return kept, {
        "mis_masked_frac": _mean((~kept).astype(dtype), valid),  # rollout_rs_masked_fraction
        "mis_seq_masked_frac": _row_share(~kept, valid, dtype),  # rollout_rs_seq_masked_fraction
        "mis_high_frac": _share(high, valid, cfg.mis, dtype),  # rollout_rs_<option>_fraction_high
        "mis_low_frac": _share(low, valid, cfg.mis, dtype),  # rollout_rs_<option>_fraction_low
    }


def rollout_correction(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array,
                       cfg: CorrectionConfig) -> tuple[jax.Array, jax.Array, Metrics]:
    """(weights [B, T], mask [B, T], metrics) for the policy-gradient terms of pi_old vs pi_sampler.

    weights: the TIS weight min(rho, C) of each token (1 with tis off; 0 where the input mask is 0), constant
    (stop-gradient). mask: the input mask with the tokens (or sequences) MIS rejects set to 0.
    metrics, each the verl 0.9.1 figure named beside it (rollout_corr/...): with TIS, tis_weight_mean (mean of the
    truncated weights over tokens: rollout_is_mean) and tis_truncated_frac (share of tokens whose rho exceeds C, or
    of sequences whose unclamped log-ratio sum exceeds log C: rollout_is_ratio_fraction_high); with MIS,
    mis_masked_frac (share of tokens dropped: rollout_rs_masked_fraction), mis_seq_masked_frac (share of sequences
    losing a token: rollout_rs_seq_masked_fraction), mis_high_frac and mis_low_frac (share of tokens, or sequences,
    whose pi_sampler / pi_old statistic lies above upper / below lower: rollout_rs_<option>_fraction_high / _low).
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
        weights, tis_metrics = _tis(log_ratio, valid, cfg, dtype)
        metrics.update(tis_metrics)
    out_mask = valid
    if cfg.mis != "off":
        out_mask, mis_metrics = _mis(log_ratio, valid, cfg, dtype)
        metrics.update(mis_metrics)
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
