"""The vision tower per frame: attention inside each frame slot equals the old packed path with a dense
[P, P] block-diagonal mask and transformers' logits (1e-4) on a batch of several grid sizes (a 2-frame grid
included); frame slots are padded to buckets so a new image size reuses the compile; frames shard over the batch
axes; and each prompt's image is encoded once for its G rows, in the train step and in the sampler's prefill,
with results equal to encoding it G times (to float32 rounding: 1e-6 to 2e-6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_model_utils import IMG, VEND, VSTART, forward, hf_logits, hf_model, max_err_real, patch_dim

from spatial_jax.models import ModelConfig, Qwen3VL, prepare_vision_inputs
from spatial_jax.models.attention import AttentionMask, xla
from spatial_jax.models.hf_io import from_pretrained
from spatial_jax.models.rope import apply_rotary, vision_cos_sin
from spatial_jax.models.sharding import make_mesh, shard_model
from spatial_jax.models.vision import VisionTower, bucket_for
from spatial_jax.rl import step as st
from spatial_jax.rollout.sampler import prefill

VARIANT = "tied_gqa2"
# a 16-patch image; a 2-frame grid (two 8-patch frames, attended per frame); a 48-patch image
GRIDS = np.array([[1, 4, 4], [2, 2, 4], [1, 8, 6]])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = hf_model(VARIANT)
    path = tmp_path_factory.mktemp("vision")
    hf.save_pretrained(path)
    return hf, from_pretrained(path)


def grid_batch(seed=0):
    rng = np.random.default_rng(seed)
    n_tok = GRIDS.prod(-1) // 4
    row0 = [5, VSTART] + [IMG] * n_tok[0] + [VEND, 7, 8]
    row1 = [11, VSTART] + [IMG] * n_tok[1] + [VEND, 12, VSTART] + [IMG] * n_tok[2] + [VEND, 13]
    T = max(len(row0), len(row1)) + 1
    ids, mask = np.zeros((2, T), np.int64), np.zeros((2, T), np.int64)
    for b, row in enumerate((row0, row1)):
        ids[b, T - len(row):], mask[b, T - len(row):] = row, 1
    pixels = rng.standard_normal((int(GRIDS.prod(-1).sum()), patch_dim(VARIANT))).astype(np.float32)
    return ids, mask, pixels


def dense_tower(tower: VisionTower, vi, real):
    """The previous implementation: every patch of the batch packed in one sequence, attention under a dense
    [P, P] mask of frame ids (HF's cu_seqlens per frame), the same weights."""
    v = tower.cfg.vision
    frame = jnp.asarray(np.broadcast_to(np.arange(real.shape[0])[:, None], real.shape)[real])
    x = tower.patch_embed(vi.pixel_values[real])
    table = tower.pos_embed[...]
    x = x + jnp.sum(jnp.take(table, vi.interp_idx[real], axis=0) * vi.interp_weight[real][..., None], axis=1)
    hd = v.hidden_size // v.num_heads
    cos, sin = vision_cos_sin(vi.rot_pos[real], hd, v.rope_theta)
    mask = AttentionMask(dense=(frame[:, None] == frame[None, :])[None])
    deepstack = []
    for i, block in enumerate(tower.blocks):
        h = block.norm1(x)
        qkv = block.attn.qkv(h).reshape(-1, 3, v.num_heads, hd)
        q, k, val = apply_rotary(qkv[:, 0], cos, sin), apply_rotary(qkv[:, 1], cos, sin), qkv[:, 2]
        att = xla(q[None], k[None], val[None], mask, scale=hd**-0.5)[0]
        x = x + block.attn.proj(att.reshape(att.shape[0], -1))
        x = x + block.mlp(block.norm2(x))
        if i in v.deepstack_visual_indexes:
            deepstack.append(tower.deepstack_merger_list[v.deepstack_visual_indexes.index(i)](x))
    return tower.merger(x), deepstack


def test_per_frame_attention_equals_dense_mask_and_transformers(pair):
    hf, ours = pair
    ids, mask, pixels = grid_batch()
    vi = prepare_vision_inputs(pixels, GRIDS, ours.cfg.vision, buckets=(16, 64))
    real = np.asarray(vi.segment_ids) > 0
    assert vi.segment_ids.shape == (4, 64) and real.sum(1).tolist() == [16, 8, 8, 48]
    graphdef, state = nnx.split(ours.visual)
    feats, deep = jax.jit(lambda s, vi: nnx.merge(graphdef, s)(vi))(state, vi)
    ref, ref_deep = jax.jit(lambda s, vi: dense_tower(nnx.merge(graphdef, s), vi, real))(state, vi)
    n = int(real.sum()) // 4
    slots = np.asarray(vi.feature_index)[:n]
    np.testing.assert_allclose(np.asarray(feats)[slots], np.asarray(ref), atol=1e-5)
    for a, b in zip(deep, ref_deep, strict=True):
        np.testing.assert_allclose(np.asarray(a)[slots], np.asarray(b), atol=1e-5)
    pos, _ = ours.get_rope_index(ids, GRIDS, mask)
    got = forward(ours, ids, mask, pixels, GRIDS, positions=pos)
    assert np.isfinite(got).all()
    assert max_err_real(got, hf_logits(hf, ids, mask, pos, pixels, GRIDS), mask) < 1e-4


def test_bucketed_frames_reuse_the_compile(pair):
    _, ours = pair
    graphdef, state = nnx.split(ours.visual)
    tower = jax.jit(lambda s, vi: nnx.merge(graphdef, s)(vi)[0])
    rng = np.random.default_rng(1)
    for grids in ([[1, 4, 6], [1, 2, 2]], [[1, 6, 4], [1, 2, 8]], [[1, 8, 8], [1, 4, 2]]):
        grids = np.asarray(grids)
        pixels = rng.standard_normal((int(grids.prod(-1).sum()), patch_dim(VARIANT))).astype(np.float32)
        tower(state, prepare_vision_inputs(pixels, grids, ours.cfg.vision, buckets=(16, 64)))
    assert tower._cache_size() == 1  # largest frames of 24, 24 and 64 patches: all 64-patch slots
    assert [bucket_for(n, (16, 64)) for n in (1, 16, 17, 64, 65, 200)] == [16, 16, 64, 64, 128, 256]
    with pytest.raises(ValueError, match="fewer than"):
        prepare_vision_inputs(np.zeros((16, patch_dim(VARIANT)), np.float32), [[1, 4, 4]], ours.cfg.vision,
                              num_frames=0)


def test_frames_shard_over_the_batch_axes(pair):
    _, ours = pair
    ids, mask, pixels = grid_batch()
    vi = prepare_vision_inputs(pixels, GRIDS, ours.cfg.vision, buckets=(16, 64))
    graphdef, state = nnx.split(ours.visual)
    tower = jax.jit(lambda s, vi: nnx.merge(graphdef, s)(vi)[0])
    want = np.asarray(tower(state, vi))
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    placed = st.shard_batch(vi, mesh)
    assert placed.pixel_values.sharding.spec[0] == ("data", "fsdp")  # 4 frames over 4 batch devices
    with jax.set_mesh(mesh):
        got = tower(nnx.state(shard_model(nnx.clone(ours), mesh).visual), placed)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


# ---------------------------------------------------------------- encode once per prompt

G = 3


def grouped_rows(seed=2):
    """Two prompts (grids (1,4,4) and (1,2,6)) repeated G times each, rows left-padded, plus completions."""
    rng = np.random.default_rng(seed)
    grids = np.array([[1, 4, 4], [1, 2, 6]])
    prompts = [[5, VSTART] + [IMG] * 4 + [VEND, 7], [9, 10, VSTART] + [IMG] * 3 + [VEND, 11, 12]]
    P = max(map(len, prompts))
    ids, mask = np.zeros((2, P), np.int32), np.zeros((2, P), np.int32)
    for b, row in enumerate(prompts):
        ids[b, P - len(row):], mask[b, P - len(row):] = row, 1
    pixels = rng.standard_normal((int(grids.prod(-1).sum()), patch_dim(VARIANT))).astype(np.float32)
    sizes = grids.prod(-1)
    rep_pixels = np.concatenate([pixels[:sizes[0]]] * G + [pixels[sizes[0]:]] * G)
    targets = rng.integers(0, 100, size=(2 * G, 5)).astype(np.int32)
    tmask = np.ones_like(targets)
    tmask[1, 3:] = 0
    return (np.repeat(ids, G, 0), np.repeat(mask, G, 0), rep_pixels, np.repeat(grids, G, 0), targets, tmask,
            np.arange(2 * G) // G)


@pytest.fixture
def tower_frames(monkeypatch):
    """The frame counts the vision tower is called with (traced calls included)."""
    seen = []
    call = VisionTower.__call__

    def spy(self, inputs):
        seen.append(inputs.pixel_values.shape[0])
        return call(self, inputs)

    monkeypatch.setattr(VisionTower, "__call__", spy)
    return seen


def test_train_step_encodes_each_prompt_once(pair, tower_frames):
    _, ours = pair
    ids, mask, pixels, grids, targets, tmask, group = grouped_rows()
    once = st.make_seq_batch(ours.cfg, ids, mask, targets, tmask, pixels, grids, row_group=group)
    each = st.make_seq_batch(ours.cfg, ids, mask, targets, tmask, pixels, grids)
    graphdef, params = nnx.split(ours)
    logp = jax.jit(lambda p, seq: st.target_logprobs(nnx.merge(graphdef, p), seq, 1.0)[0])
    lp1, lp2 = logp(params, once), logp(params, each)
    assert tower_frames == [2, 2 * G]  # one frame per prompt, against one per rollout
    np.testing.assert_allclose(np.asarray(lp1), np.asarray(lp2), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="show different images"):
        st.make_seq_batch(ours.cfg, ids, mask, targets, tmask, pixels, grids, row_group=np.zeros(2 * G))


def test_prefill_encodes_each_prompt_once(pair, tower_frames):
    _, ours = pair
    ids, mask, pixels, grids, _, _, group = grouped_rows()
    once = prefill(ours, ids, mask, pixel_values=pixels, image_grid_thw=grids, max_len=16, row_group=group)
    each = prefill(ours, ids, mask, pixel_values=pixels, image_grid_thw=grids, max_len=16)
    assert tower_frames == [2, 2 * G]
    # equal to float32 rounding (XLA tiles the tower's matmuls by frame count): logits 2e-6 absolute + 1e-6 relative
    # (observed 1.6e-6 at 0.39 on an Intel Xeon host), the cached keys/values (image positions) 5e-6
    np.testing.assert_allclose(np.asarray(once.logits), np.asarray(each.logits), atol=2e-6, rtol=1e-6)
    for a, b in zip(once.cache.keys + once.cache.values, each.cache.keys + each.cache.values, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-6)


def test_shared_rows_must_match_their_features(pair):
    _, ours = pair
    ids, mask, pixels, grids, _, _, group = grouped_rows()
    vi = prepare_vision_inputs(pixels, grids, ours.cfg.vision, row_group=group)
    assert np.asarray(vi.row_feature_start).tolist() == [0] * G + [4] * G
    bad = ids.copy()
    bad[0, -1] = IMG  # one image token too many in row 0
    with pytest.raises(ValueError, match="image tokens"):
        ours(bad, attention_mask=mask, vision=vi, positions=np.zeros((3, *ids.shape), np.int32))


def test_model_config_checks_buckets_and_impl():
    with pytest.raises(ValueError, match="vision_buckets"):
        ModelConfig.tiny().replace(vision_buckets=(64, 16))
    with pytest.raises(ValueError, match="vision_buckets"):
        ModelConfig.tiny().replace(vision_buckets=(6,))
    with pytest.raises(ValueError, match="attention_impl"):
        ModelConfig.tiny().replace(attention_impl="flash")
    assert isinstance(Qwen3VL(ModelConfig.tiny().replace(vision_buckets=(4, 8))), Qwen3VL)
