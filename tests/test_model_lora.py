"""LoRA: zero-initialised B leaves the logits unchanged; adapters off = base; merged equals unmerged with random B;
only LoRAParam variables are trainable; dropout only in the training view; merged export loads in transformers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from test_model_utils import forward, jit_forward, max_err_real, text_batch

from spatial_jax.models import LoRAConfig, LoRAParam, ModelConfig, create_model, disable_adapters, merge_lora
from spatial_jax.models.hf_io import from_pretrained, save_pretrained
from spatial_jax.models.lora import lora_layers, lora_param_count

TOL = 1e-4
IDENT = 1e-5  # mathematically equal graphs; XLA may fuse the zero adapter path differently (~1e-6 seen)
LORA = LoRAConfig(rank=4, alpha=8.0, dropout=0.1, vision_rank=2, vision_alpha=4.0)


def tiny_image_batch(cfg: ModelConfig, seed: int = 0):
    rng = np.random.default_rng(seed)
    grids = np.array([[1, 4, 4], [1, 2, 2]])
    img = cfg.image_token_id
    rows = [[3, cfg.vision_start_token_id] + [img] * 4 + [cfg.vision_end_token_id, 5, 6],
            [7, 8, cfg.vision_start_token_id, img, cfg.vision_end_token_id, 9]]
    T = 10
    ids = np.zeros((2, T), np.int64)
    mask = np.zeros((2, T), np.int64)
    for b, row in enumerate(rows):
        ids[b, T - len(row):] = row
        mask[b, T - len(row):] = 1
    pixels = rng.standard_normal((int(grids.prod(-1).sum()), cfg.vision.patch_dim)).astype(np.float32)
    return ids, mask, pixels, grids


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(base model, the same weights with fresh adapters, checkpoint dir)."""
    base = create_model(ModelConfig.tiny(vocab_size=96, tie_word_embeddings=False), seed=3)
    path = tmp_path_factory.mktemp("lora_base")
    save_pretrained(base, path)
    return base, from_pretrained(path, lora=LORA, seed=1), path


def randomise_b(model, seed=0):
    rng = np.random.default_rng(seed)
    for layer in lora_layers(model):
        if layer.rank:
            layer.lora_b[...] = jnp.asarray(0.3 * rng.standard_normal(layer.lora_b[...].shape), jnp.float32)


def test_adapters_cover_the_targets(models):
    _, lora, _ = models
    state = nnx.state(lora, LoRAParam)
    paths = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(state)}
    cfg = lora.cfg
    per_layer = {f"layers.0.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj")} | {
        f"layers.0.mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")}
    for p in per_layer:
        assert f"{p}.lora_a" in paths and f"{p}.lora_b" in paths
    assert "visual.blocks.1.attn.qkv.lora_a" in paths and "visual.blocks.0.mlp.linear_fc2.lora_b" in paths
    assert not any(p.startswith("visual.merger") or p.startswith("visual.patch_embed") for p in paths)
    n_text = cfg.text.num_hidden_layers * 7 * 2
    n_vision = cfg.vision.depth * 4 * 2
    assert len(paths) == n_text + n_vision
    t, v, r, rv = cfg.text, cfg.vision, LORA.rank, LORA.vision_rank
    q, kv = t.num_attention_heads * t.head_dim, t.num_key_value_heads * t.head_dim
    per_text = r * ((t.hidden_size + q) * 2 + (t.hidden_size + kv) * 2 + (t.hidden_size + t.intermediate_size) * 3)
    per_vision = rv * (v.hidden_size * 4 + v.hidden_size * 2 + (v.hidden_size + v.intermediate_size) * 2)
    assert lora_param_count(lora) == t.num_hidden_layers * per_text + v.depth * per_vision
    assert all(float(jnp.abs(x).max()) == 0.0 for p, x in nnx.to_flat_state(state) if p[-1] == "lora_b")
    # base weights are plain Params, adapters are not part of them
    assert not any(isinstance(v, LoRAParam) for _, v in nnx.to_flat_state(nnx.state(lora, nnx.Not(LoRAParam))))


def test_zero_b_is_identity_and_merge_matches(models, tmp_path):
    base, lora, _ = models
    ids, mask, pixels, grids = tiny_image_batch(base.cfg)
    ref = forward(base, ids, mask, pixels, grids)
    assert max_err_real(forward(lora, ids, mask, pixels, grids), ref, mask) < IDENT

    tuned = nnx.clone(lora)
    randomise_b(tuned)
    out = forward(tuned, ids, mask, pixels, grids)
    assert max_err_real(out, ref, mask) > 1e-2  # the adapters do something, in both towers
    with disable_adapters(tuned):
        assert max_err_real(forward(tuned, ids, mask, pixels, grids), ref, mask) < IDENT
    assert all(layer.adapters_enabled for layer in lora_layers(tuned))

    merged = merge_lora(tuned)
    assert max_err_real(forward(merged, ids, mask, pixels, grids), out, mask) < TOL
    assert max_err_real(forward(tuned, ids, mask, pixels, grids), out, mask) == 0.0  # merge left the original alone

    # export: the merged weights, loadable by transformers, reproduce the adapted model
    from transformers import Qwen3VLForConditionalGeneration

    save_pretrained(tuned, tmp_path)
    hf = Qwen3VLForConditionalGeneration.from_pretrained(tmp_path).float().eval()
    pos, _ = tuned.get_rope_index(ids, grids, mask)
    with torch.no_grad():
        hf_out = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    position_ids=torch.from_numpy(pos.astype(np.int64)), pixel_values=torch.from_numpy(pixels),
                    image_grid_thw=torch.from_numpy(grids),
                    mm_token_type_ids=torch.from_numpy((ids == tuned.cfg.image_token_id).astype(np.int64))).logits
    assert max_err_real(hf_out.numpy(), out, mask) < TOL


def test_only_adapters_get_gradients_and_reference_in_one_trace(models):
    _, lora, _ = models
    model = nnx.clone(lora)
    randomise_b(model, seed=1)
    ids, mask = text_batch(seed=2)
    ids = ids % model.cfg.text.vocab_size
    ids_j, mask_j = jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)

    @nnx.jit
    def loss_and_grad(model):
        def loss_fn(m):
            logits, _ = m(ids_j, attention_mask=mask_j)
            with disable_adapters(m):
                ref, _ = m(ids_j, attention_mask=mask_j)
            return jnp.mean((logits - jax.lax.stop_gradient(ref)) ** 2 * mask_j[..., None]), ref

        return nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, LoRAParam), has_aux=True)(model)

    (loss, ref), grads = loss_and_grad(model)
    with disable_adapters(model):
        eager_ref = forward(model, ids, mask)
    assert max_err_real(ref, eager_ref, mask) < IDENT
    assert float(loss) > 0
    leaves = nnx.to_flat_state(grads)
    assert leaves and all(isinstance(v, LoRAParam) for _, v in leaves)
    assert all(np.isfinite(np.asarray(v.get_value())).all() for _, v in leaves)
    assert max(float(jnp.abs(v.get_value()).max()) for p, v in leaves if p[-1] == "lora_a") > 0


def test_dropout_only_in_training_view(models):
    _, lora, _ = models
    model = nnx.clone(lora)
    randomise_b(model, seed=2)
    ids, mask = text_batch(seed=3)
    ids = ids % model.cfg.text.vocab_size
    a = forward(model, ids, mask)
    np.testing.assert_array_equal(forward(model, ids, mask), a)
    train = nnx.view(model, deterministic=False, raise_if_not_found=False)
    assert all(not layer.lora_dropout.deterministic for layer in lora_layers(train) if layer.rank)
    b = np.asarray(jit_forward(train, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)))
    c = np.asarray(jit_forward(train, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)))
    assert max_err_real(a, b, mask) > 1e-4 and max_err_real(b, c, mask) > 1e-4  # fresh masks each call
    assert all(layer.lora_dropout.deterministic for layer in lora_layers(model) if layer.rank)


def test_lora_config_validation():
    with pytest.raises(ValueError, match="targets"):
        LoRAConfig(rank=4, targets=("q_proj", "lm_head"))
    with pytest.raises(ValueError, match="dropout"):
        LoRAConfig(rank=4, dropout=1.0)
    sc = LoRAConfig.spatialcore()
    assert (sc.rank, sc.alpha, sc.dropout, sc.vision_rank, sc.vision_alpha) == (32, 64.0, 0.05, 4, 8.0)
