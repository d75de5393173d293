"""Decode attention over a paged KV cache for GPUs (Pallas, Triton lowering): one query per row reads its keys and
values in place, page by page through the row's page table, with no gathered copy of its window.

Grid (rows, kv heads, splits). A program holds the G = H / Hkv query heads that share one kv head (padded to
`block_h` rows, as Triton's dot wants at least 16) and walks its split's share of the row's page table in blocks of
`pages_per_block` pages: each block's keys are loaded by page index ([pages_per_block, page_size, D] straight from
the pool), scored in float32, masked past the row's length, and folded into a running max, sum and float32
accumulator (online softmax). Blocks past the row's length are never visited. Splits divide a row's pages among
programs (more parallel work when rows are few); their partial results are merged outside the kernel by
log-sum-exp weights. `reference` beside it is the same mathematics on a gathered copy, in plain jnp.

Pools are the engine's layout (models/paged.py): [n_kv, pages, page_size, head_dim]; a row sees positions
0 .. lengths[b] - 1 of its pages (this step's token included).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from spatial_jax.kernels.platform import active_platform

# Finite "minus infinity" for masked scores (as models.attention.MASK_VALUE): exp(MASK - max) is exactly 0.
MASK_VALUE = -1e30
# Triton's dot wants every dimension of a block at least this large
MIN_DOT = 16
# Programs `splits=None` aims for: about one per streaming multiprocessor of an H100/H200 (132), so a few rows
# (decoding one sequence: Hkv programs) still spread their pages over the chip
TARGET_PROGRAMS = 128


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _kernel(q_ref, k_ref, v_ref, table_ref, len_ref, o_ref, m_ref, l_ref, *, scale: float, pages_per_block: int,
            pages_per_split: int, precision):
    split = pl.program_id(2)
    page_size, D = k_ref.shape[1], k_ref.shape[2]
    block_k = pages_per_block * page_size
    q = q_ref[...]
    length = len_ref[0]
    first = split * pages_per_split * page_size  # first position of this split
    last = jnp.minimum(length, first + pages_per_split * page_size)
    blocks = jnp.maximum(0, pl.cdiv(last - first, block_k))

    def body(i, carry):
        acc, m, total = carry
        pages = table_ref[pl.ds(split * pages_per_split + i * pages_per_block, pages_per_block)]
        k = k_ref[pages].reshape(block_k, D)
        v = v_ref[pages].reshape(block_k, D)
        s = plgpu.dot(q, k, trans_b=True, precision=precision).astype(jnp.float32) * scale  # [block_h, block_k]
        pos = first + i * block_k + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(pos < length, s, MASK_VALUE)
        m_new = jnp.maximum(m, s.max(axis=1))
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[:, None])
        pv = plgpu.dot(p.astype(v.dtype), v, precision=precision).astype(jnp.float32)
        return acc * alpha[:, None] + pv, m_new, total * alpha + p.sum(axis=1)

    block_h = q.shape[0]
    init = (jnp.zeros((block_h, D), jnp.float32), jnp.full((block_h,), MASK_VALUE, jnp.float32),
            jnp.zeros((block_h,), jnp.float32))
    acc, m, total = lax.fori_loop(0, blocks, body, init)
    o_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = total


@functools.partial(jax.jit, static_argnames=("scale", "pages_per_block", "splits", "block_h", "num_warps",
                                             "num_stages", "interpret"))
def _paged(q, pool_k, pool_v, page_table, lengths, *, scale, pages_per_block, splits, block_h, num_warps,
           num_stages, interpret):
    B, H, D = q.shape
    Hkv, _, page_size, _ = pool_k.shape
    G = H // Hkv
    W = page_table.shape[1]
    per_split = -(-W // (splits * pages_per_block)) * pages_per_block
    table = jnp.pad(page_table.astype(jnp.int32), ((0, 0), (0, splits * per_split - W)))  # padding reads page 0
    qg = jnp.pad(q.reshape(B, Hkv, G, D), ((0, 0), (0, 0), (0, block_h - G), (0, 0)))
    lengths = jnp.maximum(lengths.astype(jnp.int32), 1)  # an idle row (no keys) reads one key of scratch, not NaN
    precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    kernel = functools.partial(_kernel, scale=scale, pages_per_block=pages_per_block, pages_per_split=per_split,
                               precision=precision)
    pool_spec = pl.BlockSpec((None, *pool_k.shape[1:]), lambda b, h, s: (h, 0, 0, 0))
    stats_spec = pl.BlockSpec((None, None, None, block_h), lambda b, h, s: (b, h, s, 0))
    acc, m, total = pl.pallas_call(
        kernel,
        grid=(B, Hkv, splits),
        in_specs=[
            pl.BlockSpec((None, None, block_h, D), lambda b, h, s: (b, h, 0, 0)),  # the kv head's query heads
            pool_spec,  # keys: the head's whole pool, indexed by page inside the kernel
            pool_spec,  # values
            pl.BlockSpec((None, splits * per_split), lambda b, h, s: (b, 0)),  # the row's page table
            pl.BlockSpec((1,), lambda b, h, s: (b,)),  # the row's length
        ],
        out_specs=[pl.BlockSpec((None, None, None, block_h, D), lambda b, h, s: (b, h, s, 0, 0)), stats_spec,
                   stats_spec],
        out_shape=[jax.ShapeDtypeStruct((B, Hkv, splits, block_h, D), jnp.float32),
                   jax.ShapeDtypeStruct((B, Hkv, splits, block_h), jnp.float32),
                   jax.ShapeDtypeStruct((B, Hkv, splits, block_h), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="paged_decode_attention",
    )(qg, pool_k, pool_v, table, lengths)
    # merge the splits: each one's sums rescaled to the common max
    top = m.max(axis=2, keepdims=True)
    w = jnp.exp(m - top)
    out = (acc * w[..., None]).sum(axis=2) / (total * w).sum(axis=2)[..., None]
    return out[:, :, :G].reshape(B, H, D).astype(q.dtype)


def paged_decode_attention(q: jax.Array, pool_k: jax.Array, pool_v: jax.Array, page_table: jax.Array,
                           lengths: jax.Array, *, scale: float, pages_per_block: int = 4, splits: int | None = None,
                           num_warps: int = 4, num_stages: int = 2, interpret: bool | None = None) -> jax.Array:
    """softmax(q k^T * scale) v for one query per row, q [B, H, D], over the row's first `lengths[b]` positions of
    pools [Hkv, pages, page_size, D] (query head h reads kv head h // (H / Hkv)) through page_table [B, W] (position
    p is slot p % page_size of page page_table[b, p // page_size]); returns [B, H, D] in q's dtype. Scores, softmax
    and accumulation in float32. `pages_per_block` pages are scored per step of a program, `splits` programs share a
    row's pages (None: on a GPU enough for about TARGET_PROGRAMS programs in all, at most one per block of the
    table; interpreted, 1);
    `interpret` runs the Pallas interpreter (default: unless on a GPU)."""
    if q.ndim != 3 or pool_k.ndim != 4 or pool_v.shape != pool_k.shape:
        raise ValueError(f"paged_decode_attention wants q [B, H, D] and pools [Hkv, pages, page_size, D]; got "
                         f"{q.shape}, {pool_k.shape}, {pool_v.shape}")
    (B, H, D), (Hkv, _, page_size, Dk) = q.shape, pool_k.shape
    if Dk != D or H % Hkv:
        raise ValueError(f"pools {pool_k.shape} do not fit q {q.shape} (same head size, Hkv dividing H)")
    if page_table.ndim != 2 or page_table.shape[0] != B or lengths.shape != (B,):
        raise ValueError(f"page_table must be [B, W] and lengths [B] for B={B}; got {page_table.shape}, "
                         f"{lengths.shape}")
    if not (jnp.issubdtype(page_table.dtype, jnp.integer) and jnp.issubdtype(lengths.dtype, jnp.integer)):
        raise ValueError(f"page_table and lengths must be integers, got {page_table.dtype}, {lengths.dtype}")
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    if interpret is None:
        interpret = active_platform() != "gpu"
    if splits is None:  # the interpreter runs programs one by one: splitting buys nothing there
        blocks = -(-page_table.shape[1] // max(1, pages_per_block))
        splits = 1 if interpret else max(1, min(blocks, -(-TARGET_PROGRAMS // (B * Hkv))))
    if pages_per_block < 1 or splits < 1 or num_warps < 1 or num_stages < 1:
        raise ValueError(f"pages_per_block, splits, num_warps and num_stages must be >= 1, got {pages_per_block}, "
                         f"{splits}, {num_warps}, {num_stages}")
    if not interpret:  # Triton's blocks: power-of-two shapes, dots of at least MIN_DOT in every dimension
        if not (_pow2(D) and D >= MIN_DOT and _pow2(page_size) and _pow2(pages_per_block)
                and pages_per_block * page_size >= MIN_DOT):
            raise ValueError(f"on a GPU head_dim ({D}), page_size ({page_size}) and pages_per_block "
                             f"({pages_per_block}) must be powers of two, head_dim and a block of "
                             f"pages_per_block * page_size keys at least {MIN_DOT}")
    block_h = max(MIN_DOT, 1 << (H // Hkv - 1).bit_length())
    return _paged(q, pool_k, pool_v, page_table, lengths, scale=float(scale), pages_per_block=pages_per_block,
                  splits=splits, block_h=block_h, num_warps=num_warps, num_stages=num_stages,
                  interpret=bool(interpret))


def reference(q, pool_k, pool_v, page_table, lengths, *, scale: float) -> jax.Array:
    """The same attention on a gathered copy of every row's pages: float32 scores and softmax, probabilities
    applied in float32."""
    B, H, D = q.shape
    Hkv, _, page_size, _ = pool_k.shape
    W = page_table.shape[1]
    k = pool_k[:, page_table].reshape(Hkv, B, W * page_size, D).astype(jnp.float32)
    v = pool_v[:, page_table].reshape(Hkv, B, W * page_size, D).astype(jnp.float32)
    qg = q.reshape(B, Hkv, H // Hkv, D).astype(jnp.float32)
    s = jnp.einsum("bkgd,kbsd->bkgs", qg, k, precision=lax.Precision.HIGHEST) * scale
    visible = jnp.arange(W * page_size)[None, :] < jnp.maximum(lengths, 1)[:, None]
    s = jnp.where(visible[:, None, None, :], s, MASK_VALUE)
    out = jnp.einsum("bkgs,kbsd->bkgd", jax.nn.softmax(s, axis=-1), v, precision=lax.Precision.HIGHEST)
    return out.reshape(B, H, D).astype(q.dtype)
