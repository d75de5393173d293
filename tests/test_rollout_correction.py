"""Rollout correction (TIS / MIS, token and sequence levels) and the sampler-trainer gap metrics against the
independent float64 torch reference written from verl 0.9.1's rollout_corr_helper, cases pinned from verl 0.9.1's
own functions, and the corrected loss end to end (verl's own functions themselves: test_rollout_correction_verl.py).

Tolerance: float64 JAX vs float64 torch, values, weights, masks, metrics and gradients, atol 1e-9 (rtol 1e-9)."""

import itertools
import math

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
    # +-60 nats: clamped to +-20 before exp (verl's bound), so weights stay finite and are truncated or masked.
    # The bounds limit pi_sampler / pi_old (verl's k1 statistic): token [0, 0] has pi_sampler / pi_old = e^-20
    # < 1e-8, rejected; token [3, 1] has e^20 < 1e12, kept
    w, m, metrics = check(*make(11, extreme=True), CorrectionConfig(tis="token", mis="token", mis_upper=1e12,
                                                                       mis_lower=1e-8))
    assert w[0, 0] == 2.0 and m[0, 0] == 0 and m[3, 1] == 1
    # a bit-identical sampler: every weight is 1, nothing truncated or masked
    w, m, metrics = check(old, old, mask, CorrectionConfig(tis="sequence", mis="geometric", mis_upper=1.0001))
    assert np.all(w[mask > 0] == 1.0) and np.array_equal(m, mask) and metrics["mis_masked_frac"] == 0


def one_row(log_ratios):
    """One sequence whose tokens have exactly these log(pi_old / pi_sampler) (a log-prob of 0 on the sampler's side)."""
    d = np.asarray([log_ratios], np.float64)
    return d, np.zeros_like(d), np.ones_like(d)


# Each case's expectation is what verl 0.9.1's compute_rollout_correction_and_rejection_mask gives for it
# (checked by test_rollout_correction_verl.py::test_the_pinned_cases_are_verls wherever verl is installed).
PINNED = [
    # an asymmetric pair bounds pi_sampler / pi_old: log(pi_old / pi_sampler) = 0.4 is a ratio e^-0.4 = 0.67 < 0.7
    ("asymmetric bounds", [0.4], dict(mis="token", mis_lower=0.7, mis_upper=1.6), [0.0], {"mis_low_frac": 1.0}),
    ("asymmetric bounds, the other side", [-0.4], dict(mis="token", mis_lower=0.7, mis_upper=1.6), [1.0],
     {"mis_low_frac": 0.0, "mis_high_frac": 0.0}),
    # each token clamped to +-20 before the sum: [25, -24] sums to 0, inside [1/2, 2]
    ("clamp before the sum", [25.0, -24.0], dict(mis="sequence", mis_upper=2.0), [1.0, 1.0],
     {"mis_seq_masked_frac": 0.0}),
    # twenty tokens of 1.5, none beyond 20: the statistic's sum -30 lies below log(1e-12) = -27.6
    ("sum beyond the bound", [1.5] * 20, dict(mis="sequence", mis_upper=1e12), [0.0] * 20,
     {"mis_low_frac": 1.0, "mis_masked_frac": 1.0}),
    # [30, 0] averages to 10 once clamped (kept: e^-10 > 1e-5), to 15 unclamped (rejected)
    ("geometric: the clamped tokens' mean", [30.0, 0.0], dict(mis="geometric", mis_upper=1e5), [1.0, 1.0],
     {"mis_masked_frac": 0.0}),
]


@pytest.mark.parametrize("name,log_ratios,kwargs,kept,figures", PINNED, ids=[p[0] for p in PINNED])
def test_rejection_pinned_from_verl(name, log_ratios, kwargs, kept, figures):
    _, m, metrics = check(*one_row(log_ratios), CorrectionConfig(**kwargs))
    np.testing.assert_array_equal(m[0], kept)
    for k, v in figures.items():
        assert metrics[k] == v, k


def test_tis_figures_pinned_from_verl():
    # rollout_is_mean is the mean of the truncated weights: one token of ratio e, C = 2 -> 2, not e
    w, _, metrics = check(*one_row([1.0]), CorrectionConfig(tis="token", tis_threshold=2.0))
    assert w[0, 0] == 2.0 and metrics["tis_weight_mean"] == 2.0 and metrics["tis_truncated_frac"] == 1.0
    # the sequence's high fraction compares the unclamped log-sum with log C: 25 > log(1e9) = 20.7, although the
    # weight itself is e^20 < C
    w, _, metrics = check(*one_row([12.5, 12.5]), CorrectionConfig(tis="sequence", tis_threshold=1e9))
    np.testing.assert_allclose(w[0], [np.exp(20.0)] * 2, rtol=1e-12)
    assert metrics["tis_truncated_frac"] == 1.0
    np.testing.assert_allclose(metrics["tis_weight_mean"], np.exp(20.0), rtol=1e-12)


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
    """Every refusal in full, as the user reads it under rl.correction."""
    for bad, message in (
            (dict(tis="seq"), "tis must be 'off', 'token' or 'sequence', got 'seq'"),
            (dict(mis="tokens"), "mis must be 'off', 'token', 'sequence' or 'geometric', got 'tokens'"),
            (dict(tis_threshold=0.0), "tis_threshold must be > 0, got 0.0"),
            (dict(mis_upper=0.0), "mis_upper must be > 0, got 0.0"),
            (dict(mis_upper=2.0, mis_lower=3.0), "mis_lower must be at most mis_upper=2.0, got 3.0"),
            (dict(mis_lower=-1.0), "mis_lower must be > 0, got -1.0"),
            (dict(mis="token", mis_upper=0.5),
             "mis_upper must be at least 1 while mis_lower is unset (the kept interval [1/mis_upper, mis_upper] = "
             "[2, 0.5] would be empty; set mis_lower too), got 0.5")):
        with pytest.raises(FieldError) as e:
            CorrectionConfig(**bad)
        assert str(e.value) == message
    cfg = apply_overrides(CorrectionConfig(), ["tis=sequence", "mis_lower=0.5"])
    assert cfg.enabled and cfg.lower == 0.5 and CorrectionConfig(mis_upper=4.0).lower == 0.25
    assert not CorrectionConfig().enabled
    # one bound below 1 is a valid pair once the lower bound is given; equal bounds keep one ratio, as verl allows
    assert CorrectionConfig(mis_upper=0.5, mis_lower=0.25).lower == 0.25 and CorrectionConfig(mis_upper=1.0).lower == 1
    assert CorrectionConfig(mis_upper=1.5, mis_lower=1.5).lower == 1.5


def test_bounds_are_inclusive_as_verls():
    """A statistic exactly on a bound is kept and not counted above or below it (verl: lower <= s <= upper; the
    high and low shares are strict); a weight exactly at C is not truncated (verl: raw > C)."""
    for log_ratio, kwargs in (([-math.log(1.6)], dict(mis="token", mis_lower=0.7, mis_upper=1.6)),
                              ([-math.log(0.7)], dict(mis="token", mis_lower=0.7, mis_upper=1.6)),
                              ([-math.log(1.6) / 2] * 2, dict(mis="geometric", mis_lower=0.7, mis_upper=1.6))):
        _, m, metrics = check(*one_row(log_ratio), CorrectionConfig(**kwargs))
        assert m.all() and metrics["mis_high_frac"] == metrics["mis_low_frac"] == metrics["mis_masked_frac"] == 0
    for level in ("token", "sequence"):
        w, _, metrics = check(*one_row([0.0, 0.0]), CorrectionConfig(tis=level, tis_threshold=1.0))
        assert w.tolist() == [[1.0, 1.0]] and metrics["tis_truncated_frac"] == 0


@pytest.mark.parametrize("x64", [False, True])
def test_dtypes_follow_the_inputs(x64):
    """float32 or bfloat16 log-probs give float32 weights and figures (also with x64 on, where a default dtype would
    be float64), and the returned mask keeps the input mask's dtype."""
    old, sampler, mask = make(4)
    cfg = CorrectionConfig(tis="sequence", mis="token", mis_upper=1.6)
    with jax.enable_x64(x64):
        for logp_dtype in (jnp.float32, jnp.bfloat16):
            for mask_dtype in (jnp.int32, jnp.float32, jnp.bool_):
                args = (jnp.asarray(np.nan_to_num(old, neginf=-30.0), logp_dtype),
                        jnp.asarray(np.nan_to_num(sampler, neginf=-30.0), logp_dtype),
                        jnp.asarray(mask, mask_dtype))
                w, m, metrics = rollout_correction(*args, cfg)
                assert w.dtype == jnp.float32 and m.dtype == mask_dtype
                assert {v.dtype for v in metrics.values()} == {jnp.dtype(jnp.float32)}
                assert {v.dtype for v in gap_metrics(*args).values()} == {jnp.dtype(jnp.float32)}
                _, m_off, metrics_off = rollout_correction(*args, CorrectionConfig(tis="token"))
                assert m_off.dtype == mask_dtype and metrics_off["tis_truncated_frac"].dtype == jnp.float32
                w_off, _, _ = rollout_correction(*args, CorrectionConfig(mis="sequence"))
                assert w_off.dtype == jnp.float32


def test_shapes_are_checked():
    one_d = jnp.zeros(5)
    with pytest.raises(ValueError) as e:
        rollout_correction(one_d, one_d, one_d, CorrectionConfig(tis="token"))
    assert str(e.value) == "old_logp (5,), sampler_logp (5,) and mask (5,) must be one [B, T] shape"
    with pytest.raises(ValueError, match=r"old_logp \(2, 3\), sampler_logp \(2, 4\) and mask \(2, 3\)"):
        rollout_correction(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.zeros((2, 3)), CorrectionConfig(tis="token"))


def test_gap_metrics_of_one_sequence_and_of_no_rows():
    """One sequence: its own sum is the mean, so the spread is 0 and the max |sum| is its own; a batch of no rows
    gives 0 for every figure."""
    old, sampler, mask = one_row([0.5, -0.25, 1.0])
    with jax.enable_x64(True):
        got = {k: float(v) for k, v in gap_metrics(jnp.asarray(old), jnp.asarray(sampler), jnp.asarray(mask)).items()}
        none = gap_metrics(jnp.zeros((0, 4)), jnp.zeros((0, 4)), jnp.zeros((0, 4)))
    assert got["seq_log_ratio_std"] == 0.0 and got["seq_log_ratio_abs_max"] == 1.25 and got["abs_max"] == 1.0
    assert got == pytest.approx(ref.gap(old, sampler, mask), rel=1e-12)
    assert all(float(v) == 0 for v in none.values())
