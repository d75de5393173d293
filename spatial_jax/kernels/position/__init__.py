"""Full-vocabulary entropy at selected token positions only, and the box coordinate uncertainty built on it (eq. 5).

Gathering the P wanted rows of h first makes the cost P / N of the all-position kernel: one pass over W for P rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from spatial_jax.kernels import logprob_entropy
from spatial_jax.kernels.logprob_entropy import reference

from .uncertainty import box_uncertainty_from_digits


def _flat_rows(h: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """h [T, D] or [B, T, D] with positions [...] or [B, ...] -> (rows [N, D], flat indices, in-range mask)."""
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions must be integers; got {positions.dtype}")
    if h.ndim == 2:
        t = h.shape[0]
        flat, idx = h, positions.astype(jnp.int32)
    elif h.ndim == 3:
        b, t = h.shape[:2]
        if positions.ndim < 1 or positions.shape[0] != b:
            raise ValueError(f"with h [B={b}, T, D], positions must be [B, ...]; got {tuple(positions.shape)}")
        row = jnp.arange(b, dtype=jnp.int32).reshape((b,) + (1,) * (positions.ndim - 1))
        flat, idx = h.reshape(b * t, h.shape[2]), positions.astype(jnp.int32) + row * t
        positions = positions.astype(jnp.int32)
    else:
        raise ValueError(f"h must be [T, D] or [B, T, D]; got {tuple(h.shape)}")
    ok = (positions >= 0) & (positions < t)
    return flat, jnp.where(ok, idx, 0), ok


@functools.partial(jax.jit, static_argnames=("temperature", "impl", "block_n", "block_v"))
def position_entropy(
    h: jax.Array,
    w: jax.Array,
    positions: jax.Array,
    *,
    temperature: float = 1.0,
    impl: str = "auto",
    block_n: int | None = None,
    block_v: int | None = None,
) -> jax.Array:
    """Entropy (float32, shaped like positions) of softmax(h[p] @ w / T) at each position p.

    h is [T, D] (positions index its rows) or [B, T, D] (positions [B, ...] index each sequence). A position outside
    [0, T) gets nan, which downstream averages treat as missing.
    """
    flat, idx, ok = _flat_rows(h, positions)
    rows = flat[idx.reshape(-1)]
    if logprob_entropy.resolve_impl(impl) == "naive":
        ent = reference.entropy(rows, w, temperature=temperature)
    else:
        dummy = jnp.zeros((rows.shape[0],), jnp.int32)
        _, ent = logprob_entropy.linear_logprob_entropy(
            rows, w, dummy, impl=impl, temperature=temperature, block_n=block_n, block_v=block_v
        )
    return jnp.where(ok, ent.reshape(positions.shape), jnp.nan)


@functools.partial(jax.jit, static_argnames=("temperature", "impl", "block_n", "block_v"))
def coordinate_uncertainty(
    h: jax.Array,
    w: jax.Array,
    digit_positions: jax.Array,
    digit_mask: jax.Array,
    *,
    temperature: float = 1.0,
    impl: str = "auto",
    block_n: int | None = None,
    block_v: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Eq. 5, SpatialCORE: per box (H in [0, 1] [B], has_uncertainty [B]) from its digit tokens' entropies.

    digit_positions, digit_mask: [B, 4, K] (coordinate c of box b has digits at the unmasked positions). h is
    [T, D] (all boxes index one token sequence) or [B, T, D] (box b indexes sequence b). Masked or out-of-range
    positions do not count; a box lacking a digit for any coordinate has H = 0 and has_uncertainty False.
    """
    if digit_positions.ndim != 3 or digit_positions.shape[1] != 4 or digit_mask.shape != digit_positions.shape:
        raise ValueError(
            f"digit_positions and digit_mask must both be [B, 4, K]; got {tuple(digit_positions.shape)} "
            f"and {tuple(digit_mask.shape)}"
        )
    ent = position_entropy(
        h, w, digit_positions, temperature=temperature, impl=impl, block_n=block_n, block_v=block_v
    )
    return box_uncertainty_from_digits(ent, digit_mask.astype(bool))
