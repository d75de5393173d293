"""Qwen3-VL vision tower: patch embedding, interpolated learned positions + 2-D RoPE, ViT blocks with attention
within each frame, the 2x2 patch merger and the DeepStack mergers.

The tower runs on frames, not on the batch's packed patches: every frame (an image, or one time step of a video grid
[t, h, w], as transformers' cu_seqlens per frame) gets a slot of L patches, L the smallest of the config's buckets
that holds the largest frame, so attention is [n_frames, L, L] (linear in the number of images, no [P, P] mask)
and the frame axis shards over the batch axes like any batch. Everything that depends on the grids (rotary
positions, interpolation taps, which slot holds which feature) is computed on the host by `prepare_vision_inputs`,
so the tower runs under jit with static shapes, and a new image size that fits the same bucket does not compile
again.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spatial_jax.models.attention import AttentionMask, attention
from spatial_jax.models.config import VISION_BUCKETS, ModelConfig, VisionConfig
from spatial_jax.models.layers import LayerNorm, param, random_normal
from spatial_jax.models.lora import LoRALinear
from spatial_jax.models.rope import apply_rotary, vision_cos_sin
from spatial_jax.models.scan import run_stack, stack_modules
from spatial_jax.models.sharding import constrain

# logical names of a [frames, L, ...] activation: frames are a batch axis
FRAME_AXES = ("batch", None, "act_embed")


@flax.struct.dataclass
class VisionInputs:
    """The images of a batch as F frame slots of L patches each ([F, L, ...] arrays), plus where their features go.

    pixel_values [F, L, C*tp*ps*ps]; rot_pos [F, L, 2] (row, col) for the 2-D RoPE; interp_idx / interp_weight
    [F, L, 4] bilinear taps into the learned position table; segment_ids [F, L]: 1 on a frame's patches, 0 on
    the slot's padding. The tower's merged features are [F * L / merge**2, out] (slot-major); feature_index
    [F * L / merge**2] lists the slots of the real features in HF's order (images in order, frame-major), then 0s.
    row_feature_start / row_feature_count [R] (or None): where each text row's image features start in that order
    and how many it has, when rows share images (G rollouts of one prompt encode its image once); None: the k-th
    image token of the batch (row-major) takes the k-th feature, as transformers does. window_ids [F, L] (towers
    with window attention, VisionConfig.window_size > 0): a patch's window within its frame, from 1 (0 = padding).
    """

    pixel_values: jax.Array
    rot_pos: jax.Array
    interp_idx: jax.Array
    interp_weight: jax.Array
    segment_ids: jax.Array
    feature_index: jax.Array
    row_feature_start: jax.Array | None = None
    row_feature_count: jax.Array | None = None
    window_ids: jax.Array | None = None

    @property
    def num_frames(self) -> int:
        return self.pixel_values.shape[0]

    @property
    def frame_len(self) -> int:
        return self.pixel_values.shape[1]


def _axis_taps(index: np.ndarray, size: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear taps (floor, floor+1, clamped) with align_corners=True from a `size` grid into `side` entries."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.maximum(size - 1, 1).astype(np.float32)
    floor = np.floor(src)
    taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
    weights = np.clip(1.0 - np.abs(src[:, None] - floor[:, None] - np.arange(2)), 0.0, None).astype(np.float32)
    return taps, weights


def bucket_for(patches: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= patches; beyond the last bucket, the next multiple of it."""
    for b in buckets:
        if patches <= b:
            return int(b)
    return -(-patches // buckets[-1]) * int(buckets[-1])


def check_grids(image_grid_thw, cfg: VisionConfig) -> np.ndarray:
    grids = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
    m = cfg.spatial_merge_size
    if (grids <= 0).any() or (grids[:, 1:] % m).any():
        raise ValueError(f"image_grid_thw {grids.tolist()} must be positive with h, w divisible by {m}")
    return grids


def shared_items(image_grid_thw, row_group, row_image_counts=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For rows whose images are given row by row (row r's `row_image_counts[r]` items, default 1, consecutive in
    image_grid_thw): (the items to encode: those of each group's first row, [n] indices; each row's first
    encoded item [R]; each row's item count [R]). Rows of one `row_group` id must show the same grids."""
    grids = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
    group = np.asarray(row_group, np.int64).reshape(-1)
    counts = np.ones_like(group) if row_image_counts is None else np.asarray(row_image_counts, np.int64).reshape(-1)
    if counts.shape != group.shape or (counts < 0).any() or counts.sum() != len(grids):
        raise ValueError(f"row_image_counts {counts.tolist()} must give each of the {len(group)} rows its items, "
                         f"{len(grids)} in all")
    starts = np.concatenate([[0], np.cumsum(counts)])
    keep, first_of, row_first = [], {}, np.zeros_like(group)
    for r, g in enumerate(group.tolist()):
        mine = list(range(starts[r], starts[r + 1]))
        if g not in first_of:
            first_of[g] = (len(keep), mine)
            keep.extend(mine)
        elif not np.array_equal(grids[first_of[g][1]], grids[mine]):
            raise ValueError(f"rows of row_group {g} show different images ({grids[first_of[g][1]].tolist()} vs "
                             f"{grids[mine].tolist()})")
        row_first[r] = first_of[g][0]
    return np.asarray(keep, np.int64), row_first, counts


def prepare_vision_inputs(pixel_values, image_grid_thw, cfg: VisionConfig, *,
                          buckets: Sequence[int] = VISION_BUCKETS, num_frames: int | None = None,
                          row_group: Sequence[int] | None = None,
                          row_image_counts: Sequence[int] | None = None) -> VisionInputs:
    """Host-side frame slots for the packed patches of `image_grid_thw` [n_img, 3] (t, h, w in patches).

    Patches of one image come in HF order: frame-major, then 2x2 merge blocks in raster order, raster inside a
    block. Each frame takes one slot of L = bucket_for(largest frame, buckets) patches; `num_frames` pads the
    slot count (zero patches, segment 0), so batches with different frame counts can share one compiled shape.
    `row_group` [R] shares images between text rows: the images come row by row (`row_image_counts[r]` items
    of row r, default one), and rows with the same group id show the same images (the G rollouts of a prompt),
    so only each group's first row's images are encoded and every row of the group takes their features.
    """
    grids = check_grids(image_grid_thw, cfg)
    pixel_values = np.asarray(pixel_values)
    m = cfg.spatial_merge_size
    if pixel_values.ndim != 2 or pixel_values.shape[1] != cfg.patch_dim:
        raise ValueError(f"pixel_values must be [P, {cfg.patch_dim}], got {pixel_values.shape}")
    total = int(grids.prod(-1).sum())
    if total != pixel_values.shape[0]:
        raise ValueError(f"image_grid_thw covers {total} patches but pixel_values has {pixel_values.shape[0]}")
    share = None
    if row_group is not None:
        keep, row_first, row_counts = shared_items(grids, row_group, row_image_counts)
        patch_start = np.concatenate([[0], np.cumsum(grids.prod(-1))])
        pixel_values = np.concatenate([pixel_values[patch_start[i] : patch_start[i + 1]] for i in keep]) \
            if len(keep) else pixel_values[:0]
        grids = grids[keep]
        share = row_first, row_counts
    frames = [(h, w) for t, h, w in grids.tolist() for _ in range(t)]
    L = bucket_for(max((h * w for h, w in frames), default=m * m), buckets)
    if L % (m * m):
        raise ValueError(f"vision bucket {L} must be a multiple of spatial_merge_size**2 = {m * m}")
    F = len(frames) if num_frames is None else int(num_frames)
    if F < max(len(frames), 1):
        raise ValueError(f"num_frames={num_frames} is fewer than the {len(frames)} frames of image_grid_thw")
    side = int(round(cfg.num_position_embeddings**0.5))
    pix = np.zeros((F, L, pixel_values.shape[1]), pixel_values.dtype)
    rot = np.zeros((F, L, 2), np.int32)
    idx = np.zeros((F, L, 4), np.int32)
    wts = np.zeros((F, L, 4), np.float32)
    seg = np.zeros((F, L), np.int32)
    win = np.zeros((F, L), np.int32) if cfg.window_size else None
    feats, offset = [], 0
    per_merge = L // (m * m)
    for f, (h, w) in enumerate(frames):
        n = h * w
        # (block_row, block_col, in_row, in_col) order of one frame
        br, bc, ir, ic = np.meshgrid(np.arange(h // m), np.arange(w // m), np.arange(m), np.arange(m), indexing="ij")
        row, col = (br * m + ir).ravel(), (bc * m + ic).ravel()
        ht, hw = _axis_taps(row, np.full_like(row, h), side)
        wt, ww = _axis_taps(col, np.full_like(col, w), side)
        pix[f, :n] = pixel_values[offset : offset + n]
        rot[f, :n] = np.stack([row, col], -1)
        idx[f, :n] = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
        wts[f, :n] = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
        seg[f, :n] = 1
        if win is not None:
            # windows of merge_window x merge_window merged tokens in raster order, the last ones cut by the frame
            # edge (HF get_vision_window_index)
            ws = cfg.merge_window
            per_row = -(-(w // m) // ws)
            win[f, :n] = (row // m // ws) * per_row + col // m // ws + 1
        feats.append(f * per_merge + np.arange(n // (m * m)))
        offset += n
    feature_index = np.zeros((F * per_merge,), np.int32)
    real = np.concatenate(feats) if feats else np.zeros((0,), np.int64)
    feature_index[: len(real)] = real
    starts = counts = None
    if share is not None:
        row_first, row_counts = share
        feature_start = np.concatenate([[0], np.cumsum(grids.prod(-1) // (m * m))])
        starts = jnp.asarray(feature_start[row_first], jnp.int32)
        counts = jnp.asarray(feature_start[row_first + row_counts] - feature_start[row_first], jnp.int32)
    return VisionInputs(
        pixel_values=jnp.asarray(pix), rot_pos=jnp.asarray(rot), interp_idx=jnp.asarray(idx),
        interp_weight=jnp.asarray(wts), segment_ids=jnp.asarray(seg), feature_index=jnp.asarray(feature_index),
        row_feature_start=starts, row_feature_count=counts, window_ids=None if win is None else jnp.asarray(win),
    )


def feature_slots(vision: VisionInputs, image_mask: jax.Array) -> jax.Array:
    """[B, T] index into the tower's merged features of the feature each image token takes (image_mask [B, T])."""
    n = vision.feature_index.shape[0]
    if vision.row_feature_start is None:
        k = (jnp.cumsum(image_mask.reshape(-1)) - 1).reshape(image_mask.shape)
    else:
        k = vision.row_feature_start[:, None] + jnp.cumsum(image_mask, axis=1) - 1
    return jnp.take(vision.feature_index, jnp.clip(k, 0, n - 1), axis=0)


def count_features(vision: VisionInputs, merge: int) -> np.ndarray | int:
    """Host-side: the image features each row takes (per row when rows share images), else the batch's total."""
    if vision.row_feature_count is not None:
        return np.asarray(vision.row_feature_count)
    return int(np.asarray(vision.segment_ids).sum()) // merge**2


class VisionAttention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        v = cfg.vision
        self.num_heads = v.num_heads
        self.head_dim = v.hidden_size // v.num_heads
        self.chunk = cfg.attention_chunk
        self.impl = cfg.attention_impl
        common = dict(use_bias=True, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.qkv = LoRALinear(v.hidden_size, 3 * v.hidden_size, axes=("vision_embed", "vision_heads"),
                              **common, **cfg.lora.layer_kwargs("qkv", vision=True))
        self.proj = LoRALinear(v.hidden_size, v.hidden_size, axes=("vision_heads", "vision_embed"),
                               **common, **cfg.lora.layer_kwargs("proj", vision=True))

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: AttentionMask) -> jax.Array:
        F, L, _ = x.shape
        qkv = self.qkv(x).reshape(F, L, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        out = attention(q, k, v, mask, scale=self.head_dim**-0.5, impl=self.impl, chunk=self.chunk)
        return self.proj(out.reshape(F, L, -1))


class VisionMLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        v = cfg.vision
        common = dict(use_bias=True, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.linear_fc1 = LoRALinear(v.hidden_size, v.intermediate_size, axes=("vision_embed", "vision_mlp"),
                                     **common, **cfg.lora.layer_kwargs("linear_fc1", vision=True))
        self.linear_fc2 = LoRALinear(v.intermediate_size, v.hidden_size, axes=("vision_mlp", "vision_embed"),
                                     **common, **cfg.lora.layer_kwargs("linear_fc2", vision=True))
        self.approximate = v.hidden_act == "gelu_pytorch_tanh"

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=self.approximate))


class VisionBlock(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pdt = cfg.param_dtype
        self.norm1 = LayerNorm(cfg.vision.hidden_size, eps=1e-6, param_dtype=pdt)
        self.norm2 = LayerNorm(cfg.vision.hidden_size, eps=1e-6, param_dtype=pdt)
        self.attn = VisionAttention(cfg, rngs=rngs)
        self.mlp = VisionMLP(cfg, rngs=rngs)

    def __call__(self, x, cos, sin, mask):
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nnx.Module):
    """LayerNorm, then groups of merge**2 consecutive patches -> one token: Linear, GELU (exact), Linear.
    The DeepStack mergers normalise after grouping (`postshuffle_norm`), the final one before."""

    def __init__(self, cfg: ModelConfig, *, postshuffle_norm: bool, rngs: nnx.Rngs):
        v = cfg.vision
        self.merged = v.hidden_size * v.spatial_merge_size**2
        self.postshuffle_norm = postshuffle_norm
        self.norm = LayerNorm(self.merged if postshuffle_norm else v.hidden_size, eps=1e-6, param_dtype=cfg.param_dtype)
        common = dict(use_bias=True, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.linear_fc1 = LoRALinear(self.merged, self.merged, axes=("merger_in", "vision_mlp"), **common)
        self.linear_fc2 = LoRALinear(self.merged, v.out_hidden_size, axes=("vision_mlp", "embed"), **common)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.postshuffle_norm:
            x = self.norm(x.reshape(-1, self.merged))
        else:
            x = self.norm(x).reshape(-1, self.merged)
        return self.linear_fc2(jax.nn.gelu(self.linear_fc1(x), approximate=False))


class VisionTower(nnx.Module):
    """pixels -> (merged tokens [P / merge**2, out_hidden], DeepStack features, one per deepstack index)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        v = cfg.vision
        self.cfg = cfg
        pdt = jnp.dtype(cfg.param_dtype)
        self.patch_embed = LoRALinear(v.patch_dim, v.hidden_size, axes=("vision_patch", "vision_embed"),
                                      use_bias=True, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.pos_embed = param(random_normal(rngs.params(), (v.num_position_embeddings, v.hidden_size), 0.02, pdt),
                               ("vision_pos", "vision_embed"))
        blocks = [VisionBlock(cfg, rngs=rngs) for _ in range(v.depth)]
        self.blocks = stack_modules(blocks) if cfg.scan_layers else nnx.List(blocks)
        self.merger = PatchMerger(cfg, postshuffle_norm=False, rngs=rngs)
        self.deepstack_merger_list = nnx.List(
            [PatchMerger(cfg, postshuffle_norm=True, rngs=rngs) for _ in v.deepstack_visual_indexes]
        )

    def __call__(self, inputs: VisionInputs) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        """Merged features [F * L / merge**2, out] and the DeepStack features of the same shape, slot-major."""
        v = self.cfg.vision
        dt = jnp.dtype(self.cfg.dtype)
        x = self.patch_embed(inputs.pixel_values.astype(dt))
        table = self.pos_embed[...].astype(jnp.float32)
        pos = jnp.sum(jnp.take(table, inputs.interp_idx, axis=0) * inputs.interp_weight[..., None], axis=-2)
        x = constrain(x + pos.astype(x.dtype), FRAME_AXES)
        F, L = inputs.segment_ids.shape
        cos, sin = vision_cos_sin(inputs.rot_pos.reshape(F * L, 2), v.hidden_size // v.num_heads, v.rope_theta)
        cos, sin = cos.reshape(F, L, -1), sin.reshape(F, L, -1)
        mask = AttentionMask(segment_ids=inputs.segment_ids)  # a patch sees only its own frame's patches
        idx = v.deepstack_visual_indexes
        deepstack = []
        if self.cfg.scan_layers:
            # one scan per run of blocks ending at a tap, so every tapped output is a scan result
            start = 0
            for stop in sorted(set(idx) | {v.depth - 1}):
                x, _ = run_stack(self.blocks, lambda b, x, _: (b(x, cos, sin, mask), None), x, start=start,
                                 stop=stop + 1)
                if stop in idx:
                    deepstack.append(self.deepstack_merger_list[idx.index(stop)](x))
                start = stop + 1
        else:
            for layer, block in enumerate(self.blocks):
                x = constrain(block(x, cos, sin, mask), FRAME_AXES)
                if layer in idx:
                    deepstack.append(self.deepstack_merger_list[idx.index(layer)](x))
        return self.merger(x), tuple(deepstack)
