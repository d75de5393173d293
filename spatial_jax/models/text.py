"""The decoder: RMSNorm, GQA attention with M-RoPE (per-head q/k RMSNorm in Qwen3, q/k/v biases in Qwen2.5), a
SwiGLU MLP or routed experts (spatial_jax.models.moe) per layer, and a static-shape KV cache."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from spatial_jax.models import paged
from spatial_jax.models.attention import AttentionMask, attention
from spatial_jax.models.config import ModelConfig
from spatial_jax.models.layers import RMSNorm
from spatial_jax.models.lora import LoRALinear
from spatial_jax.models.moe import SparseMoE
from spatial_jax.models.paged import PagedIndex
from spatial_jax.models.rope import apply_rotary
from spatial_jax.models.sharding import constrain


@flax.struct.dataclass
class KVCache:
    """Per-layer keys/values [B, S, n_kv, head_dim] and the key mask [B, S] (1 = slot holds a real token).

    Slots are written in order: a forward with `cache_index=i` and T tokens fills slots [i, i+T) of every layer
    and of `mask` (from that call's attention_mask), and its queries see the valid slots up to their own.
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    mask: jax.Array

    @property
    def max_len(self) -> int:
        return self.mask.shape[1]

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
        t = cfg.text
        dt = jnp.dtype(dtype or cfg.dtype)
        shape = (batch, max_len, t.num_key_value_heads, t.head_dim)
        names = ("batch", "cache_seq", "act_kv_heads", None)
        keys = tuple(constrain(jnp.zeros(shape, dt), names) for _ in range(t.num_hidden_layers))
        values = tuple(constrain(jnp.zeros(shape, dt), names) for _ in range(t.num_hidden_layers))
        return cls(keys=keys, values=values, mask=jnp.zeros((batch, max_len), jnp.int32))


class TextAttention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        t = cfg.text
        self.num_heads = t.num_attention_heads
        self.num_kv = t.num_key_value_heads
        self.head_dim = t.head_dim
        self.chunk = cfg.attention_chunk
        self.impl = cfg.attention_impl
        common = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        qkv_bias = t.attention_bias or t.qkv_bias
        self.q_proj = LoRALinear(t.hidden_size, self.num_heads * t.head_dim, axes=("embed", "heads"),
                                 use_bias=qkv_bias, **common, **cfg.lora.layer_kwargs("q_proj"))
        self.k_proj = LoRALinear(t.hidden_size, self.num_kv * t.head_dim, axes=("embed", "kv_heads"),
                                 use_bias=qkv_bias, **common, **cfg.lora.layer_kwargs("k_proj"))
        self.v_proj = LoRALinear(t.hidden_size, self.num_kv * t.head_dim, axes=("embed", "kv_heads"),
                                 use_bias=qkv_bias, **common, **cfg.lora.layer_kwargs("v_proj"))
        self.o_proj = LoRALinear(self.num_heads * t.head_dim, t.hidden_size, axes=("heads", "embed"),
                                 use_bias=t.attention_bias, **common, **cfg.lora.layer_kwargs("o_proj"))
        if t.qk_norm:
            self.q_norm = RMSNorm(t.head_dim, eps=t.rms_norm_eps, axes=("head_dim",), dtype=cfg.dtype,
                                  param_dtype=cfg.param_dtype)
            self.k_norm = RMSNorm(t.head_dim, eps=t.rms_norm_eps, axes=("head_dim",), dtype=cfg.dtype,
                                  param_dtype=cfg.param_dtype)
        else:
            self.q_norm = self.k_norm = None

    def _project(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).reshape(B, T, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(B, T, self.num_kv, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v_proj(x).reshape(B, T, self.num_kv, self.head_dim)
        q = constrain(apply_rotary(q, cos, sin), ("batch", "seq", "act_heads", None))
        return q, apply_rotary(k, cos, sin), v

    def _attend(self, q, k, v, mask):
        B, T = q.shape[:2]
        k = constrain(k, ("batch", "cache_seq", "act_kv_heads", None))
        v = constrain(v, ("batch", "cache_seq", "act_kv_heads", None))
        out = attention(q, k.astype(q.dtype), v.astype(q.dtype), mask, scale=self.head_dim**-0.5, impl=self.impl,
                        chunk=self.chunk)
        return self.o_proj(out.reshape(B, T, -1))

    def shared(self, x, cos, sin, mask, group: int):
        """The shared-prefix forward (Qwen3VL.shared_prefix_hidden): x = (prefix [B/G, P, D], completions [B, N, D])
        with their (cos, sin) and masks; each completion attends to its group's prefix keys and its own."""
        qp, kp, vp = self._project(x[0], cos[0], sin[0])
        qs, ks, vs = self._project(x[1], cos[1], sin[1])
        out_p = self._attend(qp, kp, vp, mask[0])
        k = jnp.concatenate([jnp.repeat(kp, group, axis=0), ks], axis=1)
        v = jnp.concatenate([jnp.repeat(vp, group, axis=0), vs], axis=1)
        return out_p, self._attend(qs, k, v, mask[1])

    def __call__(self, x, cos, sin, mask, cache_kv=None, cache_index=None):
        B, T, _ = x.shape
        q, k, v = self._project(x, cos, sin)
        new_kv = None
        if isinstance(cache_index, PagedIndex):  # pools of pages: scatter this call's k/v, then attend over the pages
            new_kv = paged.write(*cache_kv, k, v, cache_index)
            if paged.uses_kernel(self.impl, q.dtype, T, self.head_dim, cache_index.kernel):
                out = paged.decode_attention(q, *new_kv, cache_index, self.head_dim**-0.5)
                return self.o_proj(out.reshape(B, T, -1)), new_kv
            k, v = paged.read(new_kv[0], cache_index), paged.read(new_kv[1], cache_index)
        elif cache_kv is not None:
            ck, cv = cache_kv
            start = (0, cache_index, 0, 0)
            k = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), start)
            v = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), start)
            new_kv = (k, v)
        return self._attend(q, k, v, mask), new_kv


class TextMLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        t = cfg.text
        common = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        self.gate_proj = LoRALinear(t.hidden_size, t.intermediate_size, axes=("embed", "mlp"),
                                    **common, **cfg.lora.layer_kwargs("gate_proj"))
        self.up_proj = LoRALinear(t.hidden_size, t.intermediate_size, axes=("embed", "mlp"),
                                  **common, **cfg.lora.layer_kwargs("up_proj"))
        self.down_proj = LoRALinear(t.intermediate_size, t.hidden_size, axes=("mlp", "embed"),
                                    **common, **cfg.lora.layer_kwargs("down_proj"))

    def __call__(self, x):
        h = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(constrain(h, ("batch", "seq", "act_mlp")))


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0, *, rngs: nnx.Rngs):
        t = cfg.text
        norm = dict(eps=t.rms_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
        self.input_layernorm = RMSNorm(t.hidden_size, **norm)
        self.post_attention_layernorm = RMSNorm(t.hidden_size, **norm)
        self.self_attn = TextAttention(cfg, rngs=rngs)
        self.mlp = SparseMoE(cfg, rngs=rngs) if t.is_sparse(layer) else TextMLP(cfg, rngs=rngs)

    def _mlp_block(self, x, h):
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return constrain(x, ("batch", "seq", "act_embed"))

    def __call__(self, x, cos, sin, mask, cache_kv=None, cache_index=None):
        h, new_kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache_kv, cache_index)
        return self._mlp_block(x, h), new_kv

    def shared(self, x, cos, sin, mask, group: int):
        """x = (prefix [B/G, P, D], completions [B, N, D]) -> the same after this layer (TextAttention.shared)."""
        hp, hs = self.self_attn.shared(tuple(self.input_layernorm(a) for a in x), cos, sin, mask, group)
        return self._mlp_block(x[0], hp), self._mlp_block(x[1], hs)


def attention_mask_for(
    attention_mask: jax.Array, cache: KVCache | None, cache_index
) -> tuple[AttentionMask, jax.Array | None]:
    """Which keys each query sees (causal and key-padding) and the cache's updated key mask.

    Without a cache: causal over the T tokens with the real ones as one segment (what every attention kernel
    takes). With one: an explicit boolean [B, T, max_len] (the T queries sit at slots cache_index ..
    cache_index+T-1, a traced offset no kernel mask can express), which runs on the XLA path.
    """
    T = attention_mask.shape[1]
    am = attention_mask.astype(jnp.int32)
    if cache is None:
        return AttentionMask(segment_ids=(am > 0).astype(jnp.int32), causal=True), None
    key_mask = jax.lax.dynamic_update_slice(cache.mask, am, (0, cache_index))
    q_slot = cache_index + jnp.arange(T)
    causal = jnp.arange(cache.max_len)[None, :] <= q_slot[:, None]
    return AttentionMask(dense=causal[None] & (key_mask[:, None, :] > 0)), key_mask
