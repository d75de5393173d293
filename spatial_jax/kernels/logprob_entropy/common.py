"""Math shared by every fused log-prob / entropy kernel: input checks, the online log-sum-exp update, the final
statistics and the combined logit cotangent. Pure jnp on arrays, so the same lines run in XLA loops and Pallas bodies.

Running statistics per row, kept relative to the running max m so entropy never cancels two large numbers:
  s = sum_j exp(z_j - m),  t = sum_j exp(z_j - m) (z_j - m)
  lse = m + log s,  H = lse - sum_j p_j z_j = log s - t / s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16)


def check_inputs(h, w, targets, temperature: float) -> None:
    """Clear errors for shapes, dtypes and temperature before anything is traced into a kernel."""
    if h.ndim != 2 or w.ndim != 2:
        raise ValueError(f"h must be [N, D] and w [D, V]; got h{tuple(h.shape)} and w{tuple(w.shape)}")
    if h.shape[1] != w.shape[0]:
        raise ValueError(f"hidden sizes differ: h{tuple(h.shape)} vs w{tuple(w.shape)}")
    if targets is not None and (targets.ndim != 1 or targets.shape[0] != h.shape[0]):
        raise ValueError(f"targets must be [N={h.shape[0]}]; got {tuple(targets.shape)}")
    if targets is not None and not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(f"targets must be integer token ids; got {targets.dtype}")
    for name, x in (("h", h), ("w", w)):
        if x.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name} must be float32 or bfloat16; got {x.dtype}")
    if h.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"empty input: N={h.shape[0]}, V={w.shape[1]}")
    if not float(temperature) > 0.0:
        raise ValueError(f"temperature must be > 0; got {temperature}")


def init_stats(rows: int):
    """(m, s, t, target logit), each [rows, 1] float32, before any vocabulary column has been seen."""
    neg_inf = jnp.full((rows, 1), -jnp.inf, jnp.float32)
    zero = jnp.zeros((rows, 1), jnp.float32)
    return neg_inf, zero, zero, zero


def online_update(m, s, t, z, valid=None):
    """Folds a [rows, cols] block of float32 logits into the running (m, s, t) [rows, 1]; `valid` masks padding.

    Padded columns become -inf before the max and contribute exactly 0 to both sums. Statistics stay 2-D
    ([rows, 1]) so the same code lowers inside a TPU kernel.
    """
    if valid is not None:
        z = jnp.where(valid, z, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(z, axis=-1, keepdims=True))
    shift = z - m_new
    e = jnp.exp(shift)
    e_shift = jnp.where(e > 0, e * shift, 0.0)  # exp(-inf) * -inf is nan; its true limit is 0
    alpha = jnp.exp(m - m_new)
    # Re-centre the old sums on the new max: t' = alpha (t + (m - m_new) s); guarded for the empty start (s = 0).
    t_old = jnp.where(s > 0, alpha * (t + (m - m_new) * s), 0.0)
    s_new = alpha * s + jnp.sum(e, axis=-1, keepdims=True)
    return m_new, s_new, t_old + jnp.sum(e_shift, axis=-1, keepdims=True)


def column_ids(shape, col_offset):
    """Global vocabulary index of every element of a [rows, cols] tile whose first column is col_offset."""
    return col_offset + jax.lax.broadcasted_iota(jnp.int32, shape, 1)


def target_logit(z, targets, col_offset):
    """[rows, 1]: z at column == target within this block (0 when the target lies in another block)."""
    hit = column_ids(z.shape, col_offset) == targets
    return jnp.sum(jnp.where(hit, z, 0.0), axis=-1, keepdims=True)


def finalize(m, s, t, z_target):
    """-> (log p(target), entropy, lse), float32 with the shape of the statistics."""
    log_s = jnp.log(s)
    lse = m + log_s
    entropy = jnp.maximum(log_s - t / s, 0.0)  # H >= 0 exactly; rounding can leave -1 ulp
    return z_target - lse, entropy, lse


def logit_cotangent(z, lse, entropy, onehot, g_lp, g_h, temperature: float):
    """d(loss)/d(h w) for one [rows, cols] tile: dz_j = g_lp (onehot_j - p_j) - g_H p_j (z_j - mu), divided by T.

    Row quantities (lse, entropy, g_lp, g_h) are [rows, 1]. z_j - mu = log p_j + H, so no large logit is subtracted
    from another. z is already divided by T; padded columns must carry z = -inf (p = 0, onehot = 0) and get 0.
    """
    log_p = z - lse
    p = jnp.exp(log_p)
    centred = jnp.where(p > 0, p * (log_p + entropy), 0.0)
    dz = g_lp * (onehot - p) - g_h * centred
    return dz / temperature


def nan_outside_vocab(lp, targets, v: int):
    """A target id outside [0, V) has no probability: its log-prob is nan (never a silently wrapped index)."""
    return jnp.where((targets >= 0) & (targets < v), lp, jnp.nan)


def with_fused_vjp(forward, backward):
    """(h, w, targets) -> (log p, H) with one custom VJP for both outputs.

    forward(h, w, targets) -> (lp, H, lse); backward(h, w, targets, lse, H, g_lp, g_H) -> (dh, dw). The residuals are
    the inputs plus two [N] vectors, so the backward pass recomputes logits instead of storing [N, V].
    """

    @jax.custom_vjp
    def fused(h, w, targets):
        lp, entropy, _ = forward(h, w, targets)
        return nan_outside_vocab(lp, targets, w.shape[1]), entropy

    def fused_fwd(h, w, targets):
        lp, entropy, lse = forward(h, w, targets)
        return (nan_outside_vocab(lp, targets, w.shape[1]), entropy), (h, w, targets, lse, entropy)

    def fused_bwd(residuals, cotangents):
        h, w, targets, lse, entropy = residuals
        g_lp, g_h = (jnp.asarray(g, jnp.float32) for g in cotangents)
        dh, dw = backward(h, w, targets, lse, entropy, g_lp, g_h)
        return dh, dw, None

    fused.defvjp(fused_fwd, fused_bwd)
    return fused
