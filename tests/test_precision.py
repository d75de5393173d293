"""Mixed precision, the recipes' default: float32 master weights and optimiser state, bfloat16 compute.

At lr 1e-6 one AdamW step moves each weight by about 1e-6 (Adam's first step is lr * sign(g)). A float32 weight of
N(0, 0.02) has a spacing near 1e-9 and takes the step; a bfloat16 one has a spacing near 1e-4 and rounds it away
(issue 11 saw 3.9% of bf16 weights change at lr 2e-6). The bf16-master case is run too, so the test shows it can
tell the two apart.
"""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from spatial_jax import config as C
from spatial_jax.rl import step as st
from spatial_jax.rl.config import MeshConfig, PolicyConfig, TrainConfig
from spatial_jax.rl.optim import OptimConfig, make_optimizer
from spatial_jax.rl.policy import build_mesh, build_policy

RECIPES = ["spatialcore_8b", "spatialcore_4b", "prosr_8b", "spatialthinker_3b", "spatialthinker_7b",
           "spatialthinker_30b", "allospatial_4b"]


def _batch(model_cfg, rows=2, prompt=6, completion=10, seed=0):
    rng = np.random.default_rng(seed)
    special = min(model_cfg.image_token_id, model_cfg.video_token_id, model_cfg.vision_start_token_id,
                  model_cfg.vision_end_token_id)
    ids = rng.integers(0, min(special, 200), (rows, prompt + completion)).astype(np.int32)
    mask = np.ones_like(ids)
    return st.make_seq_batch(model_cfg, ids[:, :prompt], mask[:, :prompt], ids[:, prompt:], mask[:, prompt:],
                             None, None)


def _one_update(param_dtype: str):
    """(weights before, weights after, gradient, optimiser state) of one SFT step at lr 1e-6 on the tiny policy,
    bf16 compute: the trainer's objective and optimiser, with the gradient returned from the same compile."""
    policy = build_policy(PolicyConfig(dtype="bfloat16", param_dtype=param_dtype), build_mesh(MeshConfig()))
    graphdef, trainable, frozen = nnx.split(policy.model, policy.trainable, ...)
    seq = _batch(policy.model.cfg)
    tx = make_optimizer(OptimConfig(lr=1e-6, min_lr=1e-6, warmup_ratio=0.0, total_steps=10, grad_clip_norm=0.0))

    @jax.jit
    def update(trainable, opt_state):
        grads = jax.grad(lambda t: st.sft_objective(t, graphdef, frozen, seq, None)[0])(trainable)
        updates, opt_state = tx.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), grads, opt_state

    after, grads, opt_state = update(trainable, tx.init(trainable))
    return tuple(jax.tree.map(np.asarray, x) for x in (trainable, after, grads)) + (opt_state,)


def _flat(tree):
    return np.concatenate([np.ravel(x).astype(np.float64) for x in jax.tree.leaves(tree)])


def test_float32_master_keeps_a_1e_6_update_that_bfloat16_rounds_away():
    before, after, grads, opt_state = _one_update("float32")
    assert {x.dtype for x in jax.tree.leaves(before)} == {np.dtype(np.float32)}
    assert {x.dtype for x in jax.tree.leaves(after)} == {np.dtype(np.float32)}
    # Adam's moments live at the master precision too
    moments = [x for x in jax.tree.leaves(opt_state) if np.ndim(x) > 0]
    assert moments and {x.dtype for x in moments} == {np.dtype(np.float32)}
    b, a, g = _flat(before), _flat(after), _flat(grads)
    live = np.abs(g) > 1e-6  # Adam's step is ~lr here (|g| >> eps = 1e-8)
    assert live.mean() > 0.5
    changed = a != b
    assert changed[live].mean() > 0.999
    assert not changed[g == 0].any()  # no weight decay: a weight without gradient stays
    # each step is Adam's first, lr |g| / (|g| + eps), up to the float32 rounding of the weight it lands on; 1% and
    # a few outliers for g, which the step recomputes in bfloat16 in another compile (|g| near eps moves most)
    expected = 1e-6 * np.abs(g[live]) / (np.abs(g[live]) + 1e-8)
    spacing = np.spacing(np.maximum(np.abs(a), np.abs(b))[live].astype(np.float32)).astype(np.float64)
    assert (np.abs(np.abs(a - b)[live] - expected) <= 0.01 * expected + spacing).mean() > 0.999

    b16, a16, g16, _ = _one_update("bfloat16")
    live16 = np.abs(_flat(g16)) > 1e-6
    assert (_flat(a16) != _flat(b16))[live16].mean() < 0.05  # the failure mode this default avoids


def test_compute_runs_in_bfloat16():
    """Every matmul of the decoder and vision tower takes bfloat16 operands (float32 masters cast per use)."""
    policy = build_policy(PolicyConfig(dtype="bfloat16", param_dtype="float32"), build_mesh(MeshConfig()))
    seq = _batch(policy.model.cfg)
    graphdef, state = nnx.split(policy.model)

    def forward(state):
        model = nnx.merge(graphdef, state)
        return model(seq.input_ids, positions=seq.positions, attention_mask=seq.attention_mask,
                     return_hidden=True)[0]

    jaxpr = jax.make_jaxpr(forward)(state)
    dots = []

    def walk(jx):
        for eqn in jx.eqns:
            if eqn.primitive.name == "dot_general":
                dots.append(tuple(v.aval.dtype for v in eqn.invars))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr.jaxpr)
    assert len(dots) >= 7 * policy.model.cfg.text.num_hidden_layers
    assert all(d == (jnp.bfloat16, jnp.bfloat16) for d in dots), sorted(set(dots))
    assert jaxpr.out_avals[0].dtype == jnp.bfloat16


@pytest.mark.parametrize("name", RECIPES)
def test_recipes_default_to_float32_masters_and_bfloat16_compute(name):
    from pathlib import Path

    cfg = C.load(TrainConfig, Path(__file__).resolve().parents[1] / "configs" / f"{name}.toml")
    assert (cfg.policy.param_dtype, cfg.policy.dtype) == ("float32", "bfloat16")
