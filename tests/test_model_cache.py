"""KV-cache path: prefill + one-token decode steps under one jit trace give the full forward's logits (1e-4) and
the same greedy tokens as transformers' generate(do_sample=False) on a left-padded batch with images."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from test_model_utils import IMG, forward, hf_model, image_batch, text_batch

from spatial_jax.models import decode_positions, prepare_vision_inputs
from spatial_jax.models.hf_io import from_pretrained

TOL = 1e-4
NEW_TOKENS = 6
TRACES = {"step": 0}


@nnx.jit
def cached_step(model, ids, mask, positions, vision, cache, index):
    TRACES["step"] += 1  # runs only while tracing
    return model(ids, positions=positions, attention_mask=mask, vision=vision, cache=cache, cache_index=index)


def greedy(model, ids, mask, pixels=None, grids=None, n_new=NEW_TOKENS):
    """Test-only greedy loop over the cache API: returns generated tokens [B, n_new] and their logits."""
    B, T = ids.shape
    positions, deltas = model.get_rope_index(ids, grids, mask)
    vision = None if pixels is None else prepare_vision_inputs(pixels, grids, model.cfg.vision)
    cache = model.init_cache(B, T + n_new)
    logits, cache = cached_step(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32),
                                jnp.asarray(positions), vision, cache, jnp.int32(0))
    step_logits = [logits[:, -1]]
    tokens = [jnp.argmax(logits[:, -1], -1)]
    n_real = jnp.asarray(mask.sum(1), jnp.int32)
    for s in range(n_new - 1):
        pos = decode_positions(n_real + s, jnp.asarray(deltas))
        logits, cache = cached_step(model, tokens[-1][:, None].astype(jnp.int32), jnp.ones((B, 1), jnp.int32), pos,
                                    None, cache, jnp.int32(T + s))
        step_logits.append(logits[:, -1])
        tokens.append(jnp.argmax(logits[:, -1], -1))
    return np.stack([np.asarray(t) for t in tokens], 1), np.stack([np.asarray(x) for x in step_logits], 1)


_PAIRS: dict = {}


def pair_for(variant, tmp_path_factory):
    """(variant, HF model, our model loaded from its checkpoint), built once per variant."""
    if variant not in _PAIRS:
        hf = hf_model(variant, seed=5)
        path = tmp_path_factory.mktemp(variant)
        hf.save_pretrained(path)
        _PAIRS[variant] = (variant, hf, from_pretrained(path))
    return _PAIRS[variant]


# Each variant's parity is covered in test_model_parity; here one variant per path keeps the file fast.
def test_cache_matches_full_forward_and_hf_generate(tmp_path_factory):
    variant, hf, ours = pair_for("tied_gqa2", tmp_path_factory)
    ids, mask, pixels, grids = image_batch(variant, seed=7)
    before = TRACES["step"]
    tokens, step_logits = greedy(ours, ids, mask, pixels, grids)
    assert TRACES["step"] - before <= 2  # one prefill trace + one decode trace shared by every step

    # the same continuation through the cache-free forward
    full_ids = np.concatenate([ids, tokens], 1)
    full_mask = np.concatenate([mask, np.ones_like(tokens)], 1)
    full = forward(ours, full_ids, full_mask, pixels, grids)
    T = ids.shape[1]
    assert np.abs(full[:, T - 1:T + NEW_TOKENS - 1] - step_logits).max() < TOL

    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
            pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grids),
            mm_token_type_ids=torch.from_numpy((ids == IMG).astype(np.int64)),
            max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0,
        )
    np.testing.assert_array_equal(out[:, T:].numpy(), tokens)


def test_text_only_cache(tmp_path_factory):
    _, hf, ours = pair_for("untied_gqa4", tmp_path_factory)
    ids, mask = text_batch(seed=4)
    tokens, step_logits = greedy(ours, ids, mask)
    with torch.no_grad():
        out = hf.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                          max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    np.testing.assert_array_equal(out[:, ids.shape[1]:].numpy(), tokens)
    full = forward(ours, np.concatenate([ids, tokens], 1), np.concatenate([mask, np.ones_like(tokens)], 1))
    T = ids.shape[1]
    assert np.abs(full[:, T - 1:T + NEW_TOKENS - 1] - step_logits).max() < TOL


def test_cache_argument_errors(tmp_path_factory):
    _, _, ours = pair_for("untied_gqa4", tmp_path_factory)
    ids, mask = text_batch()
    with pytest.raises(ValueError, match="cache and cache_index"):
        ours(ids, attention_mask=mask, cache=ours.init_cache(ids.shape[0], 16))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ours(ids + ours.cfg.text.vocab_size, attention_mask=mask)
    with pytest.raises(ValueError, match="positions are required"):
        ours(ids, attention_mask=mask, cache=ours.init_cache(ids.shape[0], 16), cache_index=0)
