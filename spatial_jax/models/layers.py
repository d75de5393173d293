"""Building blocks shared by the decoder and the vision tower: norms, embeddings, initialisers (attention is in
spatial_jax.models.attention)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def _host_rng(key: jax.Array) -> np.random.Generator | None:
    """A numpy generator seeded from a concrete key; None while tracing (jit / eval_shape)."""
    if isinstance(key, jax.core.Tracer):
        return None
    return np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())


def random_normal(key: jax.Array, shape: tuple[int, ...], std: float, dtype) -> jax.Array:
    """N(0, std^2) weights. Eager construction draws on the host (XLA's threefry compiles slowly for every new
    shape); under tracing it stays a jax op, so abstract or compiled construction never materialises it on host."""
    rng = _host_rng(key)
    if rng is None:
        return (jax.random.normal(key, shape, jnp.float32) * std).astype(dtype)
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(dtype)


def random_uniform(key: jax.Array, shape: tuple[int, ...], bound: float, dtype) -> jax.Array:
    """U(-bound, bound) weights, drawn like `random_normal`."""
    rng = _host_rng(key)
    if rng is None:
        return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(dtype)
    return jnp.asarray(rng.uniform(-bound, bound, size=shape).astype(np.float32)).astype(dtype)


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
        self.embedding = param(random_normal(rngs.params(), (num, dim), 0.02, jnp.dtype(param_dtype)), axes)
        self.dtype = dtype

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.embedding[...], ids, axis=0).astype(jnp.dtype(self.dtype))
