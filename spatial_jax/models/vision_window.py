"""Qwen2.5-VL's vision tower: patch embedding without bias or learned positions, 2-D RoPE, RMSNorm blocks with a
gated SiLU MLP that attend within windows except the `fullatt_block_indexes` blocks (whole frame), and one RMSNorm
patch merger after the last block (no DeepStack).

Transformers reorders the patches window by window, runs varlen attention per window and undoes the order after
the merger. Attention is permutation-equivariant given each patch's own rotary angles, so here the patches keep
their frame-slot order (spatial_jax.models.vision) and a window is a segment id (`VisionInputs.window_ids`, from
`prepare_vision_inputs`): the same result, to float summation order, with the frame tower's static shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spatial_jax.models.attention import AttentionMask
from spatial_jax.models.config import ModelConfig
from spatial_jax.models.layers import RMSNorm
from spatial_jax.models.lora import LoRALinear
from spatial_jax.models.rope import vision_cos_sin
from spatial_jax.models.scan import run_stack, stack_modules
from spatial_jax.models.sharding import constrain
from spatial_jax.models.vision import FRAME_AXES, VisionAttention, VisionInputs


class GatedVisionMLP(nnx.Module):
    """down(act(gate(x)) * up(x)), all three with biases."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        v = cfg.vision
        common = dict(use_bias=True, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.gate_proj = LoRALinear(v.hidden_size, v.intermediate_size, axes=("vision_embed", "vision_mlp"),
                                    **common, **cfg.lora.layer_kwargs("gate_proj", vision=True))
        self.up_proj = LoRALinear(v.hidden_size, v.intermediate_size, axes=("vision_embed", "vision_mlp"),
                                  **common, **cfg.lora.layer_kwargs("up_proj", vision=True))
        self.down_proj = LoRALinear(v.intermediate_size, v.hidden_size, axes=("vision_mlp", "vision_embed"),
                                    **common, **cfg.lora.layer_kwargs("down_proj", vision=True))
        acts = {"silu": jax.nn.silu, "gelu": lambda x: jax.nn.gelu(x, approximate=False),
                "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True)}
        self.act = acts[v.hidden_act]

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class WindowVisionBlock(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        norm = dict(eps=1e-6, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
        self.norm1 = RMSNorm(cfg.vision.hidden_size, **norm)
        self.norm2 = RMSNorm(cfg.vision.hidden_size, **norm)
        self.attn = VisionAttention(cfg, rngs=rngs)
        self.mlp = GatedVisionMLP(cfg, rngs=rngs)

    def __call__(self, x, cos, sin, mask):
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.mlp(self.norm2(x))


class RMSNormMerger(nnx.Module):
    """RMSNorm, then groups of merge**2 consecutive patches -> one token: Linear, GELU (exact), Linear. The two
    Linears are `mlp["0"]` and `mlp["2"]`, transformers' nn.Sequential indices, so the checkpoint names map as is."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        v = cfg.vision
        self.merged = v.hidden_size * v.spatial_merge_size**2
        self.ln_q = RMSNorm(v.hidden_size, eps=1e-6, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
        common = dict(use_bias=True, dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.mlp = nnx.Dict({
            "0": LoRALinear(self.merged, self.merged, axes=("merger_in", "vision_mlp"), **common),
            "2": LoRALinear(self.merged, v.out_hidden_size, axes=("vision_mlp", "embed"), **common),
        })

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.ln_q(x).reshape(-1, self.merged)
        return self.mlp["2"](jax.nn.gelu(self.mlp["0"](x), approximate=False))


class WindowVisionTower(nnx.Module):
    """pixels -> (merged tokens [F * L / merge**2, out_hidden] slot-major, no DeepStack features)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        v = cfg.vision
        self.cfg = cfg
        self.patch_embed = LoRALinear(v.patch_dim, v.hidden_size, axes=("vision_patch", "vision_embed"),
                                      dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        blocks = [WindowVisionBlock(cfg, rngs=rngs) for _ in range(v.depth)]
        self.blocks = stack_modules(blocks) if cfg.scan_layers else nnx.List(blocks)
        self.merger = RMSNormMerger(cfg, rngs=rngs)

    def __call__(self, inputs: VisionInputs) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        v = self.cfg.vision
        if inputs.window_ids is None:
            raise ValueError("a windowed vision tower needs VisionInputs.window_ids: build the inputs with "
                             "prepare_vision_inputs(..., cfg.vision) of this model's config")
        x = constrain(self.patch_embed(inputs.pixel_values.astype(jnp.dtype(self.cfg.dtype))), FRAME_AXES)
        F, L = inputs.segment_ids.shape
        cos, sin = vision_cos_sin(inputs.rot_pos.reshape(F * L, 2), v.hidden_size // v.num_heads, v.rope_theta)
        cos, sin = cos.reshape(F, L, -1), sin.reshape(F, L, -1)
        full = np.isin(np.arange(v.depth), v.fullatt_block_indexes)
        if self.cfg.scan_layers:
            # the per-block choice rides the scan as an input: segment ids of the frame or of the windows
            def step(block, x, is_full):
                seg = jnp.where(is_full, inputs.segment_ids, inputs.window_ids)
                return block(x, cos, sin, AttentionMask(segment_ids=seg)), None

            x, _ = run_stack(self.blocks, step, x, jnp.asarray(full))
        else:
            masks = (AttentionMask(segment_ids=inputs.window_ids), AttentionMask(segment_ids=inputs.segment_ids))
            for i, block in enumerate(self.blocks):
                x = constrain(block(x, cos, sin, masks[int(full[i])]), FRAME_AXES)
        return self.merger(x), ()
