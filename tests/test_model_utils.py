"""Shared builders for the model tests (tiny random transformers Qwen3-VL models, batches in HF layout), plus tests
of the config translation, the safetensors container and host-side vision metadata."""

from __future__ import annotations

import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx

from spatial_jax.models import ModelConfig, prepare_vision_inputs
from spatial_jax.models.hf_io import read_safetensors_header, read_tensor, write_safetensors
from spatial_jax.models.registry import config_from_hf, config_to_hf

IMG, VID, VSTART, VEND = 120, 121, 122, 123
VOCAB = 128

# Two architectures that differ in every switch the parity must cover.
VARIANTS = {
    "tied_gqa2": dict(
        text=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3],
                                       mrope_interleaved=True)),
        vision=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, temporal_patch_size=2,
                    spatial_merge_size=2, out_hidden_size=32, num_position_embeddings=16,
                    deepstack_visual_indexes=[0, 1]),
        tie=True,
    ),
    "untied_gqa4": dict(
        text=dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=12,
                  rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=[2, 2, 2],
                                       mrope_interleaved=True)),
        vision=dict(depth=2, hidden_size=24, intermediate_size=40, num_heads=2, patch_size=2, temporal_patch_size=2,
                    spatial_merge_size=2, out_hidden_size=48, num_position_embeddings=36,
                    deepstack_visual_indexes=[1], hidden_act="gelu_pytorch_tanh"),
        tie=False,
    ),
}


def hf_model(variant: str, seed: int = 0, vocab_size: int | None = None, token_ids: dict | None = None):
    """A random transformers Qwen3VLForConditionalGeneration in float32 with every parameter perturbed; a tokenizer's
    vocabulary size and special-token ids replace the variant's when given."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    v = VARIANTS[variant]
    text = {**v["text"], "vocab_size": vocab_size} if vocab_size else dict(v["text"])
    ids = token_ids or dict(image_token_id=IMG, video_token_id=VID, vision_start_token_id=VSTART,
                            vision_end_token_id=VEND)
    cfg = Qwen3VLConfig(text_config=text, vision_config=dict(v["vision"]), tie_word_embeddings=v["tie"], **ids)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def patch_dim(variant: str) -> int:
    v = VARIANTS[variant]["vision"]
    return 3 * v["temporal_patch_size"] * v["patch_size"] ** 2


def image_batch(variant: str, seed: int = 0):
    """Two left-padded rows, images of grids (1,4,4) [row 0] and (1,2,6) then (1,4,2) [row 1]."""
    rng = np.random.default_rng(seed)
    grids = np.array([[1, 4, 4], [1, 2, 6], [1, 4, 2]])
    n_tok = grids.prod(-1) // 4
    row0 = [5, 6, VSTART] + [IMG] * n_tok[0] + [VEND, 7, 8, 9, 10]
    row1 = [11, VSTART] + [IMG] * n_tok[1] + [VEND, 12, VSTART] + [IMG] * n_tok[2] + [VEND, 13]
    T = max(len(row0), len(row1)) + 2
    ids = np.zeros((2, T), np.int64)
    mask = np.zeros((2, T), np.int64)
    for b, row in enumerate((row0, row1)):
        ids[b, T - len(row):] = row
        mask[b, T - len(row):] = 1
    ids[mask == 0] = rng.integers(0, 100, size=int((mask == 0).sum()))  # padding content must not matter
    pixels = rng.standard_normal((int(grids.prod(-1).sum()), patch_dim(variant))).astype(np.float32)
    return ids, mask, pixels, grids


def text_batch(seed: int = 1, B: int = 3, T: int = 9):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 100, size=(B, T))
    mask = np.ones((B, T), np.int64)
    mask[1, :3] = 0
    mask[2, :T - 2] = 0
    return ids, mask


def hf_logits(model, ids, mask, positions, pixels=None, grids=None) -> np.ndarray:
    kwargs = {}
    if pixels is not None:
        kwargs = dict(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grids),
                      mm_token_type_ids=torch.from_numpy((ids == IMG).astype(np.int64)))
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    position_ids=torch.from_numpy(np.asarray(positions, np.int64)), **kwargs)
    return out.logits.numpy()


@nnx.jit(static_argnames=("return_hidden",))
def jit_forward(model, ids, mask, positions=None, vision=None, return_hidden=False):
    """One compiled forward shared by the tests (cache hits across models of the same structure)."""
    return model(ids, positions=positions, attention_mask=mask, vision=vision, return_hidden=return_hidden)[0]


def forward(model, ids, mask, pixels=None, grids=None, positions=None, return_hidden=False) -> np.ndarray:
    """Our logits (or hidden states) with host-side positions / vision inputs, through `jit_forward`."""
    vision = None
    if pixels is not None:
        vision = prepare_vision_inputs(pixels, grids, model.cfg.vision)
        if positions is None:
            positions, _ = model.get_rope_index(ids, grids, mask)
    return np.asarray(jit_forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32),
                                  None if positions is None else jnp.asarray(positions), vision, return_hidden))


def max_err_real(a, b, mask) -> float:
    """Largest |a - b| over real (unpadded) positions."""
    return float(np.abs(np.asarray(a) - np.asarray(b))[np.asarray(mask) > 0].max())


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_config_from_hf_and_back(variant):
    model = hf_model(variant)
    d = json.loads(model.config.to_json_string())
    cfg = config_from_hf(d)
    v = VARIANTS[variant]
    assert cfg.tie_word_embeddings is v["tie"]
    assert cfg.text.mrope_section == tuple(v["text"]["rope_parameters"]["mrope_section"])
    assert cfg.vision.deepstack_visual_indexes == tuple(v["vision"]["deepstack_visual_indexes"])
    assert cfg.image_token_id == IMG and cfg.vision_end_token_id == VEND
    assert config_from_hf(config_to_hf(cfg)) == cfg


def test_config_takes_project_overrides():
    from spatial_jax.config import ConfigError, apply_overrides

    cfg = apply_overrides(ModelConfig.tiny(), ["lora.rank=8", "lora.targets=q_proj,v_proj", "dtype=bfloat16",
                                               "text.mrope_section=[4,2,2]"])
    assert cfg.lora.rank == 8 and cfg.lora.targets == ("q_proj", "v_proj") and cfg.dtype == "bfloat16"
    hash(cfg)  # static NNX attribute: must be hashable
    with pytest.raises(ConfigError):
        apply_overrides(cfg, ["lora.targets=lm_head"])


def test_config_validation():
    with pytest.raises(ValueError, match="mrope_section"):
        ModelConfig.tiny().text.__class__(head_dim=16, mrope_section=(4, 4, 4))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ModelConfig.tiny(vocab_size=64, image_token_id=70)
    with pytest.raises(ValueError, match="model_type"):
        config_from_hf({"model_type": "llama"})


def test_tiny_is_small():
    import jax

    from spatial_jax.models import Qwen3VL

    model = Qwen3VL(ModelConfig.tiny(vocab_size=300), rngs=nnx.Rngs(0))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert n < 1_000_000
    assert model.cfg.image_token_id == 296


def test_safetensors_roundtrip_bf16(tmp_path):
    from safetensors import safe_open

    rng = np.random.default_rng(0)
    tensors = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "b": rng.standard_normal((7,)).astype(ml_dtypes.bfloat16),
        "c": np.arange(6, dtype=np.int64).reshape(2, 3),
    }
    f = tmp_path / "x.safetensors"
    write_safetensors(f, tensors)
    header, start = read_safetensors_header(f)
    for k, v in tensors.items():
        np.testing.assert_array_equal(read_tensor(f, header, start, k), v)
    with safe_open(str(f), framework="pt") as g:  # the reference reader agrees, bf16 included
        assert g.get_tensor("b").dtype == torch.bfloat16
        np.testing.assert_array_equal(g.get_tensor("b").float().numpy(), tensors["b"].astype(np.float32))
        np.testing.assert_array_equal(g.get_tensor("a").numpy(), tensors["a"])


def test_vision_metadata_matches_hf_helpers():
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights, get_vision_position_ids

    cfg = config_from_hf(json.loads(hf_model("untied_gqa4").config.to_json_string())).vision
    grids = np.array([[1, 4, 6], [2, 2, 2], [1, 8, 4]])
    pixels = np.zeros((int(grids.prod(-1).sum()), cfg.patch_dim), np.float32)
    vi = prepare_vision_inputs(pixels, grids, cfg, buckets=(16, 64), num_frames=6)
    g = torch.from_numpy(grids)
    idx, w = get_vision_interpolation_indices_and_weights(g, num_grid_per_side=6, mode="bilinear", align_corners=True,
                                                          spatial_merge_size=2)
    # one slot of 64 patches (the bucket holding the largest frame, 32) per frame: 4 frames + 2 padding slots
    seg = np.asarray(vi.segment_ids)
    assert seg.shape == (6, 64) and seg.sum(1).tolist() == [24, 4, 4, 32, 0, 0]
    real = seg > 0  # frames' patches in HF order, slot by slot
    np.testing.assert_array_equal(np.asarray(vi.interp_idx)[real], idx.numpy())
    np.testing.assert_allclose(np.asarray(vi.interp_weight)[real], w.numpy(), atol=1e-7)
    np.testing.assert_array_equal(np.asarray(vi.rot_pos)[real], get_vision_position_ids(g, 2).numpy())
    # the k-th real merged feature sits at slot f, position j < n_f / 4 (16 merged features per slot)
    assert np.asarray(vi.feature_index)[:16].tolist() == [*range(6), 16, 32, *range(48, 56)]
    with pytest.raises(ValueError, match="covers"):
        prepare_vision_inputs(pixels[:-1], grids, cfg)


QWEN3_VL_8B_CONFIG = {  # the published Qwen3-VL-8B config.json (legacy rope_scaling layout)
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "tie_word_embeddings": False,
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "text_config": {
        "attention_bias": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 12288, "max_position_embeddings": 262144, "model_type": "qwen3_vl_text",
        "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000, "vocab_size": 151936, "dtype": "bfloat16",
    },
    "vision_config": {
        "deepstack_visual_indexes": [8, 16, 24], "depth": 27, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152,
        "in_channels": 3, "intermediate_size": 4304, "model_type": "qwen3_vl", "num_heads": 16,
        "num_position_embeddings": 2304, "out_hidden_size": 4096, "patch_size": 16, "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}


def test_8b_architecture_names_and_shapes_match_transformers():
    """Every tensor of the real 8B layout (built abstractly on both sides) has the same name and shape."""
    import jax
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from spatial_jax.models import Qwen3VL
    from spatial_jax.models.hf_io import hf_name

    with torch.device("meta"):
        hf = Qwen3VLForConditionalGeneration(Qwen3VLConfig.from_dict(QWEN3_VL_8B_CONFIG))
    hf_shapes = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    cfg = config_from_hf(QWEN3_VL_8B_CONFIG, dtype="bfloat16")
    assert (cfg.text.rope_theta, cfg.text.mrope_section) == (5_000_000.0, (24, 20, 20))
    model = nnx.eval_shape(lambda: Qwen3VL(cfg))
    ours = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        shape = tuple(var.get_value().shape)
        if path[-1] == "kernel":
            v = cfg.vision
            shape = ((v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
                     if path[:2] == ("visual", "patch_embed") else shape[::-1])
        elif path == ("lm_head",):
            shape = shape[::-1]
        ours[hf_name(path)] = shape
    assert ours == hf_shapes
    assert sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))) == 8_767_123_696
