"""Grouped matmul of the MoE layer's experts: x [M, K] with its rows sorted by group, group i's run of
group_sizes[i] rows times its own w[i] [K, N]; rows past sum(group_sizes) give 0.

    ragged_dot  XLA's jax.lax.ragged_dot, on every backend: the reference the kernel is held to (and itself held to
                transformers' loop over experts through the MoE layer, tests/test_model_archs.py).
    megablox    jax's Pallas TPU grouped matmul (jax.experimental.pallas.ops.tpu.megablox.gmm), through its own
                custom VJP: gmm with the weights transposed for the input's gradient, tgmm for the weights'. Grid
                (N tiles, active M tiles, K tiles) over tiles (tm, tk, tn) (`tiling`); only M tiles holding rows of a
                group are visited, and partial K / N tiles are masked inside the kernel, so only M must be a multiple
                of tm: the rows are padded to one. Off TPU it runs in the Pallas interpreter.

Rows past sum(group_sizes) (the expert-parallel buffers' padding, the rows added up to a multiple of tm) go to one
extra group that has no weights: megablox computes only the groups it has weights for and zeroes the other rows'
outputs and input gradients, as it does for a shard of the experts.

Mosaic kernels are not partitioned by XLA: under a mesh of several TPU chips `grouped_matmul(impl="megablox")` must
be called inside shard_map (models/moe.py does, on every path).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spatial_jax.kernels.platform import active_platform

IMPLS = ("ragged_dot", "megablox")
# megablox's own default tiles; no TPU here to tune them (the compile of one Qwen3-VL-30B-A3B layer with them is in
# benchmarks/RESULTS.md). tm is the rows' padding unit.
TILING = (128, 128, 128)
# Mosaic's layout: a block's last dimension in 128 lanes, its second-to-last in 8 sublanes
LANES, SUBLANES = 128, 8
SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def reference(x: jax.Array, w: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """The grouped matmul as XLA lowers it (jax.lax.ragged_dot): the reference of the kernel."""
    return jax.lax.ragged_dot(x, w, group_sizes)


def check_tiling(tiling: tuple[int, int, int], interpret: bool) -> tuple[int, int, int]:
    """The tiles, checked: positive ints, tm a multiple of 8; compiled for a TPU, tk and tn multiples of 128 too
    (the interpreter takes any, so tests can cut tiny shapes into several tiles)."""
    if len(tiling) != 3 or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tiling):
        raise ValueError(f"tiling must be three positive ints (tm, tk, tn); got {tiling!r}")
    tm, tk, tn = tiling
    if tm % SUBLANES:
        raise ValueError(f"tiling's tm must be a multiple of {SUBLANES}; got {tm}")
    if not interpret and (tk % LANES or tn % LANES):
        raise ValueError(f"tiling's tk and tn must be multiples of {LANES} for a TPU; got {tk}, {tn}")
    return tm, tk, tn


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, impl: str = "ragged_dot",
                   tiling: tuple[int, int, int] = TILING, interpret: bool | None = None) -> jax.Array:
    """x [M, K] (rows sorted by group), w [G, K, N], group_sizes [G] ints summing to at most M -> [M, N] in x's dtype.

    impl: one of IMPLS. tiling: megablox's (tm, tk, tn). interpret: run megablox in the Pallas interpreter (default:
    unless compiling for a TPU, the active mesh's devices or else the default backend)."""
    if impl not in IMPLS:
        raise ValueError(f"grouped matmul impl must be one of {IMPLS}; got {impl!r}")
    if x.ndim != 2 or w.ndim != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(f"grouped matmul wants x [M, K] and w [G, K, N]; got x{tuple(x.shape)}, w{tuple(w.shape)}")
    if group_sizes.shape != (w.shape[0],) or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(f"group_sizes must be [G={w.shape[0]}] integers; got {group_sizes.dtype}"
                         f"{tuple(group_sizes.shape)}")
    if x.dtype != w.dtype:
        raise ValueError(f"x and w must share a dtype; got {x.dtype} and {w.dtype}")
    if impl == "ragged_dot":
        return reference(x, w, group_sizes)
    if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
        raise ValueError(f"megablox takes float32 or bfloat16; got {x.dtype}")
    interpret = active_platform() != "tpu" if interpret is None else bool(interpret)
    return _megablox(x, w, group_sizes.astype(jnp.int32), check_tiling(tuple(tiling), interpret), interpret)


def _megablox(x, w, group_sizes, tiling, interpret):
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    M = x.shape[0]
    padded = -(-M // tiling[0]) * tiling[0]
    x = jnp.pad(x, ((0, padded - M), (0, 0)))
    # the rows past the groups form group G, which w has no matrix for (megablox's sharded-experts case)
    sizes = jnp.concatenate([group_sizes, (padded - jnp.sum(group_sizes))[None]])
    # positional: gmm's custom_vjp takes its static arguments (dtype, tiling, transpose_rhs, interpret) by position
    out = gmm(x, w, sizes, x.dtype, tiling, None, None, False, interpret)
    return out[:M]


def kernel_calls(hlo: str) -> dict[str, int]:
    """Mosaic kernel call sites of each grouped matmul in a compiled XLA:TPU program's HLO text: megablox's (its gmm
    and tgmm, told by their jitted functions' names in the op name) and those of XLA:TPU's own lowering of
    ragged_dot, which is Mosaic kernels too (ragged-dot-*, with one metadata kernel)."""
    calls = [line for line in hlo.splitlines() if 'custom_call_target="tpu_custom_call"' in line]
    return {"megablox": sum("/jit(gmm)/" in c or "/jit(tgmm)/" in c for c in calls),
            "ragged_dot": sum('op_name="ragged-dot' in c or "/ragged-dot-" in c for c in calls)}
