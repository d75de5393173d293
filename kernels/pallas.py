"""Pallas kernels laid out for TPU: forward statistics, then dh and dw, each recomputing logit tiles.

Forward: grid (token blocks, vocab blocks, hidden blocks); the vocabulary is the reduction axis, with the running max,
sum exp and sum exp * (z - max) plus the target logit in VMEM scratch; the hidden axis accumulates one
[block_n, block_v] float32 logit tile. Backward: two kernels that recompute each tile over the full hidden size
(the tile's cotangent needs the finished logits) - grid (token, vocab) accumulating dh, grid (vocab, token)
accumulating dw - so every output block has a single writer and no atomics are needed; the price is one extra
logit recompute against a fused single-kernel backward.

The last vocabulary block reads past V: those columns are masked to -inf before the max and the sums, and their
cotangent is 0, so whatever the out-of-bounds read holds never reaches a result. Tokens are padded with zero rows.
Off TPU the kernels run in the Pallas interpreter (interpret=True), which is how they are tested on CPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from . import common

DEFAULT_BLOCK_N = 256
DEFAULT_BLOCK_V = 512
DEFAULT_BLOCK_D = 512

_HIGHEST = lax.Precision.HIGHEST


def _dot(a, b, contract):
    return lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32, precision=_HIGHEST)


def _forward_kernel(h_ref, w_ref, t_ref, lp_ref, ent_ref, lse_ref, acc, m_ref, s_ref, sz_ref, zt_ref, *, v,
                    temperature):
    j, k = pl.program_id(1), pl.program_id(2)
    last_j, last_k = pl.num_programs(1) - 1, pl.num_programs(2) - 1
    block_v = w_ref.shape[1]

    @pl.when(jnp.logical_and(j == 0, k == 0))
    def _init_stats():
        m_ref[...], s_ref[...], sz_ref[...], zt_ref[...] = common.init_stats(m_ref.shape[0])

    @pl.when(k == 0)
    def _init_tile():
        acc[...] = jnp.zeros_like(acc)

    acc[...] += _dot(h_ref[...], w_ref[...], ((1,), (0,)))

    @pl.when(k == last_k)
    def _fold_tile():
        z = acc[...] / temperature
        offset = j * block_v
        valid = common.column_ids(z.shape, offset) < v
        m, s, sz = common.online_update(m_ref[...], s_ref[...], sz_ref[...], z, valid)
        m_ref[...], s_ref[...], sz_ref[...] = m, s, sz
        zt_ref[...] += common.target_logit(z, t_ref[...], offset)

    @pl.when(jnp.logical_and(j == last_j, k == last_k))
    def _write():
        lp_ref[...], ent_ref[...], lse_ref[...] = common.finalize(m_ref[...], s_ref[...], sz_ref[...], zt_ref[...])


def _tile_cotangent(h_ref, w_ref, t_ref, lse_ref, ent_ref, glp_ref, gh_ref, offset, *, v, temperature):
    """Recomputed [block_n, block_v] logit cotangent; columns at or past V are exactly 0."""
    z = _dot(h_ref[...], w_ref[...], ((1,), (0,))) / temperature
    cols = common.column_ids(z.shape, offset)
    z = jnp.where(cols < v, z, -jnp.inf)
    onehot = (cols == t_ref[...]).astype(jnp.float32)
    return common.logit_cotangent(z, lse_ref[...], ent_ref[...], onehot, glp_ref[...], gh_ref[...], temperature)


def _dh_kernel(h_ref, w_ref, t_ref, lse_ref, ent_ref, glp_ref, gh_ref, dh_ref, *, v, temperature):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        dh_ref[...] = jnp.zeros_like(dh_ref)

    offset = j * w_ref.shape[1]
    dz = _tile_cotangent(h_ref, w_ref, t_ref, lse_ref, ent_ref, glp_ref, gh_ref, offset, v=v, temperature=temperature)
    # 0 * (whatever lies past V) can be nan: zero those weight columns, not only their cotangent.
    w_tile = jnp.where(common.column_ids(w_ref.shape, offset) < v, w_ref[...], 0)
    dh_ref[...] += _dot(dz.astype(w_ref.dtype), w_tile, ((1,), (1,)))


def _dw_kernel(h_ref, w_ref, t_ref, lse_ref, ent_ref, glp_ref, gh_ref, dw_ref, *, v, temperature):
    j, i = pl.program_id(0), pl.program_id(1)

    @pl.when(i == 0)
    def _init():
        dw_ref[...] = jnp.zeros_like(dw_ref)

    dz = _tile_cotangent(
        h_ref, w_ref, t_ref, lse_ref, ent_ref, glp_ref, gh_ref, j * w_ref.shape[1], v=v, temperature=temperature
    )
    dw_ref[...] += _dot(h_ref[...], dz.astype(h_ref.dtype), ((0,), (0,)))


def _compiler_params(semantics):
    return pltpu.CompilerParams(dimension_semantics=semantics)


def _pad_rows(x, rows: int):
    pad = rows - x.shape[0]
    return x if pad == 0 else jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))


def forward(h, w, targets, *, temperature, block_n, block_v, block_d, interpret):
    """(log p(target), entropy, lse), float32 [N]."""
    (n, d), v = h.shape, w.shape[1]
    n_pad = pl.cdiv(n, block_n) * block_n
    grid = (n_pad // block_n, pl.cdiv(v, block_v), d // block_d)
    row_spec = pl.BlockSpec((block_n, 1), lambda i, j, k: (i, 0))
    stat = jax.ShapeDtypeStruct((n_pad, 1), jnp.float32)
    lp, entropy, lse = pl.pallas_call(
        functools.partial(_forward_kernel, v=v, temperature=temperature),
        grid=grid,
        in_specs=[
            pl.BlockSpec((block_n, block_d), lambda i, j, k: (i, k)),
            pl.BlockSpec((block_d, block_v), lambda i, j, k: (k, j)),
            row_spec,
        ],
        out_specs=[row_spec, row_spec, row_spec],
        out_shape=[stat, stat, stat],
        scratch_shapes=[pltpu.VMEM((block_n, block_v), jnp.float32)]
        + [pltpu.VMEM((block_n, 1), jnp.float32) for _ in range(4)],
        compiler_params=_compiler_params(("parallel", "arbitrary", "arbitrary")),
        interpret=interpret,
    )(_pad_rows(h, n_pad), w, _pad_rows(targets.astype(jnp.int32)[:, None], n_pad))
    return lp[:n, 0], entropy[:n, 0], lse[:n, 0]


def backward(h, w, targets, lse, entropy, g_lp, g_h, *, temperature, block_n, block_v, block_d, interpret):
    """(dh, dw) in the input dtypes; block_d is unused here (each tile needs the full hidden contraction)."""
    del block_d
    (n, d), v = h.shape, w.shape[1]
    n_pad = pl.cdiv(n, block_n) * block_n
    n_blocks, v_blocks = n_pad // block_n, pl.cdiv(v, block_v)
    rows = [_pad_rows(h, n_pad)] + [
        _pad_rows(x[:, None], n_pad)  # padded rows carry g = 0, so they add nothing to dw
        for x in (targets.astype(jnp.int32), lse, entropy, g_lp, g_h)
    ]
    static = dict(v=v, temperature=temperature)

    def specs(token_axis, vocab_axis):
        def pick(axis):
            return lambda *ids: ids[axis]

        tok, voc = pick(token_axis), pick(vocab_axis)
        row = pl.BlockSpec((block_n, 1), lambda *ids: (tok(*ids), 0))
        return [
            pl.BlockSpec((block_n, d), lambda *ids: (tok(*ids), 0)),
            pl.BlockSpec((d, block_v), lambda *ids: (0, voc(*ids))),
        ] + [row] * 5

    args = (rows[0], w, *rows[1:])
    dh = pl.pallas_call(
        functools.partial(_dh_kernel, **static),
        grid=(n_blocks, v_blocks),
        in_specs=specs(0, 1),
        out_specs=pl.BlockSpec((block_n, d), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((n_pad, d), jnp.float32),
        compiler_params=_compiler_params(("parallel", "arbitrary")),
        interpret=interpret,
    )(*args)
    dw = pl.pallas_call(
        functools.partial(_dw_kernel, **static),
        grid=(v_blocks, n_blocks),
        in_specs=specs(1, 0),
        out_specs=pl.BlockSpec((d, block_v), lambda j, i: (0, j)),
        out_shape=jax.ShapeDtypeStruct((d, v), jnp.float32),
        compiler_params=_compiler_params(("parallel", "arbitrary")),
        interpret=interpret,
    )(*args)
    return dh[:n].astype(h.dtype), dw.astype(w.dtype)


def _check_blocks(d: int, block_n: int, block_v: int, block_d: int, interpret: bool) -> None:
    if min(block_n, block_v, block_d) < 1:
        raise ValueError(f"block sizes must be >= 1; got {block_n}, {block_v}, {block_d}")
    if d % block_d:
        raise ValueError(f"block_d={block_d} must divide the hidden size {d} (the hidden axis is never padded)")
    if not interpret and (block_n % 8 or block_v % 128 or (block_d % 128 and block_d != d)):
        raise ValueError(
            f"TPU tiles need block_n % 8 == 0, block_v % 128 == 0 and block_d % 128 == 0 (or = D); "
            f"got block_n={block_n}, block_v={block_v}, block_d={block_d}"
        )


def linear_logprob_entropy(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    *,
    temperature: float = 1.0,
    block_n: int = DEFAULT_BLOCK_N,
    block_v: int = DEFAULT_BLOCK_V,
    block_d: int | None = None,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(log p(target) [N], entropy [N]) float32 from Pallas kernels; custom VJP for h and w.

    block_d defaults to the largest of 512/256/128 dividing D, else D. interpret defaults to True off TPU.
    """
    common.check_inputs(h, w, targets, temperature)
    d = h.shape[1]
    if block_d is None:
        block_d = next((b for b in (DEFAULT_BLOCK_D, 256, 128) if d % b == 0), d)
    if interpret is None:
        interpret = jax.default_backend() != "tpu"
    _check_blocks(d, block_n, block_v, block_d, interpret)
    static = dict(
        temperature=float(temperature),
        block_n=int(block_n),
        block_v=int(block_v),
        block_d=int(block_d),
        interpret=bool(interpret),
    )
    fused = common.with_fused_vjp(functools.partial(forward, **static), functools.partial(backward, **static))
    return fused(h, w, targets)
