"""Chunked pure-JAX kernel: online log-sum-exp over vocabulary chunks, tokens in chunks, any backend.

Working memory is a few [block_n, block_v] float32 tiles, never [N, V]. The vocabulary is walked as
floor(V / block_v) full chunks in a fori_loop plus one static tail chunk, so no column is ever padded (and w is
never copied to a padded buffer). Tokens are padded to a multiple of block_n with zero rows that carry zero
cotangent. The backward pass recomputes each tile and accumulates dh and dw in float32. Dots accumulate in float32;
float32 inputs use full-precision dots (Precision.HIGHEST, so no TF32/bf16 passes on GPU/TPU); with bfloat16
inputs the tile cotangent is rounded to bfloat16 for the two gradient dots, as a fused GPU/TPU kernel would.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from spatial_jax.kernels.platform import active_platform

from . import common

DEFAULT_BLOCK_N = 1024
DEFAULT_BLOCK_V = 1024
# Per-backend tiles, measured (benchmarks/RESULTS.md). On GPU every trip of XLA's loops costs kernel launches, so
# larger tiles win: H200, N = 32768, bf16, forward 77 ms at 8192 x 4096 against 163 ms at 1024 x 1024 (fewest trips
# of the four tile sizes tried; [8192, 4096] float32 logit tiles are 128 MiB).
_BACKEND_BLOCKS = {"gpu": (8192, 4096), "cuda": (8192, 4096), "rocm": (8192, 4096)}


def default_blocks(backend: str | None = None) -> tuple[int, int]:
    """(block_n, block_v) for a backend name (default: the platform programs are compiled for, kernels/platform.py)."""
    return _BACKEND_BLOCKS.get(backend or active_platform(), (DEFAULT_BLOCK_N, DEFAULT_BLOCK_V))

_HIGHEST = lax.Precision.HIGHEST


def _matmul(a, b, contract):
    """float32-accumulated dot of a and b over the given (a_dim, b_dim) contraction."""
    return lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32, precision=_HIGHEST)


def _vocab_walk(v: int, block_v: int):
    """(number of full chunks, tail width) covering v columns."""
    n_full = v // block_v
    return n_full, v - n_full * block_v


def _row_block(n: int, block_n: int) -> int:
    """Rows per token chunk: as many chunks as block_n asks for, balanced, so padding stays under 8 rows a chunk
    (N = 8193 with block_n 8192 runs two chunks of 4104, not two of 8192)."""
    chunks = -(-n // block_n)
    rows = -(-n // chunks)
    return min(n, block_n, -(-rows // 8) * 8)


def _pad_rows(x, rows: int):
    pad = rows - x.shape[0]
    return x if pad == 0 else jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))


def _chunk_rows(x, block_n: int):
    """[N_pad, ...] -> [N_pad / block_n, block_n, ...]."""
    return x.reshape((x.shape[0] // block_n, block_n) + x.shape[1:])


def _forward_rows(h_c, w, t_c, temperature, block_v):
    """Statistics for one token chunk over the whole vocabulary -> (lp, H, lse) [block_n]."""
    n_full, tail = _vocab_walk(w.shape[1], block_v)

    def fold(state, w_c, offset):
        m, s, t, zt = state
        z = _matmul(h_c, w_c, ((1,), (0,))) / temperature
        m, s, t = common.online_update(m, s, t, z)
        return m, s, t, zt + common.target_logit(z, t_c, offset)

    def body(j, state):
        offset = j * block_v
        return fold(state, lax.dynamic_slice_in_dim(w, offset, block_v, axis=1), offset)

    state = lax.fori_loop(0, n_full, body, common.init_stats(h_c.shape[0]))
    if tail:
        state = fold(state, w[:, n_full * block_v :], n_full * block_v)
    return common.finalize(*state)


def forward(h, w, targets, *, temperature: float, block_n: int, block_v: int):
    """(log p(target), entropy, lse), float32 [N]."""
    n = h.shape[0]
    block_n = _row_block(n, block_n)
    n_pad = -(-n // block_n) * block_n
    h_b = _chunk_rows(_pad_rows(h, n_pad), block_n)
    t_b = _chunk_rows(_pad_rows(targets.astype(jnp.int32)[:, None], n_pad), block_n)
    block_v = min(block_v, w.shape[1])
    lp, entropy, lse = lax.map(lambda args: _forward_rows(args[0], w, args[1], temperature, block_v), (h_b, t_b))
    return tuple(x.reshape(-1)[:n] for x in (lp, entropy, lse))


def backward(h, w, targets, lse, entropy, g_lp, g_h, *, temperature: float, block_n: int, block_v: int):
    """(dh, dw) in the input dtypes, from recomputed logit tiles; float32 accumulation."""
    n, v = h.shape[0], w.shape[1]
    block_n = _row_block(n, block_n)
    block_v = min(block_v, v)
    n_pad = -(-n // block_n) * block_n
    n_full, tail = _vocab_walk(v, block_v)
    chunks = (_chunk_rows(_pad_rows(h, n_pad), block_n),) + tuple(
        _chunk_rows(_pad_rows(x[:, None], n_pad), block_n)  # row statistics as [rows, 1]
        for x in (targets.astype(jnp.int32), lse, entropy, g_lp, g_h)  # padded rows get g = 0: no contribution
    )

    def tile(h_c, t_c, lse_c, ent_c, glp_c, gh_c, w_c, offset, dh_c, dw):
        z = _matmul(h_c, w_c, ((1,), (0,))) / temperature
        onehot = (common.column_ids(z.shape, offset) == t_c).astype(jnp.float32)
        dz = common.logit_cotangent(z, lse_c, ent_c, onehot, glp_c, gh_c, temperature)
        dh_c = dh_c + _matmul(dz.astype(w.dtype), w_c, ((1,), (1,)))
        dw_tile = lax.dynamic_slice_in_dim(dw, offset, w_c.shape[1], axis=1)
        dw_tile = dw_tile + _matmul(h_c, dz.astype(h.dtype), ((0,), (0,)))
        return dh_c, lax.dynamic_update_slice_in_dim(dw, dw_tile, offset, axis=1)

    def token_chunk(dw, args):
        dh_c = jnp.zeros((block_n, h.shape[1]), jnp.float32)

        def body(j, carry):
            offset = j * block_v
            return tile(*args, lax.dynamic_slice_in_dim(w, offset, block_v, axis=1), offset, *carry)

        dh_c, dw = lax.fori_loop(0, n_full, body, (dh_c, dw))
        if tail:
            dh_c, dw = tile(*args, w[:, n_full * block_v :], n_full * block_v, dh_c, dw)
        return dw, dh_c

    dw, dh = lax.scan(token_chunk, jnp.zeros(w.shape, jnp.float32), chunks)
    return dh.reshape(n_pad, -1)[:n].astype(h.dtype), dw.astype(w.dtype)


def linear_logprob_entropy(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    *,
    temperature: float = 1.0,
    block_n: int | None = None,
    block_v: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(log p(target) [N], entropy [N]) float32 without materialising [N, V]; custom VJP for h and w.
    Block sizes left as None take default_blocks() of the default backend."""
    common.check_inputs(h, w, targets, temperature)
    auto_n, auto_v = default_blocks()
    block_n = auto_n if block_n is None else block_n
    block_v = auto_v if block_v is None else block_v
    if block_n < 1 or block_v < 1:
        raise ValueError(f"block sizes must be >= 1; got block_n={block_n}, block_v={block_v}")
    static = dict(temperature=float(temperature), block_n=int(block_n), block_v=int(block_v))
    fused = common.with_fused_vjp(functools.partial(forward, **static), functools.partial(backward, **static))
    return fused(h, w, targets)
