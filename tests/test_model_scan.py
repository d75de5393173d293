"""Scanned layers (ModelConfig.scan_layers): stacked parameters under lax.scan equal the unrolled model (float32,
1e-6) in logits on an image batch of several grid sizes, in one SFT train step's loss and gradients (stacked
gradients mapped back to per-layer ones), under every remat policy, and in greedy KV-cache decoding; Hugging Face
checkpoints load into and save from the stacks (transformers' logits to 1e-4, tensors bit-exact)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from test_model_utils import IMG, VEND, VID, VOCAB, VSTART, forward, hf_logits, hf_model, image_batch, max_err_real

from spatial_jax.models import (
    LoRAConfig,
    LoRAParam,
    ModelConfig,
    TextConfig,
    VisionConfig,
    create_model,
    disable_adapters,
    merge_lora,
)
from spatial_jax.models.hf_io import _CheckpointReader, _layer_paths, from_pretrained, save_pretrained
from spatial_jax.models.scan import REMAT_POLICIES
from spatial_jax.models.sharding import logical_to_spec, make_mesh, variable_names
from spatial_jax.rl.step import make_seq_batch, sft_objective
from spatial_jax.rollout import SamplingConfig, generate

TOL = 1e-6
# Gradients: max |scanned - unrolled| over all weights, relative to the largest gradient (22 here). Scan and remat
# change XLA's fusion and summation order, so float32 roundoff stays: measured 0.7e-6 (scan), up to 1.1e-6 (scan +
# remat policies), as large as the unrolled model's own remat=True against no remat (1.3e-6).
GRAD_TOL = 2e-6
# 3 decoder layers of which the first 2 take DeepStack features (both scan segments run); 3 vision blocks tapped
# out of order at 1 and 0 (three vision scan segments); adapters on both towers. Pixels as test_model_utils'
# "tied_gqa2" variant (patch 4), so image_batch() feeds it.
CFG = ModelConfig(
    text=TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                    mrope_section=(2, 3, 3)),
    vision=VisionConfig(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4,
                        temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=32, num_position_embeddings=16,
                        deepstack_visual_indexes=(1, 0)),
    lora=LoRAConfig(rank=4, alpha=8.0, vision_rank=2, vision_alpha=4.0),
    image_token_id=IMG, video_token_id=VID, vision_start_token_id=VSTART, vision_end_token_id=VEND,
    tie_word_embeddings=False,
)


def scanned_copy(model, **changes):
    """The same weights (adapters included) in a model with scan_layers=True (and `changes` to its config)."""
    cfg = model.cfg.replace(scan_layers=True, **changes)
    scanned = create_model(cfg, seed=99)  # every parameter is overwritten below
    per_layer = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    leaves = []
    for path, var in nnx.to_flat_state(nnx.state(scanned, nnx.Param)):
        paths = _layer_paths(path, cfg)
        value = (per_layer[path].get_value() if paths is None
                 else jnp.stack([per_layer[p].get_value() for p in paths]))
        leaves.append((path, var.replace(value)))
    nnx.update(scanned, nnx.from_flat_state(leaves))
    return scanned


def unstacked(state: nnx.State, cfg: ModelConfig) -> dict:
    """Flat {per-layer path: array} of a scanned model's state (stacked leaves split by layer)."""
    out = {}
    for path, var in nnx.to_flat_state(state):
        value = np.asarray(var.get_value())
        paths = _layer_paths(path, cfg)
        out.update({path: value} if paths is None else dict(zip(paths, value)))
    return out


@pytest.fixture(scope="module")
def unrolled():
    """CFG's random model with nonzero adapter B factors (so the adapters change every projection)."""
    model = create_model(CFG, seed=0)
    rng = np.random.default_rng(0)
    for _, var in nnx.to_flat_state(nnx.state(model, LoRAParam)):
        var.set_value(jnp.asarray(0.2 * rng.standard_normal(var.get_value().shape), jnp.float32))
    return model


@pytest.fixture(scope="module")
def scanned(unrolled):
    return scanned_copy(unrolled)


def test_stacked_layout(unrolled, scanned):
    # the constructor stacks the same per-layer draws: a fresh scanned model equals the fresh unrolled one
    scan_cfg = CFG.replace(scan_layers=True)
    fresh = unstacked(nnx.state(create_model(scan_cfg, seed=0), nnx.Param), scan_cfg)
    ref = dict(nnx.to_flat_state(nnx.state(create_model(CFG, seed=0), nnx.Param)))
    assert fresh.keys() == ref.keys()
    for path, value in fresh.items():
        np.testing.assert_array_equal(value, np.asarray(ref[path].get_value()))
    q = scanned.layers.self_attn.q_proj
    assert q.kernel.get_value().shape == (3, 32, 64) and q.lora_a.get_value().shape == (3, 32, 4)
    names = variable_names(q.kernel)
    assert names == ("layers", "embed", "heads")
    assert variable_names(scanned.visual.blocks.attn.qkv.kernel)[0] == "layers"
    assert logical_to_spec(names) == P(None, "fsdp", "tensor")


def test_logits_equal_unrolled(unrolled, scanned):
    ids, mask, pixels, grids = image_batch("tied_gqa2")  # grids (1,4,4), (1,2,6), (1,4,2) in two rows
    a = forward(unrolled, ids, mask, pixels, grids)
    b = forward(scanned, ids, mask, pixels, grids)
    assert max_err_real(a, b, mask) < TOL
    # merge_lora and disable_adapters reach the stacked adapters
    merged = forward(merge_lora(unrolled), ids, mask, pixels, grids)
    assert max_err_real(forward(merge_lora(scanned), ids, mask, pixels, grids), merged, mask) < TOL
    with disable_adapters(unrolled), disable_adapters(scanned):
        c, d = forward(unrolled, ids, mask, pixels, grids), forward(scanned, ids, mask, pixels, grids)
    assert max_err_real(c, d, mask) < TOL and max_err_real(c, a, mask) > 1e-3


def _sft_batch(cfg, images: bool):
    ids, mask, pixels, grids = image_batch("tied_gqa2")
    if not images:
        ids, pixels, grids = np.where(ids == IMG, 7, ids), None, None
    rng = np.random.default_rng(1)
    targets = rng.integers(0, 100, size=(2, 5))
    target_mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    return make_seq_batch(cfg, ids, mask, targets, target_mask, pixels, grids)


def sft_grads(model, images: bool = True):
    """(loss, {per-layer path: gradient}) of one SFT step (rl/step.py's objective) over every weight, adapters
    included."""
    graphdef, trainable, frozen = nnx.split(model, nnx.Param, ...)
    step = jax.jit(lambda t, f, s: jax.value_and_grad(sft_objective, has_aux=True)(t, graphdef, f, s, None))
    (loss, _), grads = step(trainable, frozen, _sft_batch(model.cfg, images))
    return float(loss), unstacked(grads, model.cfg)


@pytest.fixture(scope="module")
def unrolled_step(unrolled):
    return sft_grads(unrolled)


@pytest.fixture(scope="module")
def scanned_text_step(scanned):
    """The scanned model's step on a text-only batch: the reference of the remat policies (which only touch the
    decoder), without compiling the vision tower once per policy."""
    return sft_grads(scanned, images=False)


def assert_same_step(a, b):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert abs(loss_a - loss_b) < TOL
    assert grads_a.keys() == grads_b.keys()
    scale = max(np.abs(g).max() for g in grads_a.values())
    err, path = max((np.abs(grads_b[p] - grads_a[p]).max(), p) for p in grads_a)
    assert err <= GRAD_TOL * scale, (path, err, scale)


def test_train_step_equals_unrolled(unrolled, unrolled_step, scanned):
    assert_same_step(unrolled_step, sft_grads(scanned))


@pytest.mark.parametrize("policy", ["full", "dots", "dots_no_batch"])
def test_remat_policy_equals_none(unrolled, scanned_text_step, policy):
    model = scanned_copy(unrolled, remat_policy=policy)
    graphdef, trainable, frozen = nnx.split(model, nnx.Param, ...)
    jaxpr = str(jax.make_jaxpr(lambda t: sft_objective(t, graphdef, frozen, _sft_batch(model.cfg, False), None))(
        trainable))
    assert f"policy={REMAT_POLICIES[policy]!r}" in jaxpr  # the layers really run under this policy
    assert_same_step(scanned_text_step, sft_grads(model, images=False))


def test_unrolled_remat_policy_and_flag(unrolled, scanned_text_step):
    assert unrolled.cfg.replace(remat=True).decoder_remat == "full"
    assert unrolled.cfg.replace(remat=True, remat_policy="dots").decoder_remat == "dots"
    with pytest.raises(ValueError, match="remat_policy"):
        unrolled.cfg.replace(remat_policy="everything")
    assert_same_step(scanned_text_step, sft_grads(_with_cfg(unrolled, remat_policy="dots_no_batch"), images=False))


def _with_cfg(model, **changes):
    """The same weights in an unrolled model with `changes` to its config."""
    other = create_model(model.cfg.replace(**changes), seed=99)
    nnx.update(other, nnx.state(model, nnx.Param))
    return other


def test_adapter_dropout_draws_fresh_masks(scanned):
    # live dropout threads the shared RNG streams through the scan and writes them back
    ids, mask, pixels, grids = image_batch("tied_gqa2")
    train = nnx.view(scanned, deterministic=False, raise_if_not_found=False)
    a, b = forward(train, ids, mask, pixels, grids), forward(train, ids, mask, pixels, grids)
    assert np.isfinite(a).all() and max_err_real(a, b, mask) > 1e-4
    assert max_err_real(a, forward(scanned, ids, mask, pixels, grids), mask) > 1e-4
    # rl/step.py's training forward re-keys the streams per step (scalar keys): it traces through the scans
    graphdef, trainable, frozen = nnx.split(scanned, nnx.Param, ...)
    loss = jax.eval_shape(lambda t: sft_objective(t, graphdef, frozen, _sft_batch(CFG, True), jax.random.key(0))[0],
                          trainable)
    assert loss.shape == ()


def test_greedy_decode_equals_unrolled(unrolled, scanned):
    ids, mask, pixels, grids = image_batch("tied_gqa2")
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=5)
    a, _ = generate(unrolled, ids, mask, pixel_values=pixels, image_grid_thw=grids, cfg=cfg)
    b, _ = generate(scanned, ids, mask, pixel_values=pixels, image_grid_thw=grids, cfg=cfg)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)


def test_hf_checkpoint_into_and_out_of_stacks(tmp_path):
    variant = "untied_gqa4"  # 3 layers, DeepStack into layer 0 only
    hf = hf_model(variant)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf", scan_layers=True, remat_policy="dots")
    assert model.cfg.scan_layers and model.layers.mlp.up_proj.kernel.get_value().shape[0] == 3
    ids, mask, pixels, grids = image_batch(variant)
    pos, _ = model.get_rope_index(ids, grids, mask)
    ref = hf_logits(hf, ids, mask, pos, pixels, grids)
    assert max_err_real(forward(model, ids, mask, pixels, grids, positions=pos), ref, mask) < 1e-4
    save_pretrained(model, tmp_path / "ours")
    theirs, ours = _CheckpointReader(tmp_path / "hf"), _CheckpointReader(tmp_path / "ours")
    assert ours.names() == theirs.names()
    for name in ours.names():
        np.testing.assert_array_equal(ours.get(name), theirs.get(name), err_msg=name)
    mesh = make_mesh(2, 2, 2)
    sharded = from_pretrained(tmp_path / "ours", mesh=mesh, scan_layers=True)
    assert sharded.layers.mlp.up_proj.kernel[...].sharding.spec == P(None, "fsdp", "tensor")
    with jax.set_mesh(mesh):
        assert max_err_real(forward(sharded, ids, mask, pixels, grids, positions=pos), ref, mask) < 1e-4
    back = from_pretrained(tmp_path / "ours")  # unrolled from the scanned model's save
    np.testing.assert_array_equal(forward(back, ids, mask, pixels, grids, positions=pos),
                                  forward(from_pretrained(tmp_path / "hf"), ids, mask, pixels, grids, positions=pos))
