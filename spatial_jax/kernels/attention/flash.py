"""Flash attention for GPUs (Pallas, Triton lowering) with segment ids and a causal mask whose diagonal is offset:
the shared-prefix update's completions (queries) sit after their prompt's keys, query i seeing keys up to
i + causal_offset, which cuDNN's top-left causal alignment cannot express.

Forward: grid (rows, query heads, query blocks); a program walks the key blocks its queries can see (up to the causal
frontier), scores them in float32 and folds them into a running max, sum and float32 accumulator; it writes the
output and each query's log-sum-exp. Backward (jax.custom_vjp): two kernels that recompute the probabilities from the
log-sum-exp, so each output block has one writer and no atomics are needed: grid (rows, query heads, query blocks)
accumulating dq over key blocks, and grid (rows, query heads, key blocks) accumulating dk and dv over the query
blocks that see them (per query head; the G heads sharing a kv head are summed outside). Layouts [B, T, H, D] are
read in place (a head is a strided block). `reference` beside it is the same mathematics in plain jnp.

Visibility (as models.attention's AttentionMask): a query sees a key of its own non-zero segment and, if causal,
only keys at index <= its own index + causal_offset. A query that sees nothing (padding) returns a finite average
and gets no gradient.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from spatial_jax.kernels.platform import active_platform

MASK_VALUE = -1e30  # finite "minus infinity", as models.attention.MASK_VALUE
MIN_DOT = 16  # Triton's dot wants every dimension of a block at least this large


class _Static(NamedTuple):
    scale: float
    causal: bool
    offset: int
    block_q: int
    block_k: int
    num_warps: int
    num_stages: int
    interpret: bool


def _dot(a, b, *, trans_a=False, trans_b=False):
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return plgpu.dot(a, b, trans_a=trans_a, trans_b=trans_b, precision=precision).astype(jnp.float32)


def _visible(st: _Static, q_seg, kv_seg, q_start, k_start):
    """[block_q, block_k] visibility of queries from index q_start over keys from index k_start."""
    vis = (q_seg[:, None] == kv_seg[None, :]) & (kv_seg[None, :] != 0)
    if st.causal:
        rows = q_start + lax.broadcasted_iota(jnp.int32, vis.shape, 0)
        cols = k_start + lax.broadcasted_iota(jnp.int32, vis.shape, 1)
        vis = vis & (cols <= rows + st.offset)
    return vis


def _key_blocks(st: _Static, i, keys: int):
    """Key blocks the query block i reads: all, or up to the causal frontier of its last query."""
    n = keys // st.block_k
    if not st.causal:
        return n
    return jnp.clip(pl.cdiv((i + 1) * st.block_q + st.offset, st.block_k), 0, n)


def _forward_kernel(q_ref, k_ref, v_ref, qs_ref, ks_ref, o_ref, lse_ref, *, st: _Static):
    i = pl.program_id(2)
    q, q_seg = q_ref[...], qs_ref[...]
    bq, D = q.shape

    def body(j, carry):
        acc, m, total = carry
        keys = pl.ds(j * st.block_k, st.block_k)
        k, v = k_ref[keys, :], v_ref[keys, :]
        s = _dot(q, k, trans_b=True) * st.scale
        s = jnp.where(_visible(st, q_seg, ks_ref[keys], i * st.block_q, j * st.block_k), s, MASK_VALUE)
        m_new = jnp.maximum(m, s.max(axis=1))
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[:, None])
        return acc * alpha[:, None] + _dot(p.astype(v.dtype), v), m_new, total * alpha + p.sum(axis=1)

    init = (jnp.zeros((bq, D), jnp.float32), jnp.full((bq,), MASK_VALUE, jnp.float32), jnp.zeros((bq,), jnp.float32))
    acc, m, total = lax.fori_loop(0, _key_blocks(st, i, k_ref.shape[0]), body, init)
    o_ref[...] = (acc / total[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(total)


def _probs(st, q, k, q_seg, kv_seg, lse, q_start, k_start):
    s = _dot(q, k, trans_b=True) * st.scale
    return jnp.where(_visible(st, q_seg, kv_seg, q_start, k_start), jnp.exp(s - lse[:, None]), 0.0)


def _dq_kernel(q_ref, k_ref, v_ref, qs_ref, ks_ref, do_ref, lse_ref, delta_ref, dq_ref, *, st: _Static):
    i = pl.program_id(2)
    q, q_seg, do, lse, delta = q_ref[...], qs_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

    def body(j, dq):
        keys = pl.ds(j * st.block_k, st.block_k)
        k, v = k_ref[keys, :], v_ref[keys, :]
        p = _probs(st, q, k, q_seg, ks_ref[keys], lse, i * st.block_q, j * st.block_k)
        ds = p * (_dot(do, v, trans_b=True) - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k)

    dq = lax.fori_loop(0, _key_blocks(st, i, k_ref.shape[0]), body, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq * st.scale


def _dkv_kernel(q_ref, k_ref, v_ref, qs_ref, ks_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, st: _Static):
    j = pl.program_id(2)
    k, v, kv_seg = k_ref[...], v_ref[...], ks_ref[...]
    n_q = q_ref.shape[0] // st.block_q
    # causal: key j * block_k is first seen by query j * block_k - offset
    first = jnp.clip((j * st.block_k - st.offset) // st.block_q, 0, n_q) if st.causal else 0

    def body(i, carry):
        dk, dv = carry
        rows = pl.ds(i * st.block_q, st.block_q)
        q, do = q_ref[rows, :], do_ref[rows, :]
        p = _probs(st, q, k, qs_ref[rows], kv_seg, lse_ref[rows], i * st.block_q, j * st.block_k)
        dv = dv + _dot(p.astype(do.dtype), do, trans_a=True)
        ds = p * (_dot(do, v, trans_b=True) - delta_ref[rows][:, None])
        return dk + _dot(ds.astype(q.dtype), q, trans_a=True), dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(first, n_q, body, (zeros, zeros))
    dk_ref[...] = dk * st.scale
    dv_ref[...] = dv


def _specs(st: _Static, T: int, S: int, D: int, G: int, query_blocks: bool):
    """BlockSpecs of q, k, v, q segments, kv segments, do, lse, delta for a grid over query blocks (dq, forward) or
    key blocks (dkv); the other sequence is read whole and sliced in the kernel."""
    bq, bk = st.block_q, st.block_k
    if query_blocks:
        rows = lambda b, h, i: (b, i, h, 0)
        qt, kt = bq, S
        per_q = lambda b, h, i: (b, h, i)
        kv = lambda b, h, i: (b, 0, h // G, 0)
        qseg, kseg = (lambda b, h, i: (b, i)), (lambda b, h, i: (b, 0))
    else:
        rows = lambda b, h, j: (b, 0, h, 0)
        qt, kt = T, bk
        per_q = lambda b, h, j: (b, h, 0)
        kv = lambda b, h, j: (b, j, h // G, 0)
        qseg, kseg = (lambda b, h, j: (b, 0)), (lambda b, h, j: (b, j))
    return dict(q=pl.BlockSpec((None, qt, None, D), rows), kv=pl.BlockSpec((None, kt, None, D), kv),
                qseg=pl.BlockSpec((None, qt), qseg), kseg=pl.BlockSpec((None, kt), kseg),
                stat=pl.BlockSpec((None, None, qt), per_q))


def _call(kernel, st, grid, in_specs, out_specs, out_shape, name):
    return pl.pallas_call(functools.partial(kernel, st=st), grid=grid, in_specs=in_specs, out_specs=out_specs,
                          out_shape=out_shape, interpret=st.interpret, name=name,
                          compiler_params=plgpu.CompilerParams(num_warps=st.num_warps, num_stages=st.num_stages))


def _forward(st: _Static, q, k, v, q_seg, kv_seg):
    B, T, H, D = q.shape
    S, G = k.shape[1], H // k.shape[2]
    sp = _specs(st, T, S, D, G, True)
    return _call(_forward_kernel, st, (B, H, T // st.block_q),
                 [sp["q"], sp["kv"], sp["kv"], sp["qseg"], sp["kseg"]], [sp["q"], sp["stat"]],
                 [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, H, T), jnp.float32)],
                 "flash_attention_forward")(q, k, v, q_seg, kv_seg)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st: _Static, q, k, v, q_seg, kv_seg):
    return _forward(st, q, k, v, q_seg, kv_seg)[0]


def _flash_fwd(st, q, k, v, q_seg, kv_seg):
    o, lse = _forward(st, q, k, v, q_seg, kv_seg)
    return o, (q, k, v, q_seg, kv_seg, o, lse)


def _flash_bwd(st, res, do):
    q, k, v, q_seg, kv_seg, o, lse = res
    B, T, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    G = H // Hkv
    delta = jnp.einsum("bthd,bthd->bht", o.astype(jnp.float32), do.astype(jnp.float32))
    args = (q, k, v, q_seg, kv_seg, do, lse, delta)
    sq = _specs(st, T, S, D, G, True)
    ins = [sq["q"], sq["kv"], sq["kv"], sq["qseg"], sq["kseg"], sq["q"], sq["stat"], sq["stat"]]
    dq = _call(_dq_kernel, st, (B, H, T // st.block_q), ins, sq["q"], jax.ShapeDtypeStruct(q.shape, jnp.float32),
               "flash_attention_dq")(*args)
    sk = _specs(st, T, S, D, G, False)
    ins = [sk["q"], sk["kv"], sk["kv"], sk["qseg"], sk["kseg"], sk["q"], sk["stat"], sk["stat"]]
    per_head = pl.BlockSpec((None, st.block_k, None, D), lambda b, h, j: (b, j, h, 0))
    shape = jax.ShapeDtypeStruct((B, S, H, D), jnp.float32)  # per query head; summed over each kv head's G below
    dk, dv = _call(_dkv_kernel, st, (B, H, S // st.block_k), ins, [per_head, per_head], [shape, shape],
                   "flash_attention_dkv")(*args)
    dk = dk.reshape(B, S, Hkv, G, D).sum(3)
    dv = dv.reshape(B, S, Hkv, G, D).sum(3)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, q_segment_ids: jax.Array,
                    kv_segment_ids: jax.Array, *, scale: float, causal: bool = False, causal_offset: int = 0,
                    block_q: int = 64, block_k: int = 64, num_warps: int = 4, num_stages: int = 2,
                    interpret: bool | None = None) -> jax.Array:
    """softmax(q k^T * scale, masked) v for q [B, T, H, D], k/v [B, S, Hkv, D] (query head h reads kv head
    h // (H / Hkv)), segment ids [B, T] and [B, S] (0 = padding), optionally causal with the diagonal offset by
    `causal_offset` (query i sees keys up to i + causal_offset); returns [B, T, H, D] in q's dtype, differentiable
    in q, k and v. Sequences are padded to multiples of the blocks inside. `interpret` runs the Pallas interpreter
    (default: unless on a GPU)."""
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"flash_attention wants q [B, T, H, D], k and v [B, S, Hkv, D]; got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    (B, T, H, D), (Bk, S, Hkv, Dk) = q.shape, k.shape
    if Bk != B or Dk != D or H % Hkv:
        raise ValueError(f"k/v {k.shape} do not fit q {q.shape} (same batch and head size, Hkv dividing H)")
    if q_segment_ids.shape != (B, T) or kv_segment_ids.shape != (B, S):
        raise ValueError(f"segment ids must be [B, T] = {(B, T)} and [B, S] = {(B, S)}, got "
                         f"{q_segment_ids.shape}, {kv_segment_ids.shape}")
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    if causal_offset < 0 or (causal_offset and not causal):
        raise ValueError(f"causal_offset must be >= 0 and applies to a causal mask only, got {causal_offset}")
    if not (_pow2(block_q) and _pow2(block_k)) or num_warps < 1 or num_stages < 1:
        raise ValueError(f"block_q ({block_q}) and block_k ({block_k}) must be powers of two, num_warps and "
                         f"num_stages >= 1")
    if interpret is None:
        interpret = active_platform() != "gpu"
    if not interpret and (not _pow2(D) or min(D, block_q, block_k) < MIN_DOT):
        raise ValueError(f"on a GPU head_dim ({D}) must be a power of two and it, block_q and block_k at least "
                         f"{MIN_DOT}")
    tp, sp = -(-T // block_q) * block_q, -(-S // block_k) * block_k
    # padding queries and keys are segment 0: the keys are seen by no query, the queries are dropped
    pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n)) + ((0, 0),) * (x.ndim - 2))
    st = _Static(float(scale), bool(causal), int(causal_offset), block_q, block_k, num_warps, num_stages,
                 bool(interpret))
    out = _flash(st, pad(q, tp - T), pad(k, sp - S), pad(v, sp - S), pad(q_segment_ids.astype(jnp.int32), tp - T),
                 pad(kv_segment_ids.astype(jnp.int32), sp - S))
    return out[:, :T]


def reference(q, k, v, q_segment_ids, kv_segment_ids, *, scale: float, causal: bool = False,
              causal_offset: int = 0) -> jax.Array:
    """The same attention in plain jnp, float32 throughout."""
    B, T, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    qg = q.reshape(B, T, Hkv, H // Hkv, D).astype(jnp.float32)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, k.astype(jnp.float32), precision=lax.Precision.HIGHEST) * scale
    vis = (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]) & (kv_segment_ids[:, None, :] != 0)
    if causal:
        vis = vis & (jnp.arange(S)[None, None, :] <= jnp.arange(T)[None, :, None] + causal_offset)
    p = jax.nn.softmax(jnp.where(vis[:, None, None], s, MASK_VALUE), axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", p, v.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    return out.reshape(B, T, H, D).astype(q.dtype)
