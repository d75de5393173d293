"""Pure functions from next-token logits to a token choice and its statistics (float32, [B, V] in, [B] out)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spatial_jax.rollout.config import SamplingConfig


def _order_key(x: jax.Array) -> jax.Array:
    """uint32 keys ordered like the float32 values (sign-magnitude -> offset binary), so thresholds can be bisected."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    sign = jnp.uint32(0x80000000)
    return jnp.where(bits & sign, ~bits, bits | sign)


def _from_order_key(key: jax.Array) -> jax.Array:
    sign = jnp.uint32(0x80000000)
    bits = jnp.where(key & sign, key & ~sign, ~key)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _bisect(pred, lo: jax.Array, hi: jax.Array) -> jax.Array:
    """Smallest key in [lo, hi] (per row) where the monotone predicate `pred(key) -> bool [B]` holds; pred(hi) must.

    32 halvings of the uint32 range: exact, and far cheaper than a vocabulary sort on CPU.
    """

    def body(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        ok = pred(mid)
        return jnp.where(ok, lo, mid + 1), jnp.where(ok, mid, hi)

    return jax.lax.fori_loop(0, 32, body, (lo, hi))[1]


def top_k_mask(logits: jax.Array, k: int) -> jax.Array:
    """True where a logit is >= the k-th largest of its row (ties at the cut-off kept); k <= 0 or k >= V keeps all."""
    vocab = logits.shape[-1]
    if k <= 0 or k >= vocab:
        return jnp.ones(logits.shape, dtype=bool)
    keys = _order_key(logits)
    # the k-th largest value is the largest t with #(x >= t) >= k, i.e. one below the smallest t with #(x >= t) < k
    first_short = _bisect(lambda t: jnp.sum(keys >= t[..., None], axis=-1) < k,
                          keys.min(axis=-1), keys.max(axis=-1) + 1)
    return logits >= _from_order_key(first_short - 1)[..., None]


def top_p_mask(logits: jax.Array, p: float) -> jax.Array:
    """True for the smallest most-probable set whose mass reaches p, closed under ties (nucleus sampling).

    A token is kept when the probability mass of tokens strictly more probable than it is below p; so the argmax is
    always kept and equal-probability tokens are kept or dropped together.
    """
    if p >= 1.0:
        return jnp.ones(logits.shape, dtype=bool)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    keys = _order_key(probs)

    def mass_above_below_p(t):  # S(t) = sum of probs > t, non-increasing in t
        above = probs > _from_order_key(t)[..., None]
        return jnp.sum(jnp.where(above, probs, 0.0), axis=-1) < p

    # kept = probs >= the smallest t with S(t) < p (S is right-continuous and steps only at probability values)
    threshold = _bisect(mass_above_below_p, keys.min(axis=-1), keys.max(axis=-1))
    return probs >= _from_order_key(threshold)[..., None]


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


def suppress(logits: jax.Array, token_ids: jax.Array) -> jax.Array:
    """logits with the given ids set to -inf (ids outside the vocabulary are ignored)."""
    banned = jnp.zeros((logits.shape[-1],), bool).at[token_ids].set(True, mode="drop")
    return jnp.where(banned, -jnp.inf, logits.astype(jnp.float32))


def row_key(key: jax.Array, row_id: jax.Array, t: jax.Array) -> jax.Array:
    """The key of a row's t-th draw: fold_in(fold_in(key, row_id), t). It depends on the run's key, the row's global
    id and the token index only, never on the row's batch position, slot or process."""
    return jax.random.fold_in(jax.random.fold_in(key, row_id), t)


def row_keys(key: jax.Array, row_ids: jax.Array, t: jax.Array) -> jax.Array:
    """`row_key` for every row: [B] ids and [B] token indices -> [B] keys."""
    return jax.vmap(row_key, in_axes=(None, 0, 0))(key, row_ids, t)


def choose(logits: jax.Array, keys: jax.Array, cfg: SamplingConfig, suppressed: jax.Array | None = None) -> jax.Array:
    """Next token per row: argmax when greedy, else a categorical draw from the filtered, tempered distribution with
    the row's own key (`keys`: one per row, see `row_keys`); `suppressed` ids are never chosen."""
    if suppressed is not None:
        logits = suppress(logits, suppressed)
    if cfg.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    draw = jax.vmap(lambda k, x: jax.random.categorical(k, x, axis=-1))
    return draw(keys, filtered_logits(logits, cfg)).astype(jnp.int32)


def draw(logits: jax.Array, keys: jax.Array, live: jax.Array, cfg: SamplingConfig,
         suppressed: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decode step's draw for every row, as both decoders (the static sampler and the paged engine) take it: the
    token (`choose`; the pad id for rows not `live`), its log-prob at the sampling temperature and the full-vocabulary
    entropy (0 for rows not live)."""
    tok = jnp.where(live, choose(logits, keys, cfg, suppressed), cfg.pad_token_id)
    return (tok, jnp.where(live, token_logprob(logits, tok, cfg.temperature), 0.0),
            jnp.where(live, entropy(logits), 0.0))
