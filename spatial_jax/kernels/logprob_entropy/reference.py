"""Materialised reference in JAX: full float32 logits [N, V], gradients by autodiff (what the benchmark beats)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .common import check_inputs, nan_outside_vocab


def logits(h: jax.Array, w: jax.Array, temperature: float = 1.0) -> jax.Array:
    """[N, V] float32 logits of h @ w / T; float32 inputs at full precision."""
    return jnp.matmul(h, w, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST) / temperature


def linear_logprob_entropy(
    h: jax.Array, w: jax.Array, targets: jax.Array, *, temperature: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """(log p(target) [N], entropy [N]) float32 from softmax(h @ w / T), holding all logits at once.

    A target outside [0, V) gets a nan log-prob, as in the fused kernels.
    """
    check_inputs(h, w, targets, temperature)
    log_p = jax.nn.log_softmax(logits(h, w, temperature), axis=-1)
    safe = jnp.clip(targets.astype(jnp.int32), 0, w.shape[1] - 1)
    lp = nan_outside_vocab(jnp.take_along_axis(log_p, safe[:, None], axis=-1)[:, 0], targets, w.shape[1])
    entropy = -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)
    return lp, entropy


def entropy(h: jax.Array, w: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """Entropy [N] only (no targets)."""
    check_inputs(h, w, None, temperature)
    log_p = jax.nn.log_softmax(logits(h, w, temperature), axis=-1)
    return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)
