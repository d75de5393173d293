"""models/rope.py held to transformers' own functions, one at a time, on random inputs: the decoder's M-RoPE cos / sin
(Qwen3-VL's interleaved sections, Qwen2.5-VL's contiguous ones), the vision tower's axial cos / sin, the rotation,
and the 3-D positions of left-padded multimodal rows (images, Qwen3-VL's timestamped frame groups, Qwen2.5-VL's
videos at tokens_per_second * second_per_grid) against `get_rope_index` of Qwen3VLModel and Qwen2_5_VLModel, called
on a stand-in holding only the config values they read. The whole-model parity tests (test_model_parity.py,
test_qwen2_5_video.py) reach the same code through a forward; these take a second and name the function that
differs. Tolerances: positions exact; the rotation 1e-6; cos / sin 1e-6 + 2e-7 * the largest position: both sides
take the angle as position * inv_freq in float32, but inv_freq = theta ** (-2i / d) is float32 pow on both, numpy's
and torch's, which differ by one ulp (relative 1.5e-7) on about a fifth of the frequencies."""

from __future__ import annotations

from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as q25
from transformers.models.qwen3_vl import modeling_qwen3_vl as q3

from spatial_jax.models.rope import (
    apply_rotary,
    decode_positions,
    get_rope_index,
    mrope_axis_of_frequency,
    mrope_cos_sin,
    vision_cos_sin,
)

IMG, VID, TEXT = 90, 91, 60  # token ids: text tokens are drawn below TEXT
START, END = 70, 71  # <|vision_start|>, <|vision_end|>: text around every picture, so no two pictures' runs touch
M = 2  # spatial_merge_size


def _text_rope(cls, head_dim: int, theta: float, section: list[int]):
    cfg = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": theta, "mrope_section": section},
                          head_dim=head_dim, max_position_embeddings=32768)
    return cls(cfg)


@pytest.mark.parametrize(("cls", "interleaved", "head_dim", "section"), [
    (q3.Qwen3VLTextRotaryEmbedding, True, 128, [24, 20, 20]),  # Qwen3-VL's released sections
    (q3.Qwen3VLTextRotaryEmbedding, True, 32, [6, 5, 5]),
    (q3.Qwen3VLTextRotaryEmbedding, True, 32, [6, 6, 4]),  # h and w apart: each bound read from its own section
    (q25.Qwen2_5_VLRotaryEmbedding, False, 128, [16, 24, 24]),  # Qwen2.5-VL's
    (q25.Qwen2_5_VLRotaryEmbedding, False, 32, [4, 6, 6])])
def test_decoder_cos_sin_equal_transformers(cls, interleaved, head_dim, section):
    theta = 5_000_000.0
    positions = np.random.default_rng(head_dim).integers(0, 4000, (3, 2, 7))
    cos, sin = mrope_cos_sin(jnp.asarray(positions), head_dim, theta, tuple(section), interleaved)
    ref_cos, ref_sin = _text_rope(cls, head_dim, theta, section)(torch.zeros(1), torch.from_numpy(positions))
    assert cos.shape == (2, 7, head_dim)
    atol = 1e-6 + 2e-7 * positions.max()
    np.testing.assert_allclose(np.asarray(cos), ref_cos.numpy(), atol=atol, rtol=0)
    np.testing.assert_allclose(np.asarray(sin), ref_sin.numpy(), atol=atol, rtol=0)
    # which axis drives each frequency, from the same recomposition: a position moved on one axis only
    axis = mrope_axis_of_frequency(head_dim, tuple(section), interleaved)
    for a in range(3):
        moved = positions.copy()
        moved[a] += 1
        _, s2 = mrope_cos_sin(jnp.asarray(moved), head_dim, theta, tuple(section), interleaved)
        changed = np.any(np.asarray(s2)[..., : head_dim // 2] != np.asarray(sin)[..., : head_dim // 2], axis=(0, 1))
        np.testing.assert_array_equal(changed, axis == a)


def test_vision_cos_sin_equal_transformers():
    head_dim, theta = 40, 10000.0
    rope = q3.Qwen3VLVisionRotaryEmbedding(SimpleNamespace(rope_parameters={"rope_type": "axial",
                                                                            "rope_theta": theta}, head_dim=head_dim))
    rows_cols = np.random.default_rng(0).integers(0, 64, (11, 2))
    cos, sin = vision_cos_sin(jnp.asarray(rows_cols), head_dim, theta)
    ref_cos, ref_sin = rope(torch.zeros(1), torch.from_numpy(rows_cols))
    atol = 1e-6 + 2e-7 * rows_cols.max()
    np.testing.assert_allclose(np.asarray(cos), ref_cos.numpy(), atol=atol, rtol=0)
    np.testing.assert_allclose(np.asarray(sin), ref_sin.numpy(), atol=atol, rtol=0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_rotation_equals_transformers(dtype):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 5, 3, 16)).astype(np.float32)  # [B, S, H, D]
    angles = rng.uniform(-3, 3, (2, 5, 8)).astype(np.float32)
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    got = apply_rotary(jnp.asarray(x, dtype), jnp.asarray(cos), jnp.asarray(sin))
    assert got.dtype == dtype
    q = torch.from_numpy(np.asarray(jnp.asarray(x, dtype).astype(jnp.float32))).transpose(1, 2)  # HF: [B, H, S, D]
    ref, _ = q3.apply_rotary_pos_emb(q, q, torch.from_numpy(cos), torch.from_numpy(sin))
    want = jnp.asarray(ref.transpose(1, 2).numpy()).astype(dtype)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=1e-6, rtol=0)


class _Stand:
    """What transformers' get_rope_index reads of its model: the merge size, tokens_per_second, and the helper."""

    def __init__(self, cls, tokens_per_second: float = 0.0):
        self.cls = cls
        self.config = SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=M,
                                                                    tokens_per_second=tokens_per_second))

    def get_vision_position_ids(self, *args, **kwargs):
        return self.cls.get_vision_position_ids(self, *args, **kwargs)

    def get_rope_index(self, *args, **kwargs):
        return self.cls.get_rope_index(self, *args, **kwargs)


def _rows(seed: int, qwen25: bool):
    """A left-padded batch of random rows: text runs, images and videos in random order. Returns ids, mask, our
    items (prompt order, a Qwen3-VL video as one [1, h, w] item per frame group), transformers' image and video
    grids, and the seconds per temporal patch (ours per item, transformers' per video)."""
    rng = np.random.default_rng(seed)
    rows, items, images, videos, spg_items, spg_videos = [], [], [], [], [], []
    for _ in range(3):
        row = []
        for _ in range(rng.integers(1, 6)):
            kind = rng.choice(["text", "image", "video"], p=[0.5, 0.25, 0.25])
            h, w = (int(x) * M for x in rng.integers(1, 4, 2))
            if kind == "text":
                row += list(rng.integers(0, TEXT, rng.integers(1, 5)))
            elif kind == "image":
                row += [START] + [IMG] * (h * w // M**2) + [END]
                items.append((1, h, w)), images.append((1, h, w)), spg_items.append(0.0)
            else:
                t = int(rng.integers(1, 4))
                videos.append((t, h, w))
                spg = float(rng.choice([0.5, 1.0, 1.5, 2.0]))
                spg_videos.append(spg)
                if qwen25:  # one run of t temporal patches
                    row += [START] + [VID] * (t * h * w // M**2) + [END]
                    items.append((t, h, w)), spg_items.append(spg)
                else:  # a frame group per temporal patch, each behind its timestamp's text
                    for _ in range(t):
                        row += list(rng.integers(0, TEXT, 2)) + [START] + [VID] * (h * w // M**2) + [END]
                        items.append((1, h, w)), spg_items.append(0.0)
        rows.append(row)
    T = max(map(len, rows)) + 2
    ids = np.zeros((3, T), np.int64)
    mask = np.zeros((3, T), np.int64)
    for b, row in enumerate(rows):
        ids[b, T - len(row):], mask[b, T - len(row):] = row, 1
    return ids, mask, np.asarray(items, np.int64).reshape(-1, 3), images, videos, spg_items, spg_videos


def _theirs(stand, ids, mask, images, videos, **kw):
    types = (np.where(ids == IMG, 1, 0) + np.where(ids == VID, 2, 0)) * mask
    grid = (lambda g: torch.tensor(g, dtype=torch.long) if g else None)
    with torch.no_grad():
        pos, deltas = stand.get_rope_index(torch.from_numpy(ids), torch.from_numpy(types),
                                           image_grid_thw=grid(images), video_grid_thw=grid(videos),
                                           attention_mask=torch.from_numpy(mask), **kw)
    return pos.numpy(), deltas.numpy().reshape(-1)


@pytest.mark.parametrize("seed", range(6))
def test_qwen3_vl_positions_equal_transformers(seed):
    ids, mask, items, images, videos, _, _ = _rows(seed, qwen25=False)
    pos, deltas = get_rope_index(ids, items, mask, image_token_id=IMG, spatial_merge_size=M, video_token_id=VID)
    want_pos, want_deltas = _theirs(_Stand(q3.Qwen3VLModel), ids, mask, images, videos)
    np.testing.assert_array_equal(pos[:, mask > 0], want_pos[:, mask > 0])
    np.testing.assert_array_equal(pos[:, mask == 0], 0)
    np.testing.assert_array_equal(deltas, want_deltas)
    assert pos.dtype == deltas.dtype == np.int32


@pytest.mark.parametrize("seed", range(6))
def test_qwen2_5_vl_positions_equal_transformers(seed):
    ids, mask, items, images, videos, spg_items, spg_videos = _rows(100 + seed, qwen25=True)
    pos, deltas = get_rope_index(ids, items, mask, image_token_id=IMG, spatial_merge_size=M, video_token_id=VID,
                                 tokens_per_second=2.0, second_per_grid=spg_items)
    want_pos, want_deltas = _theirs(_Stand(q25.Qwen2_5_VLModel, 2.0), ids, mask, images, videos,
                                    second_per_grid_ts=torch.tensor(spg_videos) if videos else None)
    np.testing.assert_array_equal(pos[:, mask > 0], want_pos[:, mask > 0])
    np.testing.assert_array_equal(deltas, want_deltas)
    if videos:  # one second per temporal patch where no seconds are given, as transformers' default
        ones = get_rope_index(ids, items, mask, image_token_id=IMG, spatial_merge_size=M, video_token_id=VID,
                              tokens_per_second=2.0)[0]
        want = _theirs(_Stand(q25.Qwen2_5_VLModel, 2.0), ids, mask, images, videos)[0]
        np.testing.assert_array_equal(ones[:, mask > 0], want[:, mask > 0])


def test_text_rows_and_an_empty_row():
    ids = np.array([[0, 0, 5, 6, 7], [0, 0, 0, 0, 0]])
    mask = np.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    pos, deltas = get_rope_index(ids, None, mask, image_token_id=IMG, spatial_merge_size=M)
    np.testing.assert_array_equal(pos[:, 0], [[0, 0, 0, 1, 2]] * 3)
    np.testing.assert_array_equal(pos[:, 1], 0)
    np.testing.assert_array_equal(deltas, [0, 0])
    # no mask: every token is real; video tokens without a video id are text
    pos, _ = get_rope_index(np.array([[1, VID, 2]]), None, None, image_token_id=IMG, spatial_merge_size=M)
    np.testing.assert_array_equal(pos[:, 0], [[0, 1, 2]] * 3)


def test_decode_positions_continue_each_row():
    """The n-th real token sits at n + rope_delta on all three axes (the image row's delta from get_rope_index)."""
    ids = np.array([[5, IMG, IMG, IMG, IMG, 6], [0, 0, 5, 6, 7, 8]])
    mask = np.array([[1] * 6, [0, 0, 1, 1, 1, 1]])
    pos, deltas = get_rope_index(ids, [[1, 4, 4]], mask, image_token_id=IMG, spatial_merge_size=M)
    np.testing.assert_array_equal(deltas, [pos[0, 0].max() + 1 - 6, 0])
    nxt = np.asarray(decode_positions(jnp.asarray([6, 4]), jnp.asarray(deltas)))
    assert nxt.shape == (3, 2, 1) and nxt.dtype == np.int32
    np.testing.assert_array_equal(nxt[:, :, 0], [[pos[0, 0].max() + 1, 4]] * 3)


@pytest.mark.parametrize(("ids", "grids", "kw", "message"), [
    (np.array([5, 6]), None, {}, "input_ids must be [B, T], got shape (2,)"),
    (np.array([[5, IMG, 6]]), None, {}, "row 0 has more images than image_grid_thw (0)"),
    (np.array([[5, IMG, IMG, 6]]), [[1, 2, 2]], {},
     "row 0: image 0 with grid (1, 2, 2) needs 1 image tokens, found a run of 2"),
    (np.array([[5, IMG, 6]]), [[1, 2, 2], [1, 2, 2]], {}, "image_grid_thw has 2 images but the batch holds 1"),
    (np.array([[5, IMG, 6]]), [[1, 2, 2]], {"second_per_grid": [1.0, 2.0]},
     "second_per_grid has 2 values for 1 visual items")])
def test_inputs_that_disagree_are_refused(ids, grids, kw, message):
    with pytest.raises(ValueError) as e:
        get_rope_index(ids, grids, None, image_token_id=IMG, spatial_merge_size=M, **kw)
    assert str(e.value) == message


def test_video_times_floor_a_float32_product_as_transformers():
    """A video's k-th temporal patch sits at floor(k * tokens_per_second * second_per_grid) taken in float32, as
    transformers takes it: with 2 tokens a second and 0.35 s a patch, patch 10 is at 7 (float32's 10 * 0.7 is 7.0;
    in float64 it is 6.9999999)."""
    t, h, w = 11, 2, 2
    ids = np.array([[5, START] + [VID] * t + [END, 6]])
    mask = np.ones_like(ids)
    pos, _ = get_rope_index(ids, [[t, h, w]], mask, image_token_id=IMG, spatial_merge_size=M, video_token_id=VID,
                            tokens_per_second=2.0, second_per_grid=[0.35])
    want, _ = _theirs(_Stand(q25.Qwen2_5_VLModel, 2.0), ids, mask, [], [(t, h, w)],
                      second_per_grid_ts=torch.tensor([0.35]))
    np.testing.assert_array_equal(pos, want)
    assert pos[0, 0, 2 + 10] - pos[0, 0, 2] == 7
