"""Rotary position embeddings: interleaved 3-D M-RoPE for the decoder, 2-D axial RoPE for the vision tower, and the
host-side (numpy) position ids of a multimodal prompt (HF `Qwen3VLModel.get_rope_index`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [..., S, H, D] rotated by cos/sin [..., S, D] (broadcast over heads), computed in float32."""
    xf = x.astype(jnp.float32)
    cos = cos[..., None, :]
    sin = sin[..., None, :]
    return (xf * cos + rotate_half(xf) * sin).astype(x.dtype)


def mrope_axis_of_frequency(head_dim: int, mrope_section: tuple[int, int, int], interleaved: bool) -> np.ndarray:
    """Which position axis (0 = t, 1 = h, 2 = w) drives each of the head_dim/2 frequencies.

    Qwen3-VL interleaves the axes: frequency i follows h when i % 3 == 1 and i < 3 * section_h, w when
    i % 3 == 2 and i < 3 * section_w, and t otherwise (HF Qwen3VLTextRotaryEmbedding.recomposition_frequencies).
    Qwen2.5-VL (interleaved=False) gives each axis a contiguous run: the first section_t frequencies follow t, the
    next section_h h, the last section_w w (HF Qwen2_5_VLRotaryEmbedding).
    """
    n = head_dim // 2
    if not interleaved:
        return np.repeat(np.arange(3), mrope_section)[:n]
    axis = np.zeros(n, np.int32)
    for i in range(n):
        if i % 3 == 1 and i < 3 * mrope_section[1]:
            axis[i] = 1
        elif i % 3 == 2 and i < 3 * mrope_section[2]:
            axis[i] = 2
    return axis


def mrope_cos_sin(positions: jax.Array, head_dim: int, theta: float, mrope_section: tuple[int, int, int],
                  interleaved: bool) -> tuple[jax.Array, jax.Array]:
    """positions [3, B, T] int -> cos, sin [B, T, head_dim] float32."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    axis = mrope_axis_of_frequency(head_dim, mrope_section, interleaved)
    # Gather (not a one-hot matmul) so the angle is exactly position * inv_freq on every backend.
    pos = jnp.take(positions.astype(jnp.float32), jnp.asarray(axis), axis=0)  # [n, B, T]
    angles = jnp.moveaxis(pos, 0, -1) * jnp.asarray(inv_freq, jnp.float32)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def vision_cos_sin(rot_pos: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """rot_pos [P, 2] (row, col) -> cos, sin [P, head_dim]: the first half of the frequencies follows the row,
    the second the column, both halves repeated (HF Qwen3VLVisionRotaryEmbedding)."""
    spatial = head_dim // 2
    inv_freq = 1.0 / (theta ** (np.arange(0, spatial, 2, dtype=np.float32) / spatial))
    ang = rot_pos.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq, jnp.float32)  # [P, 2, hd/4]
    ang = jnp.concatenate([ang[:, 0], ang[:, 1]], axis=-1)
    ang = jnp.concatenate([ang, ang], axis=-1)
    return jnp.cos(ang), jnp.sin(ang)


def get_rope_index(
    input_ids: np.ndarray,
    image_grid_thw: np.ndarray | None,
    attention_mask: np.ndarray | None,
    *,
    image_token_id: int,
    spatial_merge_size: int,
    video_token_id: int | None = None,
    tokens_per_second: float = 0.0,
    second_per_grid=None,
) -> tuple[np.ndarray, np.ndarray]:
    """3-D positions of a (left-padded) batch: text tokens advance all three axes together, an image's tokens get
    (t, row, col) offsets from the current position, after which the position jumps by max(rows, cols).

    Returns positions [3, B, T] int32 (0 at padding) and rope_deltas [B] int32 = max position + 1 - real length,
    so the n-th real token of a continuation (0-based over the whole row) sits at n + rope_delta.
    Images are consumed from image_grid_thw in batch-row order; each run of consecutive image tokens is one image.
    Video tokens (video_token_id) are visual too: a video's frame group, behind its timestamp, is one run and takes
    one [1, h, w] item (transformers splits a video's grid [t, h, w] so), in the same list in prompt order.
    With `tokens_per_second` > 0 (Qwen2.5-VL) a video's run is its whole [t, h, w] item instead, and its k-th
    temporal patch sits at time floor(k * tokens_per_second * second_per_grid[i]) (float32, as transformers), i
    its index among the items: `second_per_grid` [items] runs beside image_grid_thw (transformers'
    second_per_grid_ts holds the videos' entries only; the images' are not read here), None: 1 second each.
    """
    input_ids = np.asarray(input_ids)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [B, T], got shape {input_ids.shape}")
    B, T = input_ids.shape
    mask = np.ones((B, T), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    grids = np.asarray([] if image_grid_thw is None else image_grid_thw).reshape(-1, 3)
    positions = np.zeros((3, B, T), np.int32)
    deltas = np.zeros((B,), np.int32)
    next_image = 0
    if second_per_grid is not None:
        second_per_grid = np.ravel(second_per_grid)  # taken in float32 where it is used, as transformers
        if len(second_per_grid) != len(grids):
            raise ValueError(f"second_per_grid has {len(second_per_grid)} values for {len(grids)} visual items")
    m = spatial_merge_size
    for b in range(B):
        ids = input_ids[b][mask[b]]
        # 0 text, 1 image, 2 video: a run changes where the kind does (as transformers' mm_token_type_ids groups)
        kind = (ids == image_token_id).astype(np.int8)
        if video_token_id is not None:
            kind[ids == video_token_id] = 2
        pieces = []
        cur = 0
        i = 0
        n = len(ids)
        while i < n:
            j = i
            while j < n and kind[j] == kind[i]:
                j += 1
            if not kind[i]:
                pieces.append(np.broadcast_to(np.arange(j - i) + cur, (3, j - i)))
                cur += j - i
            else:
                if next_image >= len(grids):
                    raise ValueError(f"row {b} has more images than image_grid_thw ({len(grids)})")
                t, h, w = (int(x) for x in grids[next_image])
                next_image += 1
                lt, lh, lw = t, h // m, w // m
                if lt * lh * lw != j - i:
                    raise ValueError(
                        f"row {b}: image {next_image - 1} with grid {(t, h, w)} needs {lt * lh * lw} image tokens, "
                        f"found a run of {j - i}"
                    )
                times = np.arange(lt)
                if tokens_per_second and kind[i] == 2:
                    spg = 1.0 if second_per_grid is None else second_per_grid[next_image - 1]
                    interval = np.float32(tokens_per_second) * np.float32(spg)
                    times = (times.astype(np.float32) * interval).astype(np.int64)
                tt, hh, ww = np.meshgrid(times, np.arange(lh), np.arange(lw), indexing="ij")
                pieces.append(np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + cur)
                cur += max(h, w) // m
            i = j
        pos = np.concatenate([np.zeros((3, 0), np.int64), *pieces], axis=1)
        positions[:, b, mask[b]] = pos
        deltas[b] = (pos.max() + 1 - n) if n else 0
    if next_image != len(grids):
        raise ValueError(f"image_grid_thw has {len(grids)} images but the batch holds {next_image}")
    return positions, deltas


def decode_positions(num_real_tokens: jax.Array, rope_deltas: jax.Array) -> jax.Array:
    """Positions [3, B, 1] of the next token of each row: its 0-based index among the row's real tokens plus
    rope_delta (text after the prompt advances all three axes together)."""
    p = (num_real_tokens + rope_deltas).astype(jnp.int32)
    return jnp.broadcast_to(p[None, :, None], (3, p.shape[0], 1))
