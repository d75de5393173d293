"""Policy-gradient losses (GRPO, GSPO, GSPO-token) with KL to a reference policy, and the SFT loss (SPEC §6).

Pure, jittable functions: arrays in, a scalar loss and a dict of scalar metrics out. Every input is [B, T]
(rollouts x completion positions) except the per-rollout advantages [B]. The mask is 1 on tokens the policy
generated and 0 on padding, prompt and tool output, which therefore neither carry loss nor gradient.
A row whose mask is all zero (e.g. an overlong-filtered rollout) contributes 0 to the loss and to every metric.
Values at masked positions (and the advantage of an empty row) are never read, so they may hold anything,
even -inf or NaN.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from spatial_jax.config import check_at_least, check_non_negative, check_positive, check_range, require

LossKind = Literal["grpo", "gspo", "gspo_token"]
KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]

Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Policy loss settings; defaults are SPEC §6 and SpatialCORE's run (Table 4).

    kind: "grpo" token-level ratio; "gspo" sequence-level ratio s_i; "gspo_token" s_it = sg(s_i) exp(logp - sg(logp)).
    clip_low / clip_high: ratio clipped to [1 - clip_low, 1 + clip_high] (clip-higher when clip_high > clip_low).
    dual_clip: c > 1 caps the loss of a negative-advantage token at c * |A| (None: off).
    kl_coef, kl_estimator: beta and the estimator of KL(pi_theta || pi_ref) added per token.
    aggregation: "token_mean" (DAPO), "seq_mean_token_mean" (original GRPO), "seq_mean_token_sum_norm" (Dr. GRPO,
      sum over tokens / (B * max_completion_length)).
    entropy_coef: weight of the entropy bonus (subtracted from the loss).

    Numerical guards (SPEC §6), all of them:
    log_ratio_clamp (20): each token's log-ratio logp - old_logp is clamped to [-20, 20] before anything uses it
      (the GRPO ratio, GSPO's mean log s_i, the approx_kl_old metric).
    gspo_log_ratio_cap (10): GSPO's log s_i is capped above at 10; GSPO-token's combined
      log s_it = sg(log s_i) + logp - sg(logp) is capped as a whole, as verl does, so a token whose sequence is more
      than e^10 off-policy carries no gradient (only the value e^10 |A|).
    k3_log_ratio_clamp (20), k3_clamp (10): k3's inner -l_ref is clamped to [-20, 20] and its output to [-10, 10].
    dual_clip (off by default): a negative-advantage token's loss is capped at c |A|.
    No eps anywhere: every mean divides by max(count, 1), and masked positions are zeroed before use, so an empty
    row or batch gives 0, never NaN.
    """

    kind: LossKind = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    kl_coef: float = 0.01
    kl_estimator: KLEstimator = "k3"
    aggregation: Aggregation = "token_mean"
    max_completion_length: int = 3072
    entropy_coef: float = 0.0
    log_ratio_clamp: float = 20.0
    gspo_log_ratio_cap: float = 10.0
    k3_log_ratio_clamp: float = 20.0
    k3_clamp: float = 10.0

    def __post_init__(self) -> None:
        require("kind", self.kind, self.kind in ("grpo", "gspo", "gspo_token"), "be 'grpo', 'gspo' or 'gspo_token'")
        require("kl_estimator", self.kl_estimator, self.kl_estimator in ("k1", "k2", "k3"), "be 'k1', 'k2' or 'k3'")
        require("aggregation", self.aggregation,
                self.aggregation in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"),
                "be 'token_mean', 'seq_mean_token_mean' or 'seq_mean_token_sum_norm'")
        check_range(self, "clip_low", 0.0, 1.0, high_open=True)
        check_non_negative(self, "clip_high", "kl_coef", "entropy_coef")
        if self.dual_clip is not None:
            check_range(self, "dual_clip", 1.0, low_open=True)
        check_at_least(self, max_completion_length=1)
        check_positive(self, "log_ratio_clamp", "gspo_log_ratio_cap", "k3_log_ratio_clamp", "k3_clamp")


def _float_dtype(x: jax.Array) -> jnp.dtype:
    # Losses are computed in at least float32 even for bf16 log-probs.
    return jnp.promote_types(x.dtype, jnp.float32)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of x over positions where mask > 0; 0 when the mask is empty."""
    valid = mask > 0
    total = jnp.sum(jnp.where(valid, x, 0))
    return total / jnp.maximum(jnp.sum(valid), 1)


def loss_denominator(mask: jax.Array, mode: Aggregation) -> jax.Array:
    """The denominator `aggregate` uses for this mask (Dr. GRPO's max_completion_length factor excluded):
    token_mean -> number of valid tokens; seq_mean_token_mean -> rows with a token; seq_mean_token_sum_norm -> rows.

    For k micro-batches accumulated by optax.MultiSteps (which averages their gradients), pass
    normalizer = loss_denominator(full_batch_mask, mode) / k to each micro-batch's policy_loss, so that the
    accumulated update equals the one of the whole batch at once.
    """
    valid = mask > 0
    if mode == "token_mean":
        return jnp.sum(valid).astype(jnp.float32)
    if mode == "seq_mean_token_mean":
        return jnp.sum(jnp.any(valid, axis=-1)).astype(jnp.float32)
    if mode == "seq_mean_token_sum_norm":
        return jnp.asarray(mask.shape[0], jnp.float32)
    raise ValueError(f"unknown aggregation {mode!r}")


def aggregate(
    token_loss: jax.Array,
    mask: jax.Array,
    mode: Aggregation,
    max_completion_length: int,
    normalizer: jax.Array | float | None = None,
) -> jax.Array:
    """Reduces a per-token loss [B, T] to a scalar (SPEC §6 aggregations).

    token_mean: sum over all valid tokens / their number (DAPO).
    seq_mean_token_mean: mean over rows of each row's token mean; rows without tokens are left out of the mean.
    seq_mean_token_sum_norm: sum over all valid tokens / (B * max_completion_length) (Dr. GRPO).
    normalizer: replaces the denominator loss_denominator(mask, mode) (see there); None uses this batch's own.
    """
    valid = mask > 0
    row_sum = jnp.sum(jnp.where(valid, token_loss, 0), axis=-1)
    if normalizer is None:
        denominator = jnp.maximum(loss_denominator(mask, mode), 1.0)
    else:
        denominator = jnp.asarray(normalizer, token_loss.dtype)
        denominator = jnp.where(denominator > 0, denominator, 1.0)  # an empty full batch: every sum is 0 too
    if mode == "token_mean":
        return jnp.sum(row_sum) / denominator
    if mode == "seq_mean_token_mean":
        row_mean = row_sum / jnp.maximum(jnp.sum(valid, axis=-1), 1)
        return jnp.sum(row_mean) / denominator
    if mode == "seq_mean_token_sum_norm":
        return jnp.sum(row_sum) / (denominator * max_completion_length)
    raise ValueError(f"unknown aggregation {mode!r}")


def kl_penalty(
    logp: jax.Array,
    ref_logp: jax.Array,
    estimator: KLEstimator,
    k3_log_ratio_clamp: float = 20.0,
    k3_clamp: float = 10.0,
) -> jax.Array:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta, l_ref = logp - ref_logp (SPEC §6).

    k1 = l_ref; k2 = l_ref^2 / 2; k3 = exp(-l_ref) + l_ref - 1 with -l_ref clamped to +-k3_log_ratio_clamp
    and the result to +-k3_clamp.
    """
    l_ref = logp - ref_logp
    if estimator == "k1":
        return l_ref
    if estimator == "k2":
        return 0.5 * jnp.square(l_ref)
    if estimator == "k3":
        inner = jnp.clip(-l_ref, -k3_log_ratio_clamp, k3_log_ratio_clamp)
        return jnp.clip(jnp.exp(inner) - inner - 1.0, -k3_clamp, k3_clamp)
    raise ValueError(f"unknown KL estimator {estimator!r}")


def _check_shapes(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array, **extra) -> None:
    if logp.ndim != 2:
        raise ValueError(f"logp must be [B, T], got shape {logp.shape}")
    for name, arr in (("old_logp", old_logp), ("mask", mask), *extra.items()):
        if arr is not None and arr.shape != logp.shape:
            raise ValueError(f"{name} has shape {arr.shape}, expected {logp.shape} like logp")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [B] = {logp.shape[:1]}, got {advantages.shape}")


def _log_ratio(logp: jax.Array, old_logp: jax.Array, mask: jax.Array, cfg: LossConfig) -> jax.Array:
    """log of the importance ratio per token, by kind; 0 at masked positions."""
    token = jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    if cfg.kind == "grpo":
        return token
    count = jnp.sum(mask, axis=-1)
    log_s = jnp.sum(token * mask, axis=-1) / jnp.maximum(count, 1)  # GSPO: log s_i = mean_t l_it
    if cfg.kind == "gspo":
        log_s = jnp.minimum(log_s, cfg.gspo_log_ratio_cap)
        return jnp.broadcast_to(log_s[:, None], logp.shape)
    # GSPO-token: log s_it = (logp - sg(logp)) + sg(log s_i), whose value is exactly log s_i. The cap applies to
    # it as a whole (SPEC 6, as verl), so a token beyond it carries no gradient; `where` passes the gradient up to
    # and at the cap, as torch.clamp does.
    sg = jax.lax.stop_gradient
    combined = (logp - sg(logp)) + sg(log_s)[:, None]
    return jnp.where(combined > cfg.gspo_log_ratio_cap, cfg.gspo_log_ratio_cap, combined)


def policy_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    cfg: LossConfig,
    ref_logp: jax.Array | None = None,
    entropy: jax.Array | None = None,
    normalizer: jax.Array | float | None = None,
    is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
    """Clipped policy-gradient loss (SPEC §6) and its metrics.

    Args:
      logp: [B, T] log pi_theta of the sampled tokens (at the rollout temperature); gradients flow through it.
      old_logp: [B, T] log pi_old from the sampler at rollout time (treated as a constant).
      advantages: [B] one advantage per rollout.
      mask: [B, T] 1 (or True) on completion tokens the policy generated, 0 elsewhere.
      cfg: LossConfig.
      ref_logp: [B, T] log pi_ref (required when cfg.kl_coef > 0; if given with kl_coef == 0 it is only measured).
      entropy: [B, T] per-token entropy of pi_theta (required when cfg.entropy_coef > 0; else only measured).
      normalizer: denominator of the aggregation for micro-batching (see loss_denominator); None: this batch's.
      is_weights: [B, T] rollout-correction weights (rl/rollout_correction.py, TIS) multiplying each token's
        policy-gradient term after the clips, as verl applies them (not the KL or entropy terms); constant.

    Returns:
      (loss, metrics). metrics (all scalars, stop-gradient) are: loss, pg_loss, ratio_mean, ratio_max, the ratio's
      spread ratio_dev_max (max |ratio - 1|) and ratio_std (its standard deviation over tokens), clip_frac
      (= clip_frac_low + clip_frac_high: share of tokens whose clipped term is active, i.e. ratio
      < 1 - clip_low with A < 0, or ratio > 1 + clip_high with A > 0), approx_kl_old (k3 estimate of
      KL(pi_old || pi_theta)), num_tokens, num_seqs (rows with at least one token); plus dual_clip_frac when
      cfg.dual_clip is set, kl_ref when ref_logp is given and entropy when entropy is given. Fractions and
      means are over completion tokens (for GSPO each token carries its sequence's ratio).
    """
    _check_shapes(logp, old_logp, advantages, mask, ref_logp=ref_logp, entropy=entropy, is_weights=is_weights)
    if cfg.kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp (or set kl_coef = 0)")
    if cfg.entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs entropy (or set entropy_coef = 0)")
    dtype = _float_dtype(logp)
    valid = mask > 0
    m = valid.astype(dtype)
    # Zero out masked positions first so garbage there cannot produce NaN in values or gradients.
    logp = jnp.where(valid, logp.astype(dtype), 0.0)
    old_logp = jnp.where(valid, jax.lax.stop_gradient(old_logp).astype(dtype), 0.0)
    has_tokens = jnp.any(valid, axis=-1)
    adv = jnp.where(has_tokens, jax.lax.stop_gradient(advantages).astype(dtype), 0.0)[:, None]

    ratio = jnp.exp(_log_ratio(logp, old_logp, m, cfg))
    low, high = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    # Token loss -min(r A, clip(r) A) (GRPO; GSPO with r = s_i or s_it).
    unclipped = -ratio * adv
    clipped = -jnp.clip(ratio, low, high) * adv
    pg = jnp.maximum(unclipped, clipped)
    sg = jax.lax.stop_gradient
    metrics: Metrics = {}
    if cfg.dual_clip is not None:
        # Dual clip: a negative-advantage token never costs more than c * |A|.
        cap = -cfg.dual_clip * adv
        dual_active = (adv < 0) & (pg > cap)
        pg = jnp.where(adv < 0, jnp.minimum(pg, cap), pg)
        metrics["dual_clip_frac"] = masked_mean(dual_active.astype(dtype), m)
    if is_weights is not None:
        pg = pg * jnp.where(valid, jax.lax.stop_gradient(is_weights).astype(dtype), 0.0)

    token_loss = pg
    if ref_logp is not None:
        ref = jnp.where(valid, jax.lax.stop_gradient(ref_logp).astype(dtype), 0.0)
        kl = kl_penalty(logp, ref, cfg.kl_estimator, cfg.k3_log_ratio_clamp, cfg.k3_clamp)
        if cfg.kl_coef > 0:
            token_loss = token_loss + cfg.kl_coef * kl
        metrics["kl_ref"] = masked_mean(sg(kl), m)
    if entropy is not None:
        ent = jnp.where(valid, entropy.astype(dtype), 0.0)
        if cfg.entropy_coef > 0:
            token_loss = token_loss - cfg.entropy_coef * ent
        metrics["entropy"] = masked_mean(sg(ent), m)

    loss = aggregate(token_loss, m, cfg.aggregation, cfg.max_completion_length, normalizer)

    r = sg(ratio)
    clip_low_active = ((r < low) & (adv < 0)).astype(dtype)
    clip_high_active = ((r > high) & (adv > 0)).astype(dtype)
    token_log_ratio = sg(jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
    metrics.update(
        loss=sg(loss),
        pg_loss=sg(aggregate(pg, m, cfg.aggregation, cfg.max_completion_length, normalizer)),
        ratio_mean=masked_mean(r, m),
        ratio_max=jnp.max(jnp.where(valid, r, 0.0)),
        ratio_dev_max=jnp.max(jnp.where(valid, jnp.abs(r - 1.0), 0.0)),
        ratio_std=jnp.sqrt(masked_mean(jnp.square(r - masked_mean(r, m)), m)),
        clip_frac_low=masked_mean(clip_low_active, m),
        clip_frac_high=masked_mean(clip_high_active, m),
        clip_frac=masked_mean(clip_low_active + clip_high_active, m),
        approx_kl_old=masked_mean(jnp.expm1(token_log_ratio) - token_log_ratio, m),
        num_tokens=jnp.sum(m),
        num_seqs=jnp.sum(has_tokens).astype(dtype),
    )
    return loss, metrics


def token_logprobs(logits: jax.Array, targets: jax.Array, temperature: float = 1.0) -> jax.Array:
    """log softmax(logits / temperature) at the target ids: logits [B, T, V], targets [B, T] -> [B, T] (float32+)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {logits.shape} and targets {targets.shape} disagree on [B, T]")
    scaled = logits.astype(_float_dtype(logits)) / temperature
    logz = jax.nn.logsumexp(scaled, axis=-1)
    picked = jnp.take_along_axis(scaled, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - logz


def sft_loss(target_logp: jax.Array, mask: jax.Array) -> tuple[jax.Array, Metrics]:
    """Completion-only cross-entropy: mean of -log p(target) over tokens with mask > 0 (prompt masked out).

    target_logp: [B, T] log-probabilities of the target tokens (e.g. from token_logprobs); mask: [B, T].
    Returns (loss, {"loss", "num_tokens"}); an empty mask gives loss 0.
    """
    if target_logp.shape != mask.shape:
        raise ValueError(f"target_logp {target_logp.shape} and mask {mask.shape} must have the same shape")
    valid = mask > 0
    nll = -jnp.where(valid, target_logp.astype(_float_dtype(target_logp)), 0.0)
    loss = masked_mean(nll, valid)
    return loss, {"loss": jax.lax.stop_gradient(loss), "num_tokens": jnp.sum(valid).astype(nll.dtype)}
