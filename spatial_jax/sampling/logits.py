"""Pure functions from next-token logits to a token choice and its statistics (float32, [B, V] in, [B] out)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spatial_jax.sampling.config import SamplingConfig


def top_k_mask(logits: jax.Array, k: int) -> jax.Array:
    """True where a logit is >= the k-th largest of its row (ties at the cut-off kept); k <= 0 or k >= V keeps all."""
    vocab = logits.shape[-1]
    if k <= 0 or k >= vocab:
        return jnp.ones(logits.shape, dtype=bool)
    kth = jax.lax.top_k(logits, k)[0][..., -1:]
    return logits >= kth


def top_p_mask(logits: jax.Array, p: float) -> jax.Array:
    """True for the smallest most-probable set whose mass reaches p, closed under ties (nucleus sampling).

    A token is kept when the probability mass of tokens strictly more probable than it is below p; so the argmax is
    always kept and equal-probability tokens are kept or dropped together. -inf logits are never kept unless all are.
    """
    if p >= 1.0:
        return jnp.ones(logits.shape, dtype=bool)
    probs = jax.nn.softmax(logits, axis=-1)
    sorted_probs = -jnp.sort(-probs, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    n_keep = jnp.maximum(jnp.sum(mass_before < p, axis=-1, keepdims=True), 1)
    threshold = jnp.take_along_axis(sorted_probs, n_keep - 1, axis=-1)
    return probs >= threshold


def filtered_logits(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """logits / T with tokens outside top-k, then outside top-p, set to -inf (HF's warper order)."""
    scaled = logits.astype(jnp.float32) / cfg.temperature
    keep = top_k_mask(scaled, cfg.top_k)
    scaled = jnp.where(keep, scaled, -jnp.inf)
    keep = top_p_mask(scaled, cfg.top_p)
    return jnp.where(keep, scaled, -jnp.inf)


def entropy(logits: jax.Array) -> jax.Array:
    """Shannon entropy (nats) of softmax(logits) over the full vocabulary: the policy's own uncertainty at T = 1."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    p = jnp.exp(logp)
    return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)


def token_logprob(logits: jax.Array, tokens: jax.Array, temperature: float) -> jax.Array:
    """log softmax(logits / T)[token] over the full vocabulary, as the loss recomputes it; T = 0 (greedy) uses T = 1."""
    t = temperature if temperature > 0 else 1.0
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / t, axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def choose(logits: jax.Array, key: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Next token per row: argmax when greedy, else a categorical draw from the filtered, tempered distribution."""
    if cfg.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, filtered_logits(logits, cfg), axis=-1).astype(jnp.int32)
