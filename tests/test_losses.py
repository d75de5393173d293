"""Parity of the JAX policy/SFT losses with the float64 torch reference, their edge cases, and the optimiser schedule.

Tolerances: float64 JAX vs float64 torch, values and gradients, rtol 1e-6 / atol 1e-9; float32 JAX vs float64 torch,
rtol 1e-4 / atol 1e-5 (float32 has ~7 significant digits and the losses sum tens of terms).
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from spatial_jax.config import ConfigError, apply_overrides
from spatial_jax.reference import losses_torch as ref
from spatial_jax.rl import losses, optim

KINDS = ("grpo", "gspo", "gspo_token")
ESTIMATORS = ("k1", "k2", "k3")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def make_batch(seed, b=6, t=10, empty_row=True, spread=0.3):
    """Random rollouts: right-padded masks of varied length, one fully masked row, garbage in the padding."""
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.01, 4.0, (b, t))
    old = logp + rng.normal(0.0, spread, (b, t))
    ref_logp = logp + rng.normal(0.0, 0.5, (b, t))
    adv = rng.normal(0.0, 1.0, b)
    adv[1] = 0.0
    entropy = rng.uniform(0.0, 3.0, (b, t))
    lengths = rng.integers(1, t + 1, b)
    if empty_row:
        lengths[2] = 0
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
    for arr in (logp, old, ref_logp, entropy):
        arr[mask == 0] = rng.normal(0.0, 50.0, int((mask == 0).sum()))
    return dict(logp=logp, old_logp=old, advantages=adv, mask=mask, ref_logp=ref_logp, entropy=entropy)


def cfg_kwargs(cfg):
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}


def jax_loss_and_grad(batch, cfg, dtype):
    with jax.enable_x64(dtype == jnp.float64):
        return _jax_loss_and_grad(batch, cfg, dtype)


def _jax_loss_and_grad(batch, cfg, dtype):
    args = {k: jnp.asarray(v, dtype) for k, v in batch.items()}

    def fn(logp):
        return losses.policy_loss(
            logp, args["old_logp"], args["advantages"], args["mask"], cfg,
            ref_logp=args["ref_logp"], entropy=args["entropy"],
        )

    (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(args["logp"])
    return float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(grad, np.float64)


def torch_loss_and_grad(batch, cfg):
    logp = torch.tensor(batch["logp"], dtype=torch.float64, requires_grad=True)
    loss, metrics = ref.policy_loss(
        logp, batch["old_logp"], batch["advantages"], batch["mask"], **cfg_kwargs(cfg),
        ref_logp=batch["ref_logp"], entropy=batch["entropy"],
    )
    loss.backward()
    return float(loss.detach()), metrics, logp.grad.numpy()


def assert_parity(batch, cfg, dtype, rtol, atol):
    j_loss, j_metrics, j_grad = jax_loss_and_grad(batch, cfg, dtype)
    t_loss, t_metrics, t_grad = torch_loss_and_grad(batch, cfg)
    assert math.isfinite(j_loss)
    np.testing.assert_allclose(j_loss, t_loss, rtol=rtol, atol=atol)
    assert set(j_metrics) == set(t_metrics)
    for key in t_metrics:
        np.testing.assert_allclose(j_metrics[key], t_metrics[key], rtol=rtol, atol=atol, err_msg=key)
    np.testing.assert_allclose(j_grad, t_grad, rtol=rtol, atol=atol)
    return j_metrics, j_grad


@pytest.mark.parametrize("kind,estimator,aggregation", list(itertools.product(KINDS, ESTIMATORS, AGGREGATIONS)))
def test_parity_float64_every_combination(kind, estimator, aggregation):
    cfg = losses.LossConfig(
        kind=kind, kl_estimator=estimator, aggregation=aggregation, clip_low=0.2, clip_high=0.28,
        dual_clip=3.0, kl_coef=0.05, entropy_coef=0.01, max_completion_length=16,
    )
    seed = KINDS.index(kind) * 9 + ESTIMATORS.index(estimator) * 3 + AGGREGATIONS.index(aggregation)
    # GSPO averages log-ratios over a sequence, so it needs a wider spread to reach the clip range.
    batch = make_batch(seed, spread=0.3 if kind == "grpo" else 0.8)
    metrics, grad = assert_parity(batch, cfg, jnp.float64, rtol=1e-6, atol=1e-9)
    assert np.all(grad[batch["mask"] == 0] == 0.0)
    assert metrics["num_seqs"] == 5.0


def test_parity_exercises_clipping_and_dual_clip():
    """The random batches above reach every branch: low and high clipping and the dual clip."""
    seen = {"clip_frac_low": 0.0, "clip_frac_high": 0.0, "dual_clip_frac": 0.0}
    for kind in KINDS:
        for seed in range(3):
            batch = make_batch(seed, spread=0.3 if kind == "grpo" else 0.8)
            cfg = losses.LossConfig(kind=kind, dual_clip=1.5, clip_high=0.28)
            metrics, _ = assert_parity(batch, cfg, jnp.float64, rtol=1e-6, atol=1e-9)
            for k in seen:
                seen[k] = max(seen[k], metrics[k])
    assert all(v > 0 for v in seen.values()), seen


@pytest.mark.parametrize("kind", KINDS)
def test_parity_float32(kind):
    cfg = losses.LossConfig(kind=kind, kl_coef=0.04, kl_estimator="k3", entropy_coef=0.01)
    assert_parity(make_batch(100 + KINDS.index(kind)), cfg, jnp.float32, rtol=1e-4, atol=1e-5)


def test_jit_matches_eager():
    cfg = losses.LossConfig(kind="gspo", aggregation="seq_mean_token_mean")
    b = {k: jnp.asarray(v, jnp.float32) for k, v in make_batch(7).items()}
    eager = losses.policy_loss(**b, cfg=cfg)
    jitted = jax.jit(lambda x: losses.policy_loss(**x, cfg=cfg))(b)
    np.testing.assert_allclose(float(jitted[0]), float(eager[0]), rtol=1e-6)
    assert set(jitted[1]) == set(eager[1])


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_empty_row_contributes_nothing(aggregation):
    cfg = losses.LossConfig(aggregation=aggregation, max_completion_length=10)
    full = make_batch(3, empty_row=True)
    kept = {k: np.delete(v, 2, axis=0) for k, v in full.items()}
    loss_full, m_full, grad_full = jax_loss_and_grad(full, cfg, jnp.float32)
    loss_kept, m_kept, _ = jax_loss_and_grad(kept, cfg, jnp.float32)
    b = full["logp"].shape[0]
    expected = loss_kept * (b - 1) / b if aggregation == "seq_mean_token_sum_norm" else loss_kept
    np.testing.assert_allclose(loss_full, expected, rtol=1e-5)
    np.testing.assert_allclose(m_full["ratio_mean"], m_kept["ratio_mean"], rtol=1e-5)
    assert np.all(grad_full[2] == 0.0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_micro_batches_with_normalizer_match_full_batch(aggregation):
    """Two micro-batches, each normalised by half the full batch's denominator, average to the full-batch loss and
    gradient (what optax.MultiSteps applies)."""
    cfg = losses.LossConfig(kind="grpo", aggregation=aggregation, kl_coef=0.05, max_completion_length=12)
    batch = {k: jnp.asarray(v, jnp.float32) for k, v in make_batch(12, b=8).items()}

    def run(part, normalizer=None):
        def fn(logp):
            rest = {k: v for k, v in part.items() if k != "logp"}
            return losses.policy_loss(logp, cfg=cfg, normalizer=normalizer, **rest)[0]

        return jax.value_and_grad(fn)(part["logp"])

    full_loss, full_grad = run(batch)
    half = losses.loss_denominator(batch["mask"], aggregation) / 2
    parts = [run({k: v[sl] for k, v in batch.items()}, half) for sl in (slice(0, 3), slice(3, 8))]
    np.testing.assert_allclose((parts[0][0] + parts[1][0]) / 2, full_loss, rtol=1e-5)
    np.testing.assert_allclose(np.concatenate([parts[0][1], parts[1][1]]) / 2, full_grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("kind", KINDS)
def test_fully_masked_batch_and_nan_padding(kind):
    cfg = losses.LossConfig(kind=kind, entropy_coef=0.1)
    batch = make_batch(4)
    for key in ("old_logp", "ref_logp", "entropy"):
        batch[key][batch["mask"] == 0] = np.nan
    batch["logp"][batch["mask"] == 0] = -np.inf
    batch["advantages"][2] = np.nan  # row 2 is fully masked
    loss, metrics, grad = jax_loss_and_grad(batch, cfg, jnp.float32)
    assert np.isfinite(loss) and np.all(np.isfinite(grad)) and all(np.isfinite(v) for v in metrics.values())
    clean = make_batch(4)
    np.testing.assert_allclose(loss, jax_loss_and_grad(clean, cfg, jnp.float32)[0], rtol=1e-6)
    batch["mask"][:] = 0.0
    loss, metrics, grad = jax_loss_and_grad(batch, cfg, jnp.float32)
    assert loss == 0.0 and np.all(grad == 0.0)
    assert all(v == 0.0 for v in metrics.values()), metrics


@pytest.mark.parametrize("kind", KINDS)
def test_huge_log_ratios_are_clamped(kind):
    batch = make_batch(5, empty_row=False)
    batch["old_logp"] = batch["logp"] + np.where(np.arange(6)[:, None] % 2 == 0, -1000.0, 1000.0)
    cfg = losses.LossConfig(kind=kind, kl_coef=0.1, kl_estimator="k3")
    batch["ref_logp"] = batch["logp"] + 500.0
    metrics, grad = assert_parity(batch, cfg, jnp.float64, rtol=1e-6, atol=1e-9)
    assert np.all(np.isfinite(grad))
    cap = math.exp(20.0) if kind == "grpo" else math.exp(10.0)
    np.testing.assert_allclose(metrics["ratio_max"], cap, rtol=1e-9)
    np.testing.assert_allclose(metrics["kl_ref"], 10.0)  # k3 output clamp


def test_zero_advantages_leave_only_kl():
    batch = make_batch(6)
    batch["advantages"][:] = 0.0
    _, metrics, grad = jax_loss_and_grad(batch, losses.LossConfig(kl_coef=0.0), jnp.float64)
    assert metrics["pg_loss"] == 0.0 and np.all(grad == 0.0)
    _, metrics, grad = jax_loss_and_grad(batch, losses.LossConfig(kl_coef=0.1), jnp.float64)
    assert metrics["pg_loss"] == 0.0 and np.any(grad != 0.0)


@pytest.mark.parametrize("kind", KINDS)
def test_single_update_ratio_is_one(kind):
    """One update per rollout batch: logp == old_logp gives ratio exactly 1, no clipping, gradient -A / n_i / B'."""
    batch = make_batch(8)
    batch["old_logp"] = batch["logp"].copy()
    cfg = losses.LossConfig(kind=kind, kl_coef=0.0, aggregation="seq_mean_token_mean", dual_clip=3.0)
    _, metrics, grad = jax_loss_and_grad(batch, cfg, jnp.float64)
    assert metrics["ratio_mean"] == 1.0 and metrics["ratio_max"] == 1.0
    assert metrics["clip_frac"] == 0.0 and metrics["dual_clip_frac"] == 0.0
    lengths = batch["mask"].sum(-1)
    rows = (lengths > 0).sum()
    expected = -batch["advantages"][:, None] / np.maximum(lengths, 1)[:, None] / rows * batch["mask"]
    np.testing.assert_allclose(grad, expected, rtol=1e-12, atol=1e-15)


def test_gspo_and_gspo_token_agree_with_sequence_advantages():
    batch = make_batch(9, spread=0.8)
    for aggregation in AGGREGATIONS:
        a = jax_loss_and_grad(batch, losses.LossConfig(kind="gspo", aggregation=aggregation), jnp.float64)
        b = jax_loss_and_grad(batch, losses.LossConfig(kind="gspo_token", aggregation=aggregation), jnp.float64)
        np.testing.assert_allclose(a[0], b[0], rtol=1e-12)
        np.testing.assert_allclose(a[2], b[2], rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("log_s", [9.5, 15.0])
def test_gspo_token_cap_applies_to_the_combined_log_ratio(log_s):
    """SPEC 6 (settled 2026-11-30, as verl): log s_it = sg(log s_i) + logp - sg(logp) is capped at 10 as a whole, so
    a token whose sequence is more than e^10 off-policy carries no gradient (the code had kept e^10 |A| / n there).
    Under the cap each token's gradient is s_i |A| / n (token mean, negative advantage, no dual clip)."""
    batch = dict(logp=np.full((1, 4), -5.0), old_logp=np.full((1, 4), -5.0 - log_s), advantages=np.array([-1.0]),
                 mask=np.ones((1, 4)), ref_logp=np.full((1, 4), -5.0), entropy=np.zeros((1, 4)))
    cfg = losses.LossConfig(kind="gspo_token", kl_coef=0.0)
    loss, metrics, grad = jax_loss_and_grad(batch, cfg, jnp.float64)
    ratio = math.exp(min(log_s, 10.0))
    assert loss == pytest.approx(ratio, rel=1e-12) and metrics["ratio_max"] == pytest.approx(ratio, rel=1e-12)
    np.testing.assert_allclose(grad, np.full((1, 4), ratio / 4 if log_s < 10.0 else 0.0), rtol=1e-12)
    t_loss, _, t_grad = torch_loss_and_grad(batch, cfg)
    assert t_loss == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(t_grad, grad, rtol=1e-12)


def _one_token(ratio, adv, **kw):
    mask = jnp.ones((1, 1))
    old = jnp.full((1, 1), -1.0)

    def fn(lp):
        return losses.policy_loss(lp, old, jnp.array([adv]), mask, losses.LossConfig(kl_coef=0.0, **kw))

    (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(old + math.log(ratio))
    return float(loss), metrics, float(grad[0, 0])


def test_clip_higher_and_dual_clip():
    loss, m, g = _one_token(1.25, 1.0, clip_high=0.28)
    assert m["clip_frac"] == 0.0 and g != 0.0 and loss == pytest.approx(-1.25, rel=1e-6)
    loss, m, g = _one_token(1.25, 1.0, clip_high=0.2)
    assert m["clip_frac_high"] == 1.0 and g == 0.0 and loss == pytest.approx(-1.2, rel=1e-6)
    loss, m, g = _one_token(0.5, -2.0)
    assert m["clip_frac_low"] == 1.0 and g == 0.0 and loss == pytest.approx(1.6, rel=1e-6)
    # Negative advantage, large ratio: loss r |A| grows without bound unless the dual clip caps it at c |A|.
    loss, m, g = _one_token(10.0, -2.0)
    assert loss == pytest.approx(20.0, rel=1e-5) and g > 0
    loss, m, g = _one_token(10.0, -2.0, dual_clip=3.0)
    assert loss == pytest.approx(6.0, rel=1e-6) and g == 0.0 and m["dual_clip_frac"] == 1.0
    # The dual clip leaves positive advantages and small ratios alone.
    assert _one_token(10.0, 2.0, dual_clip=3.0)[0] == pytest.approx(-1.2 * 2.0, rel=1e-6)
    assert _one_token(2.0, -2.0, dual_clip=3.0)[0] == pytest.approx(4.0, rel=1e-6)


def test_kl_estimators_values():
    l_ref = jnp.array([0.0, 0.5, -0.5, -100.0, 100.0])
    np.testing.assert_allclose(losses.kl_penalty(l_ref, 0.0, "k1"), l_ref)
    np.testing.assert_allclose(losses.kl_penalty(l_ref, 0.0, "k2"), 0.5 * l_ref**2)
    k3 = np.asarray(losses.kl_penalty(l_ref, 0.0, "k3"))
    np.testing.assert_allclose(k3[:3], np.exp(-np.asarray(l_ref[:3])) + np.asarray(l_ref[:3]) - 1, rtol=1e-6)
    assert k3[3] == 10.0  # exp(20) - 21 clamped to 10
    assert k3[4] == 10.0  # exp(-20) + 19 clamped to 10


def test_config_validation_and_errors():
    with pytest.raises(ValueError, match="dual_clip"):
        losses.LossConfig(dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_low"):
        losses.LossConfig(clip_low=1.0)
    with pytest.raises(ConfigError, match="kind"):
        apply_overrides(losses.LossConfig(), ["kind=ppo"])
    cfg = apply_overrides(losses.LossConfig(), ["kind=gspo", "dual_clip=3", "aggregation=seq_mean_token_sum_norm"])
    assert cfg.kind == "gspo" and cfg.dual_clip == 3.0
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="ref_logp"):
        losses.policy_loss(x, x, jnp.zeros(2), x, losses.LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy"):
        losses.policy_loss(x, x, jnp.zeros(2), x, losses.LossConfig(kl_coef=0.0, entropy_coef=0.1))
    with pytest.raises(ValueError, match="advantages"):
        losses.policy_loss(x, x, jnp.zeros(3), x, losses.LossConfig(kl_coef=0.0))
    with pytest.raises(ValueError, match="mask"):
        losses.policy_loss(x, x, jnp.zeros(2), jnp.zeros((2, 4)), losses.LossConfig(kl_coef=0.0))


def test_sft_loss_parity_and_empty_mask():
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 3, (3, 7, 13))
    targets = rng.integers(0, 13, (3, 7))
    mask = (rng.uniform(size=(3, 7)) > 0.4).astype(np.float64)
    mask[1] = 0.0
    with jax.enable_x64(True):
        def fn(lg):
            return losses.sft_loss(losses.token_logprobs(lg, jnp.asarray(targets), temperature=0.7), jnp.asarray(mask))

        (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(jnp.asarray(logits))
    t_logits = torch.tensor(logits, requires_grad=True)
    t_loss = ref.sft_loss(t_logits, targets, mask, temperature=0.7)
    t_loss.backward()
    np.testing.assert_allclose(float(loss), float(t_loss.detach()), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), t_logits.grad.numpy(), rtol=1e-6, atol=1e-12)
    assert float(metrics["num_tokens"]) == mask.sum()
    loss0, _ = losses.sft_loss(jnp.full((2, 3), jnp.nan), jnp.zeros((2, 3)))
    assert float(loss0) == 0.0


# Optimiser (spatial_jax/rl/optim.py).


def test_schedule_values():
    cfg = optim.OptimConfig(lr=5e-5, min_lr=5e-6, warmup_ratio=0.05, total_steps=200)
    sched = optim.lr_schedule(cfg)
    assert cfg.warmup_steps == 10
    assert float(sched(0)) == 0.0  # the first update at learning rate 0, as optax's and transformers' warmups
    np.testing.assert_allclose(float(sched(5)), 2.5e-5, rtol=1e-6)
    np.testing.assert_allclose(float(sched(10)), 5e-5, rtol=1e-6)
    np.testing.assert_allclose(float(sched(200)), 5e-6, rtol=1e-6)
    np.testing.assert_allclose(float(sched(500)), 5e-6, rtol=1e-6)
    for step in (0, 3, 10, 57, 105, 199, 200):
        want = ref.cosine_schedule(step, lr=5e-5, min_lr=5e-6, warmup_steps=10, total_steps=200)
        np.testing.assert_allclose(float(sched(step)), want, rtol=1e-5, atol=1e-12)
    no_warmup = optim.lr_schedule(optim.OptimConfig(lr=1e-3, min_lr=0.0, warmup_ratio=0.0, total_steps=4))
    np.testing.assert_allclose([float(no_warmup(s)) for s in range(5)], [1e-3, 8.5355339e-4, 5e-4, 1.4644661e-4, 0.0],
                               rtol=1e-5, atol=1e-12)
    with pytest.raises(ValueError, match="min_lr"):
        optim.OptimConfig(lr=1e-5, min_lr=1e-4)


def test_optimizer_clips_and_accumulates():
    params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
    grads = [{"w": jnp.full(3, 100.0 * (i + 1)), "b": jnp.full(2, -50.0)} for i in range(2)]
    cfg = optim.OptimConfig(lr=1e-2, min_lr=1e-3, warmup_ratio=0.0, total_steps=10, grad_accum_steps=2,
                            grad_clip_norm=1.0, weight_decay=0.1)
    tx = optim.make_optimizer(cfg)
    state = tx.init(params)
    u1, state = tx.update(grads[0], state, params)
    assert all(np.all(np.asarray(v) == 0) for v in jax.tree.leaves(u1))
    u2, state = tx.update(grads[1], state, params)
    # Same result as one un-accumulated step on the mean gradient.
    single = optim.make_optimizer(optim.OptimConfig(**{**cfg_kwargs(cfg), "grad_accum_steps": 1}))
    mean = jax.tree.map(lambda a, b: (a + b) / 2, *grads)
    u_ref, _ = single.update(mean, single.init(params), params)
    for a, b in zip(jax.tree.leaves(u2), jax.tree.leaves(u_ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    # First Adam step moves each coordinate by ~lr (sign of the gradient) plus decoupled weight decay.
    np.testing.assert_allclose(np.asarray(u2["w"]), -1e-2 * (1 + 0.1 * 1.0), rtol=1e-4)
    assert isinstance(tx, optax.GradientTransformation)
