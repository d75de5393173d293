"""Qwen3-VL vision tower: patch embedding, interpolated learned positions + 2-D RoPE, ViT blocks with per-image
attention over the packed patches, the 2x2 patch merger and the DeepStack mergers.

Everything that depends on the image grids (rotary positions, interpolation taps, which image a patch belongs to)
is computed on the host by `prepare_vision_inputs`, so the tower itself runs under jit with static shapes.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spatial_jax.models.config import ModelConfig, VisionConfig
from spatial_jax.models.layers import LayerNorm, attention, param, random_normal
from spatial_jax.models.lora import LoRALinear
from spatial_jax.models.rope import apply_rotary, vision_cos_sin
from spatial_jax.models.scan import run_stack, stack_modules
from spatial_jax.models.sharding import constrain


@flax.struct.dataclass
class VisionInputs:
    """Packed patches of all images of a batch plus their grid-derived metadata (all [P, ...] arrays).

    pixel_values [P, C*tp*ps*ps]; rot_pos [P, 2] (row, col) for the 2-D RoPE; interp_idx / interp_weight [P, 4]
    bilinear taps into the learned position table; segment_ids [P] frame index over all images (-1 for padding patches).
    """

    pixel_values: jax.Array
    rot_pos: jax.Array
    interp_idx: jax.Array
    interp_weight: jax.Array
    segment_ids: jax.Array


def _axis_taps(index: np.ndarray, size: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear taps (floor, floor+1, clamped) with align_corners=True from a `size` grid into `side` entries."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.maximum(size - 1, 1).astype(np.float32)
    floor = np.floor(src)
    taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
    weights = np.clip(1.0 - np.abs(src[:, None] - floor[:, None] - np.arange(2)), 0.0, None).astype(np.float32)
    return taps, weights


def prepare_vision_inputs(pixel_values, image_grid_thw, cfg: VisionConfig, *,
                          pad_to: int | None = None) -> VisionInputs:
    """Host-side metadata for the packed patches of `image_grid_thw` [n_img, 3] (t, h, w in patches).

    Patches of one image come in HF order: frame-major, then 2x2 merge blocks in raster order, raster inside a
    block. `pad_to` (a multiple of spatial_merge_size**2) appends zero patches of segment -1, so batches of
    different image sizes can share one compiled shape; their merged features follow the real ones and are ignored.
    """
    grids = np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
    pixel_values = np.asarray(pixel_values)
    m = cfg.spatial_merge_size
    if pixel_values.ndim != 2 or pixel_values.shape[1] != cfg.patch_dim:
        raise ValueError(f"pixel_values must be [P, {cfg.patch_dim}], got {pixel_values.shape}")
    if (grids <= 0).any() or (grids[:, 1:] % m).any():
        raise ValueError(f"image_grid_thw {grids.tolist()} must be positive with h, w divisible by {m}")
    total = int(grids.prod(-1).sum())
    if total != pixel_values.shape[0]:
        raise ValueError(f"image_grid_thw covers {total} patches but pixel_values has {pixel_values.shape[0]}")
    side = int(round(cfg.num_position_embeddings**0.5))
    rot, idx, wts, seg = [], [], [], []
    frames = 0
    for t, h, w in grids.tolist():
        # (block_row, block_col, in_row, in_col) order of one frame
        br, bc, ir, ic = np.meshgrid(np.arange(h // m), np.arange(w // m), np.arange(m), np.arange(m), indexing="ij")
        row = (br * m + ir).ravel()
        col = (bc * m + ic).ravel()
        rot.append(np.tile(np.stack([row, col], -1), (t, 1)))
        ht, hw = _axis_taps(row, np.full_like(row, h), side)
        wt, ww = _axis_taps(col, np.full_like(col, w), side)
        idx.append(np.tile((ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4), (t, 1)))
        wts.append(np.tile((hw[:, :, None] * ww[:, None, :]).reshape(-1, 4), (t, 1)))
        # HF attends within each frame (cu_seqlens per frame), so every frame is its own segment.
        seg.append(np.repeat(np.arange(frames, frames + t), h * w))
        frames += t
    rot_pos = np.concatenate(rot) if rot else np.zeros((0, 2), np.int64)
    interp_idx = np.concatenate(idx) if idx else np.zeros((0, 4), np.int64)
    interp_w = np.concatenate(wts) if wts else np.zeros((0, 4), np.float32)
    segment_ids = np.concatenate(seg) if seg else np.zeros((0,), np.int64)
    if pad_to is not None:
        extra = pad_to - total
        if extra < 0 or pad_to % (m * m):
            raise ValueError(f"pad_to={pad_to} must be >= {total} patches and a multiple of {m * m}")
        pixel_values = np.concatenate([pixel_values, np.zeros((extra, pixel_values.shape[1]), pixel_values.dtype)])
        rot_pos = np.concatenate([rot_pos, np.zeros((extra, 2), rot_pos.dtype)])
        interp_idx = np.concatenate([interp_idx, np.zeros((extra, 4), interp_idx.dtype)])
        interp_w = np.concatenate([interp_w, np.zeros((extra, 4), interp_w.dtype)])
        segment_ids = np.concatenate([segment_ids, np.full((extra,), -1, segment_ids.dtype)])
    return VisionInputs(
        pixel_values=jnp.asarray(pixel_values),
        rot_pos=jnp.asarray(rot_pos, jnp.int32),
        interp_idx=jnp.asarray(interp_idx, jnp.int32),
        interp_weight=jnp.asarray(interp_w, jnp.float32),
        segment_ids=jnp.asarray(segment_ids, jnp.int32),
    )


class VisionAttention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        v = cfg.vision
        self.num_heads = v.num_heads
        self.head_dim = v.hidden_size // v.num_heads
        self.chunk = cfg.attention_chunk
        common = dict(use_bias=True, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.qkv = LoRALinear(v.hidden_size, 3 * v.hidden_size, axes=("vision_embed", "vision_heads"),
                              **common, **cfg.lora.layer_kwargs("qkv", vision=True))
        self.proj = LoRALinear(v.hidden_size, v.hidden_size, axes=("vision_heads", "vision_embed"),
                               **common, **cfg.lora.layer_kwargs("proj", vision=True))

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array) -> jax.Array:
        P = x.shape[0]
        qkv = self.qkv(x).reshape(P, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        out = attention(q[None], k[None], v[None], mask[None], self.head_dim**-0.5, self.chunk)[0]
        return self.proj(out.reshape(P, -1))


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
        v = self.cfg.vision
        dt = jnp.dtype(self.cfg.dtype)
        x = self.patch_embed(inputs.pixel_values.astype(dt))
        table = self.pos_embed[...].astype(jnp.float32)
        pos = jnp.sum(jnp.take(table, inputs.interp_idx, axis=0) * inputs.interp_weight[..., None], axis=1)
        x = constrain(x + pos.astype(x.dtype), ("patches", "act_embed"))
        cos, sin = vision_cos_sin(inputs.rot_pos, v.hidden_size // v.num_heads, v.rope_theta)
        seg = inputs.segment_ids
        mask = seg[:, None] == seg[None, :]  # block-diagonal: a patch sees only its own image
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
                x = block(x, cos, sin, mask)
                if layer in idx:
                    deepstack.append(self.deepstack_merger_list[idx.index(layer)](x))
        return self.merger(x), tuple(deepstack)
