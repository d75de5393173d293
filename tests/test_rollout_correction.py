"""Rollout correction (TIS / MIS, token and sequence levels) and the sampler-trainer gap metrics against the
independent float64 torch reference written from verl's formulas, and the corrected loss end to end.

Tolerance: float64 JAX vs float64 torch, values, weights, masks, metrics and gradients, atol 1e-9 (rtol 1e-9)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from spatial_jax.config import FieldError, apply_overrides
from spatial_jax.reference import losses_torch
from spatial_jax.reference import rollout_correction_torch as ref
from spatial_jax.rl import losses
from spatial_jax.rl.rollout_correction import CorrectionConfig, gap_metrics, rollout_correction

TOL = dict(rtol=1e-9, atol=1e-9)
TIS = ("off", "token", "sequence")
MIS = ("off", "token", "sequence", "geometric")


def make(seed, b=7, t=9, spread=0.4, extreme=False):
    """Random pi_old / pi_sampler log-probs: right-padded rows of varied length, one empty row, NaN and -inf in
    the padding; with `extreme`, some tokens 60 nats apart (beyond the +-20 clamp)."""
    rng = np.random.default_rng(seed)
    sampler = -rng.uniform(0.01, 5.0, (b, t))
    old = sampler + rng.normal(0.0, spread, (b, t))
    if extreme:
        old[0, 0] += 60.0
        old[3, 1] -= 60.0
    lengths = rng.integers(1, t + 1, b)
    lengths[2] = 0
    lengths[0] = max(lengths[0], 2)
    lengths[3] = max(lengths[3], 2)
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
    old[mask == 0] = np.nan
    sampler[mask == 0] = -np.inf
    return old, sampler, mask


def jax_correction(old, sampler, mask, cfg):
    with jax.enable_x64(True):
        w, m, metrics = rollout_correction(jnp.asarray(old), jnp.asarray(sampler), jnp.asarray(mask), cfg)
        return np.asarray(w), np.asarray(m), {k: float(v) for k, v in metrics.items()}


def check(old, sampler, mask, cfg):
    w, m, metrics = jax_correction(old, sampler, mask, cfg)
    tw, tm, tmetrics = ref.correction(old, sampler, mask, cfg.tis, cfg.tis_threshold, cfg.mis, cfg.mis_upper,
                                      cfg.mis_lower)
    np.testing.assert_allclose(w, tw.numpy(), **TOL)
    np.testing.assert_array_equal(m, tm.numpy())
    assert set(metrics) == set(tmetrics)
    for k in tmetrics:
        np.testing.assert_allclose(metrics[k], tmetrics[k], **TOL, err_msg=k)
    assert np.all(np.isfinite(w)) and np.all(w[mask == 0] == 0) and np.all(m[mask == 0] == 0)
    return w, m, metrics


@pytest.mark.parametrize("tis,mis", list(itertools.product(TIS, MIS)))
def test_correction_matches_the_reference(tis, mis):
    cfg = CorrectionConfig(tis=tis, tis_threshold=1.5, mis=mis, mis_upper=1.6, mis_lower=0.7)
    # the level's ratio must land on both sides of the bounds: a geometric mean averages the spread away
    spread = 0.8 if mis == "geometric" else 0.4 if "token" in (tis, mis) else 0.3
    for seed, extreme in ((TIS.index(tis) * 4 + MIS.index(mis), False), (99, True)):
        w, m, metrics = check(*make(seed, spread=spread, extreme=extreme), cfg)
        if tis != "off" and not extreme:
            assert 0 < metrics["tis_truncated_frac"] < 1 and w.max() == 1.5
        if mis != "off" and not extreme:
            assert 0 < metrics["mis_masked_frac"] < 1


def test_default_lower_bound_is_the_reciprocal():
    old, sampler, mask = make(5, spread=0.5)
    for level in ("token", "sequence", "geometric"):
        a = jax_correction(old, sampler, mask, CorrectionConfig(mis=level, mis_upper=1.8))
        b = jax_correction(old, sampler, mask, CorrectionConfig(mis=level, mis_upper=1.8, mis_lower=1 / 1.8))
        np.testing.assert_array_equal(a[1], b[1])
        check(old, sampler, mask, CorrectionConfig(mis=level, mis_upper=1.8))


def test_edge_cases_all_masked_and_extreme_ratios():
    old, sampler, mask = make(3)
    empty = np.zeros_like(mask)
    cfg = CorrectionConfig(tis="sequence", mis="token")
    w, m, metrics = check(old, sampler, empty, cfg)
    assert not w.any() and not m.any() and all(v == 0 for v in metrics.values())
    # +-60 nats: clamped to +-20 before exp (verl's bound), so weights stay finite and are truncated or masked
    w, m, metrics = check(*make(11, extreme=True), CorrectionConfig(tis="token", mis="token", mis_upper=1e12,
                                                                       mis_lower=1e-8))
    assert w[0, 0] == 2.0 and m[0, 0] == 1 and m[3, 1] == 0  # e^20 < 1e12 kept; e^-20 < 1e-8 rejected
    # a bit-identical sampler: every weight is 1, nothing truncated or masked
    w, m, metrics = check(old, old, mask, CorrectionConfig(tis="sequence", mis="geometric", mis_upper=1.0001))
    assert np.all(w[mask > 0] == 1.0) and np.array_equal(m, mask) and metrics["mis_masked_frac"] == 0


@pytest.mark.parametrize("extreme", [False, True])
def test_gap_metrics_match_the_reference(extreme):
    old, sampler, mask = make(21, spread=0.3, extreme=extreme)
    with jax.enable_x64(True):
        got = {k: float(v) for k, v in gap_metrics(jnp.asarray(old), jnp.asarray(sampler), jnp.asarray(mask)).items()}
        empty = gap_metrics(jnp.asarray(old), jnp.asarray(sampler), jnp.zeros(mask.shape))
    want = ref.gap(old, sampler, mask)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], **TOL, err_msg=k)
        assert np.isfinite(got[k])
    assert all(float(v) == 0 for v in empty.values())
    assert got["abs_max"] >= got["abs_mean"] > 0 and got["kl"] > 0


@pytest.mark.parametrize("tis,mis,kind", [("token", "off", "grpo"), ("sequence", "off", "gspo"),
                                          ("off", "token", "grpo"), ("token", "geometric", "gspo_token"),
                                          ("sequence", "sequence", "grpo")])
def test_corrected_loss_matches_the_reference(tis, mis, kind):
    """The whole corrected loss: weights on the policy-gradient terms, rejected tokens out of numerator and
    denominator (the normalizer is taken from the corrected mask), values and gradients."""
    cfg = CorrectionConfig(tis=tis, tis_threshold=1.5, mis=mis, mis_upper=1.6)
    loss_cfg = losses.LossConfig(kind=kind, kl_coef=0.05, clip_high=0.28, dual_clip=3.0)
    old, sampler, mask = make(7, spread=0.3)
    rng = np.random.default_rng(1)
    logp = np.where(mask > 0, np.nan_to_num(old, nan=0.0) + rng.normal(0, 0.2, old.shape), 0.0)
    ref_logp = np.where(mask > 0, logp + rng.normal(0, 0.3, old.shape), 0.0)
    adv = rng.normal(0, 1, old.shape[0])
    with jax.enable_x64(True):
        w, m, _ = rollout_correction(jnp.asarray(old), jnp.asarray(sampler), jnp.asarray(mask), cfg)

        def fn(lp):
            return losses.policy_loss(lp, jnp.asarray(old), jnp.asarray(adv), m, loss_cfg,
                                      ref_logp=jnp.asarray(ref_logp), is_weights=w)

        (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logp))
    tw, tm, _ = ref.correction(old, sampler, mask, tis, 1.5, mis, 1.6)
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    kwargs = {f: getattr(loss_cfg, f) for f in loss_cfg.__dataclass_fields__}
    tloss, tmetrics = losses_torch.policy_loss(lp, np.nan_to_num(old), adv, tm, **kwargs, ref_logp=ref_logp,
                                               is_weights=tw)
    tloss.backward()
    np.testing.assert_allclose(float(loss), float(tloss.detach()), **TOL)
    np.testing.assert_allclose(np.asarray(grad), lp.grad.numpy(), **TOL)
    for k in tmetrics:
        np.testing.assert_allclose(float(metrics[k]), tmetrics[k], **TOL, err_msg=k)
    # the correction changed the loss: without it the value differs
    with jax.enable_x64(True):
        plain, _ = losses.policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask),
                                      loss_cfg, ref_logp=jnp.asarray(ref_logp))
    assert abs(float(plain) - float(loss)) > 1e-6


def test_config_validation():
    for bad, match in ((dict(tis="seq"), "tis"), (dict(mis="tokens"), "mis"), (dict(tis_threshold=0.0), "tis_thr"),
                       (dict(mis_upper=2.0, mis_lower=3.0), "mis_lower"), (dict(mis_lower=-1.0), "mis_lower")):
        with pytest.raises(FieldError, match=match):
            CorrectionConfig(**bad)
    cfg = apply_overrides(CorrectionConfig(), ["tis=sequence", "mis_lower=0.5"])
    assert cfg.enabled and cfg.lower == 0.5 and CorrectionConfig(mis_upper=4.0).lower == 0.25
    assert not CorrectionConfig().enabled
