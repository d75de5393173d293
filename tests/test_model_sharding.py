"""Sharded forward on 8 CPU devices (meshes data x fsdp x tensor = 8x1x1 and 2x2x2) equals the single-device forward
(max abs 1e-5), for the full forward with images and LoRA, and for a cached decode step; parameters really are
split by the logical-axis rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from test_model_lora import tiny_image_batch
from test_model_utils import jit_forward, max_err_real

from spatial_jax.models import LoRAConfig, ModelConfig, create_model, decode_positions, prepare_vision_inputs
from spatial_jax.models.hf_io import from_pretrained, save_pretrained
from spatial_jax.models.lora import lora_layers
from spatial_jax.models.sharding import logical_to_spec, make_mesh, shard_model

TOL = 1e-5


@nnx.jit
def decode_once(model, ids, mask, positions, vision, cache, last_tok, decode_pos):
    _, cache = model(ids, positions=positions, attention_mask=mask, vision=vision, cache=cache, cache_index=0)
    B, T = ids.shape
    logits, _ = model(last_tok, positions=decode_pos, attention_mask=jnp.ones((B, 1), jnp.int32), cache=cache,
                      cache_index=T)
    return logits


@pytest.fixture(scope="module")
def setup():
    cfg = ModelConfig.tiny(vocab_size=96, tie_word_embeddings=False,
                           lora=LoRAConfig(rank=4, alpha=8.0, dropout=0.0, vision_rank=2, vision_alpha=4.0))
    model = create_model(cfg, seed=5)
    rng = np.random.default_rng(0)
    for layer in lora_layers(model):
        if layer.rank:
            layer.lora_b[...] = jnp.asarray(0.3 * rng.standard_normal(layer.lora_b[...].shape), jnp.float32)
    ids, mask, pixels, grids = tiny_image_batch(cfg)
    # 8 rows so the batch really splits over 8 devices
    ids, mask = np.tile(ids, (4, 1)), np.tile(mask, (4, 1))
    grids = np.tile(grids, (4, 1))
    pixels = np.concatenate([pixels] * 4)
    pos, deltas = model.get_rope_index(ids, grids, mask)
    vision = prepare_vision_inputs(pixels, grids, cfg.vision)
    args = (jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), jnp.asarray(pos), vision)
    ref = np.asarray(jit_forward(model, *args))
    last = jnp.asarray(ids[:, -1:], jnp.int32)
    dpos = decode_positions(jnp.asarray(mask.sum(1)), jnp.asarray(deltas))
    ref_dec = np.asarray(decode_once(model, *args, model.init_cache(8, ids.shape[1] + 1), last, dpos))
    return model, args, mask, ref, (last, dpos), ref_dec


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2)])
@pytest.mark.slow
def test_sharded_forward_equals_single_device(setup, shape):
    model, args, mask, ref, (last, dpos), ref_dec = setup
    mesh = make_mesh(*shape)
    sharded = shard_model(nnx.clone(model), mesh)
    kernel = sharded.layers[0].mlp.gate_proj.kernel[...]
    assert kernel.sharding.spec == logical_to_spec(("embed", "mlp"), kernel.shape, mesh)
    if shape == (2, 2, 2):
        assert kernel.sharding.spec == P("fsdp", "tensor")
        assert sharded.embed_tokens.embedding[...].sharding.spec == P("tensor", "fsdp")
    with jax.set_mesh(mesh):
        out = jit_forward(sharded, *args)
        if shape == (2, 2, 2):  # the cache path once, on the mesh that splits every axis
            dec = decode_once(sharded, *args, sharded.init_cache(8, args[0].shape[1] + 1), last, dpos)
            assert float(np.abs(np.asarray(dec) - ref_dec).max()) < TOL
    assert out.sharding.spec[0] is not None  # batch split
    assert max_err_real(out, ref, mask) < TOL


def test_from_pretrained_on_mesh(setup, tmp_path):
    model, args, mask, ref, _, _ = setup
    save_pretrained(model, tmp_path)  # adapters merged into the kernels
    mesh = make_mesh(2, 2, 2)
    loaded = from_pretrained(tmp_path, mesh=mesh, lora=model.cfg.lora)
    q = loaded.layers[1].self_attn.q_proj
    assert q.kernel[...].sharding.spec == P("fsdp", "tensor")
    assert q.lora_a[...].sharding.mesh.shape == mesh.shape
    with jax.set_mesh(mesh):
        out = jit_forward(loaded, *args)
    assert max_err_real(out, ref, mask) < 1e-4


def test_rules_drop_axes_that_do_not_divide():
    mesh = make_mesh(2, 2, 2)
    assert logical_to_spec(("batch", "seq", "act_embed"), (8, 5, 4), mesh) == P(("data", "fsdp"), None, None)
    assert logical_to_spec(("batch",), (6,), mesh) == P("data")  # 6 splits 2 ways, not 4
    assert logical_to_spec(("embed", "vocab"), (3, 7), mesh) == P(None, None)
    with pytest.raises(ValueError, match="needs 16 devices"):
        make_mesh(4, 2, 2)
