"""Building blocks shared by the decoder and the vision tower: norms, embeddings, masked softmax attention."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

# Finite "minus infinity": a query with no visible key (left padding) gets uniform weights instead of NaN.
MASK_VALUE = -1e30


def param(value: jax.Array, axes: tuple[str | None, ...]) -> nnx.Param:
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


class RMSNorm(nnx.Module):
    """x / rms(x) * w, computed in float32 (Qwen3)."""

    def __init__(self, dim: int, *, eps: float, axes: tuple[str | None, ...] = ("norm",), dtype: str = "float32",
                 param_dtype: str = "float32"):
        self.weight = param(jnp.ones((dim,), jnp.dtype(param_dtype)), axes)
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        # HF casts back to the input dtype before the weight multiply.
        return self.weight[...].astype(jnp.dtype(self.dtype)) * xf.astype(x.dtype)


class LayerNorm(nnx.Module):
    """(x - mean) / std * w + b in float32 (vision tower)."""

    def __init__(self, dim: int, *, eps: float = 1e-6, axes: tuple[str | None, ...] = ("norm",),
                 param_dtype: str = "float32"):
        pdt = jnp.dtype(param_dtype)
        self.weight = param(jnp.ones((dim,), pdt), axes)
        self.bias = param(jnp.zeros((dim,), pdt), axes)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(x.dtype)


class Embed(nnx.Module):
    """Token embedding table [V, D]."""

    def __init__(self, num: int, dim: int, *, axes: tuple[str | None, str | None], dtype: str = "float32",
                 param_dtype: str = "float32", rngs: nnx.Rngs):
        self.embedding = param(
            (jax.random.normal(rngs.params(), (num, dim), jnp.float32) * 0.02).astype(jnp.dtype(param_dtype)), axes
        )
        self.dtype = dtype

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.embedding[...], ids, axis=0).astype(jnp.dtype(self.dtype))


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Grouped-query attention with an explicit boolean mask.

    q [B, T, H, D], k/v [B, S, Hkv, D] (query head h reads kv head h // (H / Hkv)), mask broadcastable to
    [B, T, S] (True = visible). Scores and softmax in float32; returns [B, T, H, D] in q's dtype.
    """
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    g = H // Hkv
    qg = q.reshape(B, T, Hkv, g, D)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask[:, None, None, :, :], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(B, T, H, D)
