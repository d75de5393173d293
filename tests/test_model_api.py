"""The transformers-like public face of spatial_jax.models: from_pretrained / save_pretrained exported from the
package, and `model(input_ids, pixel_values=..., image_grid_thw=..., attention_mask=...)` computing Qwen3-VL's 3-D
rope positions itself, equal to explicit get_rope_index positions and to transformers' own forward."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from test_model_utils import IMG, hf_model, image_batch, max_err_real, text_batch

from spatial_jax.models import ModelConfig, create_model, from_pretrained, prepare_vision_inputs, save_pretrained

TOL = 1e-4
VARIANT = "tied_gqa2"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(HF model, our model loaded from HF's save_pretrained)."""
    hf = hf_model(VARIANT)
    path = tmp_path_factory.mktemp(VARIANT)
    hf.save_pretrained(path)
    return hf, from_pretrained(path)


def test_save_load_round_trip_from_package(tmp_path):
    model = create_model(ModelConfig.tiny(tie_word_embeddings=False), seed=3)
    save_pretrained(model, tmp_path)
    loaded = from_pretrained(tmp_path)
    assert loaded.cfg == model.cfg
    ids, mask = text_batch()
    np.testing.assert_array_equal(np.asarray(loaded(ids, attention_mask=mask)[0]),
                                  np.asarray(model(ids, attention_mask=mask)[0]))


@pytest.mark.slow
def test_transformers_style_call_computes_rope_positions(pair):
    hf, ours = pair
    ids, mask, pixels, grids = image_batch(VARIANT)  # two rows, three images of two grid sizes, left padding
    got = np.asarray(ours(ids, pixel_values=pixels, image_grid_thw=grids, attention_mask=mask)[0])
    pos, _ = ours.get_rope_index(ids, grids, mask)
    explicit = np.asarray(ours(ids, positions=pos, pixel_values=pixels, image_grid_thw=grids, attention_mask=mask)[0])
    np.testing.assert_array_equal(got, explicit)
    # transformers' forward without position_ids: it derives the M-RoPE positions itself too
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                 pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grids),
                 mm_token_type_ids=torch.from_numpy((ids == IMG).astype(np.int64))).logits.numpy()
    assert max_err_real(got, ref, mask) < TOL
    # a prepared VisionInputs plus the grids computes the same positions
    vision = prepare_vision_inputs(pixels, grids, ours.cfg.vision)
    np.testing.assert_array_equal(
        np.asarray(ours(ids, vision=vision, image_grid_thw=grids, attention_mask=mask)[0]), got)


def test_text_only_default_positions_match_rope_index(pair):
    hf, ours = pair
    ids, mask = text_batch()
    pos, _ = ours.get_rope_index(ids, None, mask)
    # the traceable default (cumsum of the mask) equals get_rope_index on a left-padded batch
    np.testing.assert_array_equal(np.broadcast_to(np.maximum(np.cumsum(mask, axis=1) - 1, 0), pos.shape), pos)
    jitted = nnx.jit(lambda m, i, a: m(i, attention_mask=a)[0])(ours, jnp.asarray(ids), jnp.asarray(mask))
    explicit = ours(ids, positions=pos, attention_mask=mask)[0]
    assert max_err_real(jitted, explicit, mask) < 1e-5
    with torch.no_grad():
        ref = hf(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    assert max_err_real(jitted, ref, mask) < TOL


def test_missing_positions_errors(pair):
    _, ours = pair
    ids, mask, pixels, grids = image_batch(VARIANT)
    with pytest.raises(ValueError, match="positions are required with a cache"):
        ours(ids, attention_mask=mask, cache=ours.init_cache(ids.shape[0], 32), cache_index=0)
    vision = prepare_vision_inputs(pixels, grids, ours.cfg.vision)
    with pytest.raises(ValueError, match="positions are required with images"):  # no grids to derive them from
        ours(ids, vision=vision, attention_mask=mask)
    with pytest.raises(ValueError, match="not traced under jit"):
        nnx.jit(lambda m, i, a, v: m(i, attention_mask=a, vision=v, image_grid_thw=grids)[0])(
            ours, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32), vision)
