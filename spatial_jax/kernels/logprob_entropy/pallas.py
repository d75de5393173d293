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
from jax.sharding import PartitionSpec as P

from spatial_jax.kernels.platform import active_platform, compiled_device

from . import common

DEFAULT_BLOCK_D = 512
# The named scope of every LM-head kernel call: a compiled program's op names then tell these Mosaic kernels apart
# from others (splash attention), which is how `spatial-jax plan` reports that the LM head compiled as Pallas.
SCOPE = "pallas_lm_head"
MiB = 1 << 20
# Scoped VMEM limit asked of Mosaic per TPU generation (by jax's device_kind): 3/4 of the core's VMEM (jax's
# tpu_info: v5e 128 MiB, v5p 64 MiB, v6e 128 MiB), since the compiler's scoped default (16 MiB on v5e/v5p,
# 32 MiB on v6e) cannot hold even the smallest backward tiles at D = 4096 in float32. Unknown kinds keep the default.
VMEM_LIMITS = {
    "TPU v5 lite": 96 * MiB,
    "TPU v5e": 96 * MiB,
    "TPU v5": 48 * MiB,
    "TPU v5p": 48 * MiB,
    "TPU v6 lite": 96 * MiB,
    "TPU v6e": 96 * MiB,
}
_DEFAULT_SCOPED_VMEM = 16 * MiB
# (block_n, block_v), most preferred first: larger tiles read w fewer times (dh kernel) and h fewer times (dw kernel).
_TILE_CANDIDATES = ((512, 1024), (512, 512), (256, 512), (256, 256), (128, 256), (128, 128), (8, 128))



def _dot(a, b, contract):
    """float32-accumulated dot; full-precision passes for float32 operands only (Mosaic rejects a float32 contract
    precision on bfloat16 operands: "Bad lhs type")."""
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else lax.Precision.DEFAULT
    return lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32, precision=precision)


def _forward_kernel(h_ref, w_ref, t_ref, zt_out, ent_ref, lse_ref, acc, m_ref, s_ref, sz_ref, zt_ref, *, v,
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
        _, ent_ref[...], lse_ref[...] = common.finalize(m_ref[...], s_ref[...], sz_ref[...], zt_ref[...])
        zt_out[...] = zt_ref[...]


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


def _compiler_params(semantics, vmem_limit_bytes):
    return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=vmem_limit_bytes)


def _pad_rows(x, rows: int):
    pad = rows - x.shape[0]
    return x if pad == 0 else jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))


def forward_stats(h, w, targets, *, temperature, block_n, block_v, block_d, vmem_limit_bytes, interpret):
    """(target logit, entropy, lse), float32 [N], over the columns of w; the target logit is 0 for a target in no
    column, so statistics of vocabulary shards combine by a sum (sharded_forward)."""
    (n, d), v = h.shape, w.shape[1]
    n_pad = pl.cdiv(n, block_n) * block_n
    grid = (n_pad // block_n, pl.cdiv(v, block_v), d // block_d)
    row_spec = pl.BlockSpec((block_n, 1), lambda i, j, k: (i, 0))
    stat = jax.ShapeDtypeStruct((n_pad, 1), jnp.float32)
    call = pl.pallas_call(
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
        compiler_params=_compiler_params(("parallel", "arbitrary", "arbitrary"), vmem_limit_bytes),
        interpret=interpret,
    )
    with jax.named_scope(SCOPE):
        z_target, entropy, lse = call(_pad_rows(h, n_pad), w, _pad_rows(targets.astype(jnp.int32)[:, None], n_pad))
    return z_target[:n, 0], entropy[:n, 0], lse[:n, 0]


def forward(h, w, targets, **static):
    """(log p(target), entropy, lse), float32 [N]."""
    z_target, entropy, lse = forward_stats(h, w, targets, **static)
    return z_target - lse, entropy, lse


def backward(h, w, targets, lse, entropy, g_lp, g_h, *, temperature, block_n, block_v, block_d, vmem_limit_bytes,
             interpret):
    """(dh, dw) float32 from the global lse and entropy; block_d is unused here (each tile needs the full hidden
    contraction). A target in no column of w (or -1) contributes no one-hot term."""
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
    with jax.named_scope(SCOPE):
        dh = pl.pallas_call(
            functools.partial(_dh_kernel, **static),
            grid=(n_blocks, v_blocks),
            in_specs=specs(0, 1),
            out_specs=pl.BlockSpec((block_n, d), lambda i, j: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((n_pad, d), jnp.float32),
            compiler_params=_compiler_params(("parallel", "arbitrary"), vmem_limit_bytes),
            interpret=interpret,
        )(*args)
        dw = pl.pallas_call(
            functools.partial(_dw_kernel, **static),
            grid=(v_blocks, n_blocks),
            in_specs=specs(1, 0),
            out_specs=pl.BlockSpec((d, block_v), lambda j, i: (0, j)),
            out_shape=jax.ShapeDtypeStruct((d, v), jnp.float32),
            compiler_params=_compiler_params(("parallel", "arbitrary"), vmem_limit_bytes),
            interpret=interpret,
        )(*args)
    return dh[:n], dw


def _vmem_estimate(block_n: int, block_v: int, block_d: int, d: int, itemsize: int) -> int:
    """Upper estimate of the largest kernel's VMEM: double-buffered blocks, the float32 tiles and temporaries, and
    [block_n, 1] row vectors padded to 128 lanes."""
    tile, rows = block_n * block_v * 4, block_n * 128 * 4
    fwd = 2 * (block_n * block_d + block_d * block_v) * itemsize + 4 * tile + 12 * rows
    grad_in = 2 * (block_n * d + d * block_v) * itemsize + 4 * tile + 10 * rows
    dh = grad_in + d * block_v * itemsize + 3 * block_n * d * 4  # masked w copy, dh blocks, dot result
    dw = grad_in + 3 * d * block_v * 4  # dw blocks, dot result
    return max(fwd, dh, dw)


def default_blocks(device_kind: str | None, d: int, dtype) -> tuple[int, int, int, int | None]:
    """(block_n, block_v, block_d, vmem_limit_bytes) for a TPU generation: the largest tiles whose estimated VMEM
    fits 3/4 of the generation's limit (the rest is Mosaic's own scratch); unknown kinds get the compiler's
    default limit."""
    limit = VMEM_LIMITS.get(device_kind or "")
    budget = 3 * (limit or _DEFAULT_SCOPED_VMEM) // 4
    block_d = next((b for b in (DEFAULT_BLOCK_D, 256, 128) if d % b == 0), d)
    itemsize = jnp.dtype(dtype).itemsize
    fits = [bnv for bnv in _TILE_CANDIDATES if _vmem_estimate(*bnv, block_d, d, itemsize) <= budget]
    block_n, block_v = fits[0] if fits else _TILE_CANDIDATES[-1]
    return block_n, block_v, block_d, limit


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


def _local_targets(targets, v_local: int, vocab_axis):
    """Targets as column ids of this vocabulary shard; -1 (matches no column) for a target in another shard."""
    t = targets.astype(jnp.int32)
    if vocab_axis is not None:
        t = t - lax.axis_index(vocab_axis) * v_local
    return jnp.where((t >= 0) & (t < v_local), t, -1)


def _combine_shards(z_target, entropy, lse, vocab_axis):
    """Global (target logit, entropy, lse) from per-shard statistics, float32. With shard weights
    w_s = exp(lse_s - lse) (summing to 1), H = sum_s w_s (H_s - log w_s): the entropy of a mixture of the shards'
    softmaxes, with no large logit subtracted from another."""
    m = lax.pmax(lse, vocab_axis)
    lse_g = m + jnp.log(lax.psum(jnp.exp(lse - m), vocab_axis))
    log_w = lse - lse_g
    weight = jnp.exp(log_w)
    ent_g = lax.psum(jnp.where(weight > 0, weight * (entropy - log_w), 0.0), vocab_axis)
    return lax.psum(z_target, vocab_axis), ent_g, lse_g


def _mesh_axes(mesh, n: int, v: int):
    """(token axes, vocabulary axis or None): vocabulary over `tensor`, tokens over every other mesh axis; an axis
    that does not divide its dimension is dropped (that dimension is replicated over it), as in models.sharding."""
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    vocab_axis = "tensor" if sizes.get("tensor", 1) > 1 and v % sizes["tensor"] == 0 else None
    token_axes, prod = [], 1
    for ax in mesh.axis_names:
        if ax != "tensor" and sizes[ax] > 1 and n % (prod * sizes[ax]) == 0:
            token_axes.append(ax)
            prod *= sizes[ax]
    return tuple(token_axes), vocab_axis


def sharded_pair(mesh, n: int, v: int, static: dict):
    """(forward, backward) over a mesh: each runs the kernels per shard inside shard_map (Mosaic kernels cannot be
    partitioned automatically). forward combines the shards' statistics over the vocabulary axis; backward gets
    the global lse and entropy, sums dh over the vocabulary axis and dw over the token axes, in float32."""
    token_axes, vocab_axis = _mesh_axes(mesh, n, v)
    tok = token_axes or None
    rows, h_spec, w_spec = P(tok), P(tok, None), P(None, vocab_axis)

    def local_forward(h, w, targets):
        z_target, entropy, lse = forward_stats(h, w, _local_targets(targets, w.shape[1], vocab_axis), **static)
        if vocab_axis is not None:
            z_target, entropy, lse = _combine_shards(z_target, entropy, lse, vocab_axis)
        return z_target - lse, entropy, lse

    def local_backward(h, w, targets, lse, entropy, g_lp, g_h):
        t = _local_targets(targets, w.shape[1], vocab_axis)
        dh, dw = backward(h, w, t, lse, entropy, g_lp, g_h, **static)
        if vocab_axis is not None:
            dh = lax.psum(dh, vocab_axis)
        if token_axes:
            dw = lax.psum(dw, token_axes)
        return dh.astype(h.dtype), dw.astype(w.dtype)

    # check_vma=False: pallas_call results carry no varying-axes type, so the checker cannot follow them.
    fwd = jax.shard_map(local_forward, mesh=mesh, in_specs=(h_spec, w_spec, rows), out_specs=(rows,) * 3,
                        check_vma=False)
    bwd = jax.shard_map(local_backward, mesh=mesh, in_specs=(h_spec, w_spec) + (rows,) * 5,
                        out_specs=(h_spec, w_spec), check_vma=False)
    return fwd, bwd


def linear_logprob_entropy(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    *,
    temperature: float = 1.0,
    block_n: int | None = None,
    block_v: int | None = None,
    block_d: int | None = None,
    vmem_limit_bytes: int | None = None,
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
    interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
    """(log p(target) [N], entropy [N]) float32 from Pallas kernels; custom VJP for h and w.

    mesh defaults to the active one (jax.set_mesh); with more than one device the kernels run per shard in
    shard_map: tokens over the mesh axes other than `tensor`, the vocabulary over `tensor`. Blocks and the VMEM
    limit left as None come from default_blocks for the mesh's (else the default device's) TPU generation.
    interpret defaults to True unless those devices are TPUs.
    """
    common.check_inputs(h, w, targets, temperature)
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
    device = compiled_device(mesh)
    kind, platform = (None if device is None else device.device_kind), active_platform(mesh)
    (n, d), v = h.shape, w.shape[1]
    auto = default_blocks(kind, d, h.dtype)
    block_n, block_v, block_d, vmem_limit_bytes = (
        auto[i] if x is None else x for i, x in enumerate((block_n, block_v, block_d, vmem_limit_bytes))
    )
    if interpret is None:
        interpret = platform != "tpu"
    _check_blocks(d, block_n, block_v, block_d, interpret)
    static = dict(
        temperature=float(temperature),
        block_n=int(block_n),
        block_v=int(block_v),
        block_d=int(block_d),
        vmem_limit_bytes=None if interpret or vmem_limit_bytes is None else int(vmem_limit_bytes),
        interpret=bool(interpret),
    )
    if mesh.size > 1:
        fwd, bwd = sharded_pair(mesh, n, v, static)
    else:
        fwd = functools.partial(forward, **static)

        def bwd(h, w, *rest):
            dh, dw = backward(h, w, *rest, **static)
            return dh.astype(h.dtype), dw.astype(w.dtype)

    return common.with_fused_vjp(fwd, bwd)(h, w, targets)
