"""Rollout correction and the corrected policy loss held to verl 0.9.1's own functions: its
`compute_rollout_correction_and_rejection_mask` (rollout_corr_helper.py, what
`compute_rollout_correction_and_add_to_batch` calls in verl's trainer) and its registered policy losses,
`kl_penalty` and `agg_loss` (core_algos.py) composed as its actor's `ppo_loss` composes them (workers/utils/losses.py).

verl installs without its dependencies plus the few modules these two files import (docs/development.md: `pip install
-e ".[verl]" && pip install --no-deps verl==0.9.1`); where it is absent, as in CI, the module is skipped.
Tolerance: float64 on both sides, atol 1e-9 and rtol 1e-7 (verl divides its means by count + 1e-8); masks exact.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

verl_rc = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper", reason="verl 0.9.1 is not installed")
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
from test_rollout_correction import PINNED, jax_correction, one_row  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from spatial_jax.rl import losses  # noqa: E402
from spatial_jax.rl.rollout_correction import CorrectionConfig  # noqa: E402

TOL = dict(rtol=1e-7, atol=1e-9)
RS_OPTION = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
# each project figure and the verl figure it equals (rollout_corr/ prefix dropped); <option> is RS_OPTION's
FIGURES = {
    "tis_weight_mean": "rollout_is_mean",
    "tis_truncated_frac": "rollout_is_ratio_fraction_high",
    "mis_masked_frac": "rollout_rs_masked_fraction",
    "mis_seq_masked_frac": "rollout_rs_seq_masked_fraction",
    "mis_high_frac": "rollout_rs_<option>_fraction_high",
    "mis_low_frac": "rollout_rs_<option>_fraction_low",
}
# (lower, upper) of pi_sampler / pi_old: verl's default reciprocal pair, asymmetric pairs on either side of 1 and
# one entirely above it, and wide ones that only sums beyond +-20 nats reach
BOUNDS = [(None, 1.6), (0.7, 1.6), (0.5, 1.1), (1.05, 3.0), (1e-12, 1e12), (None, 1e9)]
THRESHOLDS = [0.8, 1.5, 2.0, 1e9]  # TIS's C: below 1, the usual, and above e^20


def make(seed, b=8, t=24, spread=0.5, extreme=True, empty_row=False):
    """Random pi_old / pi_sampler log-probs, right-padded rows of varied length (finite padding: verl reads it).
    With `extreme`, one token 30 nats off each way and a row whose tokens are each below 20 nats but sum beyond."""
    rng = np.random.default_rng(seed)
    sampler = -rng.uniform(0.01, 5.0, (b, t))
    old = sampler + rng.normal(0.0, spread, (b, t))
    lengths = rng.integers(1, t + 1, b)
    if extreme:
        old[0, 0] += 30.0
        old[1, 0] -= 30.0
        lengths[2] = t
        old[2] = sampler[2] + rng.uniform(1.0, 2.0, t) * (1 if seed % 2 else -1)
        lengths[:2] = np.maximum(lengths[:2], 2)
    if empty_row:
        lengths[3] = 0
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
    return old, sampler, mask


def verls(old, sampler, mask, cfg):
    """verl's weights (1 where TIS is off), modified response mask and metrics for the same settings."""
    rs_threshold = None
    if cfg.mis != "off":
        rs_threshold = f"{cfg.lower!r}_{cfg.mis_upper!r}"
    proto, m, metrics = verl_rc.compute_rollout_correction_and_rejection_mask(
        torch.tensor(old), torch.tensor(sampler), torch.tensor(mask),
        rollout_is=None if cfg.tis == "off" else cfg.tis, rollout_is_threshold=cfg.tis_threshold,
        rollout_rs=RS_OPTION.get(cfg.mis), rollout_rs_threshold=rs_threshold)
    w = mask if proto is None else proto.batch["rollout_is_weights"].numpy()
    return w, m.numpy(), {k.removeprefix("rollout_corr/"): v for k, v in metrics.items()}


def verl_figure(name, cfg):
    return FIGURES[name].replace("<option>", RS_OPTION.get(cfg.mis, ""))


def compare(old, sampler, mask, cfg):
    w, m, metrics = jax_correction(old, sampler, mask, cfg)
    vw, vm, vmetrics = verls(old, sampler, mask, cfg)
    np.testing.assert_allclose(w, vw, **TOL)
    np.testing.assert_array_equal(m, vm)
    for name, value in metrics.items():
        np.testing.assert_allclose(value, vmetrics[verl_figure(name, cfg)], **TOL, err_msg=name)
    return w, m, metrics


CASES = [(tis, c, mis, lo, up) for tis, c in itertools.product(("off", "token", "sequence"), THRESHOLDS)
         for mis, (lo, up) in itertools.product(("off", "token", "sequence", "geometric"), BOUNDS)
         if tis != "off" or mis != "off"]


@pytest.mark.parametrize("tis,threshold,mis,lower,upper", CASES)
def test_correction_equals_verls(tis, threshold, mis, lower, upper):
    cfg = CorrectionConfig(tis=tis, tis_threshold=threshold, mis=mis, mis_lower=lower, mis_upper=upper)
    seen = {"truncated": False, "kept": False, "rejected": False}
    for seed in range(4):
        w, m, _ = compare(*make(seed, spread=0.8 if mis == "geometric" else 0.5), cfg)
        seen["truncated"] |= bool(np.any(w == threshold))
        seen["kept"] |= bool(np.any(m))
        seen["rejected"] |= bool(np.any(m != make(seed)[2]))
    # the cases cross what they name: the usual thresholds truncate some weight, the usual bounds keep and reject
    if tis != "off" and threshold in (1.5, 2.0):
        assert seen["truncated"]
    if mis != "off" and (lower, upper) in ((None, 1.6), (0.7, 1.6), (0.5, 1.1)):
        assert seen["kept"] and seen["rejected"]


@pytest.mark.parametrize("name,log_ratios,kwargs,kept,figures", PINNED, ids=[p[0] for p in PINNED])
def test_the_pinned_cases_are_verls(name, log_ratios, kwargs, kept, figures):
    cfg = CorrectionConfig(**kwargs)
    _, vm, vmetrics = verls(*one_row(log_ratios), cfg)
    np.testing.assert_array_equal(vm[0], kept)
    for k, v in figures.items():
        assert vmetrics[verl_figure(k, cfg)] == pytest.approx(v, rel=1e-7), k


def test_the_pinned_tis_figures_are_verls():
    _, _, vmetrics = verls(*one_row([1.0]), CorrectionConfig(tis="token"))
    assert vmetrics["rollout_is_mean"] == pytest.approx(2.0, rel=1e-7)
    assert vmetrics["rollout_is_ratio_fraction_high"] == pytest.approx(1.0, rel=1e-7)
    _, _, vmetrics = verls(*one_row([12.5, 12.5]), CorrectionConfig(tis="sequence", tis_threshold=1e9))
    assert vmetrics["rollout_is_ratio_fraction_high"] == 1.0


def test_the_stated_difference_shares_over_sequences_holding_a_token():
    """SPEC §10: verl divides its batch-wide sequence shares by every row, empty rows included; the project by the
    rows holding a token. Every other figure, the weights and the mask stay equal."""
    old, sampler, mask = make(5, empty_row=True)
    rows, with_tokens = mask.shape[0], int(np.any(mask > 0, axis=1).sum())
    cfg = CorrectionConfig(tis="sequence", tis_threshold=1.5, mis="token", mis_upper=1.6, mis_lower=0.7)
    w, m, metrics = jax_correction(old, sampler, mask, cfg)
    vw, vm, vmetrics = verls(old, sampler, mask, cfg)
    np.testing.assert_allclose(w, vw, **TOL)
    np.testing.assert_array_equal(m, vm)
    for name in ("tis_truncated_frac", "mis_seq_masked_frac"):
        assert metrics[name] > 0
        np.testing.assert_allclose(metrics[name] * with_tokens / rows, vmetrics[verl_figure(name, cfg)], **TOL)
    for name in ("tis_weight_mean", "mis_masked_frac", "mis_high_frac", "mis_low_frac"):
        np.testing.assert_allclose(metrics[name], vmetrics[verl_figure(name, cfg)], **TOL, err_msg=name)


AGG = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
       "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}


def verl_loss(logp, old, adv, mask, weights, ref, entropy, cfg: losses.LossConfig):
    """verl's ppo_loss on padded tensors: its registered policy loss with the rollout-correction weights, minus the
    entropy coefficient times the aggregated entropy, plus the KL coefficient times the aggregated kl_penalty."""
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=cfg.clip_low,
                         clip_ratio_low=cfg.clip_low, clip_ratio_high=cfg.clip_high,
                         clip_ratio_c=cfg.dual_clip if cfg.dual_clip is not None else 1e300,
                         loss_agg_mode=AGG[cfg.aggregation])
    if cfg.aggregation == "seq_mean_token_sum_norm":  # Dr. GRPO: every row, times the longest completion allowed
        config.global_batch_info.update(global_batch_size=mask.shape[0], loss_scale_factor=cfg.max_completion_length)
    mask_t = torch.tensor(mask).bool()
    adv_t = torch.tensor(adv)[:, None].expand(mask.shape)
    fn = core_algos.get_policy_loss_fn("vanilla" if cfg.kind == "grpo" else "gspo")
    pg, _ = fn(old_log_prob=torch.tensor(old), log_prob=logp, advantages=adv_t, response_mask=mask_t,
               loss_agg_mode=AGG[cfg.aggregation], config=config, rollout_is_weights=torch.tensor(weights))
    agg = dict(loss_mask=mask_t, loss_agg_mode=AGG[cfg.aggregation], **config.global_batch_info)
    kl = core_algos.kl_penalty(logp, torch.tensor(ref), {"k1": "k1", "k2": "k2", "k3": "low_var_kl"}[cfg.kl_estimator])
    return pg - cfg.entropy_coef * core_algos.agg_loss(torch.tensor(entropy), **agg) \
        + cfg.kl_coef * core_algos.agg_loss(kl, **agg)


LOSSES = [("grpo", "token_mean", 3.0), ("grpo", "seq_mean_token_mean", None), ("grpo", "seq_mean_token_sum_norm", 3.0),
          ("gspo_token", "token_mean", None), ("gspo_token", "seq_mean_token_mean", None),
          ("gspo_token", "seq_mean_token_sum_norm", None), ("gspo", "seq_mean_token_mean", None)]
CORRECTIONS = [("token", "off"), ("sequence", "token"), ("token", "geometric"), ("off", "sequence")]


@pytest.mark.parametrize("kind,aggregation,dual_clip,tis,mis",
                         [loss + corr for loss, corr in itertools.product(LOSSES, CORRECTIONS)
                          if not (loss[0] == "gspo" and corr[0] == "token")])
def test_corrected_loss_and_gradient_equal_verls(kind, aggregation, dual_clip, tis, mis):
    """The project's weights and rejection mask into the project's loss, against verl's weights and mask into verl's
    loss: value and gradient. verl's "gspo" is the token variant (s_it); the sequence-level "gspo" gives the same
    gradient under seq-mean-token-mean only, where it is compared."""
    old, sampler, mask = make(17, extreme=False, spread=0.3)
    lower, upper = {"token": (0.7, 1.6), "geometric": (None, 1.05)}.get(mis, (None, 1.6))
    ccfg = CorrectionConfig(tis=tis, tis_threshold=1.5, mis=mis, mis_upper=upper, mis_lower=lower)
    lcfg = losses.LossConfig(kind=kind, aggregation=aggregation, dual_clip=dual_clip, clip_low=0.2, clip_high=0.28,
                             kl_coef=0.05, entropy_coef=0.01, max_completion_length=32)
    rng = np.random.default_rng(2)
    logp = old + rng.normal(0.0, 0.3, old.shape)
    ref = logp + rng.normal(0.0, 0.3, old.shape)
    entropy = rng.uniform(0.0, 2.0, old.shape)
    adv = rng.normal(0.0, 1.0, old.shape[0])
    w, m, _ = jax_correction(old, sampler, mask, ccfg)
    vw, vm, _ = verls(old, sampler, mask, ccfg)
    assert np.any(m != mask) or mis == "off"
    with jax.enable_x64(True):
        def fn(lp):
            return losses.policy_loss(lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(m), lcfg,
                                      ref_logp=jnp.asarray(ref), entropy=jnp.asarray(entropy),
                                      is_weights=jnp.asarray(w))[0]

        loss, grad = jax.value_and_grad(fn)(jnp.asarray(logp))
    lp = torch.tensor(logp, requires_grad=True)
    vloss = verl_loss(lp, old, adv, vm, vw, ref, entropy, lcfg)
    vloss.backward()
    np.testing.assert_allclose(float(loss), float(vloss.detach()), **TOL)
    np.testing.assert_allclose(np.asarray(grad), lp.grad.numpy(), **TOL)
