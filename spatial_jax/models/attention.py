"""Softmax attention behind one entry point, `attention`, with the implementation chosen per backend.

    xla     einsum scores in float32, queries optionally in checkpointed blocks (`chunk`), so no [B, H, T, S]
            tensor is live; every backend, and the only path for an explicit [B, T, S] mask (KV-cache calls).
    splash  the Pallas TPU kernel (jax.experimental.pallas.ops.tpu.splash_attention): causal mask, padding and
            segments as segment ids, run per shard under shard_map (Mosaic kernels cannot be partitioned
            automatically); off TPU it runs in the Pallas interpreter (tests).
    cudnn   cuDNN flash attention through jax.nn.dot_product_attention(implementation="cudnn") (CUDA, bf16/fp16).
    pallas  this project's flash kernel (kernels/attention/flash.py, Pallas with Triton lowering): segment ids and a
            causal mask offset by `causal_offset` (the shared-prefix update's completions, which cuDNN cannot
            express); run per shard under shard_map; off GPU in the Pallas interpreter (tests).
    auto    splash on TPU, cudnn on GPU for 16-bit inputs, xla otherwise.

Which keys a query sees is an `AttentionMask`: segment ids (0 = padding; a query sees the keys of its own non-zero
segment), optionally causal, or an explicit boolean array. Results on real queries agree across implementations
(to float rounding); what a padding query returns is unspecified (finite, and never read by the model).
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from spatial_jax.kernels.platform import active_platform

IMPLS = ("auto", "xla", "splash", "cudnn", "pallas")

# Finite "minus infinity": a query with no visible key (padding) gets uniform weights instead of NaN.
MASK_VALUE = -1e30

# splash pads both sequences to a multiple of this (its blocks are multiples of the TPU's 128 lanes)
SPLASH_ALIGN = 128


@flax.struct.dataclass
class AttentionMask:
    """Visibility for queries [B, T] over keys [B, S].

    Structured (all implementations): `segment_ids` [B, T] int32 for the queries and `kv_segment_ids` [B, S] for
    the keys (None: the same as the queries', which needs S == T); a query sees a key of its own segment when
    that segment is not 0, and with `causal` only keys at or before its own index. `causal_offset` k says the
    queries are the last T of the S = T + k keys' positions (query i sits at key index i + k: a completion's
    queries over its shared prompt's keys and its own); xla and splash only. The cudnn path also needs each
    row's non-zero ids to be one contiguous run (a left-padded prompt with its right-padded completion, or a
    padded image frame), which is what the model builds.
    Explicit (XLA only): `dense` [B, T, S] bool, True = visible.
    """

    segment_ids: jax.Array | None = None
    kv_segment_ids: jax.Array | None = None
    dense: jax.Array | None = None
    causal: bool = flax.struct.field(pytree_node=False, default=False)
    causal_offset: int = flax.struct.field(pytree_node=False, default=0)

    @property
    def structured(self) -> bool:
        return self.dense is None


def resolve_impl(impl: str, dtype, platform: str | None = None) -> str:
    """The implementation `impl` ("auto" or a name) means for inputs of `dtype` on `platform`."""
    if impl not in IMPLS:
        raise ValueError(f"attention implementation must be one of {IMPLS}, got {impl!r}")
    platform = platform or active_platform()
    sixteen_bit = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    if impl == "auto":
        if platform == "tpu":
            return "splash"
        return "cudnn" if platform in ("gpu", "cuda") and sixteen_bit else "xla"
    if impl == "cudnn":
        if platform not in ("gpu", "cuda"):
            raise ValueError(f"attention implementation 'cudnn' needs a CUDA GPU; this backend is {platform!r}")
        if not sixteen_bit:
            raise ValueError(f"attention implementation 'cudnn' needs bfloat16 or float16 inputs, got {dtype}")
    return impl


def _check(q, k, v, mask: AttentionMask) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"attention wants q [B, T, H, D], k and v [B, S, Hkv, D]; got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    (B, T, H, D), (Bk, S, Hkv, Dk) = q.shape, k.shape
    if Bk != B or Dk != D or H % Hkv:
        raise ValueError(f"k/v {k.shape} do not fit q {q.shape} (same batch and head size, Hkv dividing H)")
    if mask.structured:
        if mask.segment_ids is None or mask.segment_ids.shape != (B, T):
            raise ValueError(f"segment_ids must be [B, T] = {(B, T)}, got "
                             f"{None if mask.segment_ids is None else mask.segment_ids.shape}")
        kv_seg = mask.kv_segment_ids
        if (kv_seg is None and S != T) or (kv_seg is not None and kv_seg.shape != (B, S)):
            raise ValueError(f"kv_segment_ids must be [B, S] = {(B, S)} (may be omitted only when S == T)")
        if mask.causal_offset and not mask.causal:
            raise ValueError("causal_offset applies to a causal mask only")
        if mask.causal and S != T + mask.causal_offset:
            raise ValueError(f"a causal structured mask needs T + causal_offset keys, got T={T}, "
                             f"causal_offset={mask.causal_offset}, S={S}")
    elif mask.dense.shape != (B, T, S) or mask.dense.dtype != jnp.bool_:
        raise ValueError(f"dense mask must be bool [B, T, S] = {(B, T, S)}, got {mask.dense.dtype} "
                         f"{mask.dense.shape}")


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, *, scale: float, impl: str = "auto",
              chunk: int = 0, interpret: bool | None = None) -> jax.Array:
    """softmax(q k^T * scale, masked) v for q [B, T, H, D], k/v [B, S, Hkv, D] (query head h reads kv head
    h // (H / Hkv)); returns [B, T, H, D] in q's dtype. `impl` is one of IMPLS (an explicit dense mask always takes
    the XLA path); `chunk` is the XLA path's query block (0 = all at once); `interpret` runs splash or pallas in
    the Pallas interpreter (default: unless on their platform, TPU or GPU)."""
    _check(q, k, v, mask)
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"attention scale must be a positive finite number, got {scale}")
    name = "xla" if not mask.structured else resolve_impl(impl, q.dtype)
    if mask.causal_offset and name == "cudnn":
        # cuDNN's causal mask is aligned top-left and its padding is by lengths from index 0: neither expresses
        # queries that sit after a left-padded prefix
        if impl == "cudnn":
            raise ValueError("attention implementation 'cudnn' takes no causal_offset (a shared-prefix update); "
                             "use 'xla' or 'auto'")
        name = "xla"
    if name == "splash":
        return splash(q, k, v, mask, scale=scale, interpret=interpret)
    if name == "cudnn":
        return cudnn(q, k, v, mask, scale=scale)
    if name == "pallas":
        return pallas(q, k, v, mask, scale=scale, interpret=interpret)
    return xla(q, k, v, mask, scale=scale, chunk=chunk)


# ------------------------------------------------------------------ XLA

def _visible(mask: AttentionMask, q_seg, q_index, S: int) -> jax.Array:
    """[B, t, S] visibility of the queries with segment ids q_seg [B, t] at indices q_index [t]."""
    kv_seg = mask.segment_ids if mask.kv_segment_ids is None else mask.kv_segment_ids
    vis = (q_seg[:, :, None] == kv_seg[:, None, :]) & (kv_seg[:, None, :] != 0)
    if mask.causal:
        vis = vis & (jnp.arange(S)[None, None, :] <= q_index[None, :, None] + mask.causal_offset)
    return vis


def _block(q, k, v, vis, scale):
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    qg = q.reshape(B, T, Hkv, H // Hkv, D)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(vis[:, None, None, :, :], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(B, T, H, D)


def query_blocks(T: int, chunk: int) -> tuple[int, int]:
    """(blocks, queries per block) for T queries in blocks of at most `chunk`: as few blocks as `chunk` allows,
    balanced, so padding stays under 8 queries a block (T = 192 with chunk 128 runs two blocks of 96, not two of
    128 with a third of the work on padding)."""
    n = -(-T // chunk)
    per_block = -(-T // n)
    return n, min(chunk, -(-per_block // 8) * 8)


def xla(q, k, v, mask: AttentionMask, *, scale: float, chunk: int = 0) -> jax.Array:
    """Einsum attention; with 0 < chunk < T the queries go through in balanced blocks of at most `chunk`
    (query_blocks), each recomputed in the backward pass, and a structured mask is built per block, so nothing
    [T, S] is ever live."""
    B, T, H, D = q.shape
    S = k.shape[1]
    if chunk <= 0 or T <= chunk:
        vis = mask.dense if not mask.structured else _visible(mask, mask.segment_ids, jnp.arange(T), S)
        return _block(q, k, v, vis, scale)
    n, chunk = query_blocks(T, chunk)
    pad = n * chunk - T

    def blocks(x):  # [B, T, ...] -> [n, B, chunk, ...], padded queries see nothing
        x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
        return x.reshape(B, n, chunk, *x.shape[2:]).swapaxes(0, 1)

    index = jnp.arange(n * chunk).reshape(n, chunk)
    if mask.structured:
        xs = (blocks(q), blocks(mask.segment_ids), index)

        def one(args):
            qb, segb, ib = args
            return _block(qb, k, v, _visible(mask, segb, ib, S), scale)
    else:
        xs = (blocks(q), blocks(mask.dense))

        def one(args):
            return _block(args[0], k, v, args[1], scale)

    out = jax.lax.map(jax.checkpoint(one), xs)  # [n, B, chunk, H, D]
    return out.swapaxes(0, 1).reshape(B, n * chunk, H, D)[:, :T]


# ------------------------------------------------------------------ splash (TPU)

def _splash_blocks(t: int, s: int):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    b = next(n for n in (512, 256, 128) if t % n == 0 and s % n == 0)
    return sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b, block_kv_dkv=b,
                         block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)


@functools.lru_cache(maxsize=64)
def _splash_kernel(heads: int, t: int, s: int, causal: bool, offset: int, interpret: bool):
    """One splash kernel per (heads, padded lengths, causality and its offset); the mask metadata is built on the
    host once."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    one = sm.CausalMask((t, s), offset=offset) if causal else sm.FullMask((t, s))
    return sk.make_splash_mha(sm.MultiHeadMask([one] * heads), block_sizes=_splash_blocks(t, s), head_shards=1,
                              q_seq_shards=1, interpret=interpret)


def mesh_specs(mesh, B: int, H: int, Hkv: int):
    """(batch axes, head axis or None) of a shard_map: the batch over every mesh axis but `tensor` that divides it,
    the heads over `tensor` when it divides both head counts (else replicated), as models.sharding drops axes."""
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    head_axis = "tensor" if sizes.get("tensor", 1) > 1 and H % sizes["tensor"] == 0 and \
        Hkv % sizes["tensor"] == 0 else None
    batch_axes, prod = [], 1
    for ax in mesh.axis_names:
        if ax != "tensor" and sizes[ax] > 1 and B % (prod * sizes[ax]) == 0:
            batch_axes.append(ax)
            prod *= sizes[ax]
    return tuple(batch_axes) or None, head_axis


def splash(q, k, v, mask: AttentionMask, *, scale: float, interpret: bool | None = None) -> jax.Array:
    """Splash attention for a structured mask: sequences padded to a multiple of SPLASH_ALIGN (padding keys in a
    segment no real query has), q pre-scaled, the kernel vmapped over the batch and, under a mesh of more than
    one device, run per shard in shard_map (batch over the data axes, heads over `tensor`)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    B, T, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    if interpret is None:
        interpret = active_platform() != "tpu"
    q_seg = mask.segment_ids.astype(jnp.int32)
    kv_seg = q_seg if mask.kv_segment_ids is None else mask.kv_segment_ids.astype(jnp.int32)
    tp, sp = -(-T // SPLASH_ALIGN) * SPLASH_ALIGN, -(-S // SPLASH_ALIGN) * SPLASH_ALIGN
    if mask.causal_offset and tp > T and sp == S:
        sp += SPLASH_ALIGN  # an added query i >= T must find an added key at or before i + offset (index S)
    # Added positions get segment -1, which nothing real has. In splash a padding query (segment 0 or -1) sees the
    # padding keys of its segment (itself at least, so its row stays finite), never a real key.
    q_seg = jnp.pad(q_seg, ((0, 0), (0, tp - T)), constant_values=-1)
    kv_seg = jnp.pad(kv_seg, ((0, 0), (0, sp - S)), constant_values=-1)
    qh = jnp.pad((q * jnp.asarray(scale, q.dtype)).swapaxes(1, 2), ((0, 0), (0, 0), (0, tp - T), (0, 0)))
    kh = jnp.pad(k.swapaxes(1, 2), ((0, 0), (0, 0), (0, sp - S), (0, 0)))
    vh = jnp.pad(v.swapaxes(1, 2), ((0, 0), (0, 0), (0, sp - S), (0, 0)))

    mesh = jax.sharding.get_abstract_mesh()
    sharded = mesh is not None and not mesh.empty and mesh.size > 1
    batch_axes, head_axis = mesh_specs(mesh, B, H, Hkv) if sharded else (None, None)
    local_heads = H // (dict(zip(mesh.axis_names, mesh.axis_sizes))["tensor"] if head_axis else 1)
    kernel = _splash_kernel(local_heads, tp, sp, mask.causal, mask.causal_offset, bool(interpret))

    def local(qh, kh, vh, q_seg, kv_seg):
        return jax.vmap(lambda a, b, c, d, e: kernel(a, b, c, segment_ids=sk.SegmentIds(q=d, kv=e)))(
            qh, kh, vh, q_seg, kv_seg)

    if sharded:
        P = jax.sharding.PartitionSpec
        heads, rows = P(batch_axes, head_axis, None, None), P(batch_axes, None)
        # check_vma=False: pallas_call results carry no varying-axes type, so the checker cannot follow them
        local = jax.shard_map(local, mesh=mesh, in_specs=(heads, heads, heads, rows, rows), out_specs=heads,
                              check_vma=False)
    out = local(qh, kh, vh, q_seg, kv_seg)
    return out[:, :, :T].swapaxes(1, 2).astype(q.dtype)


# ------------------------------------------------------------------ Pallas flash (GPU)

def pallas(q, k, v, mask: AttentionMask, *, scale: float, interpret: bool | None = None) -> jax.Array:
    """The Pallas flash kernel for a structured mask, under a mesh of more than one device per shard in shard_map
    (batch over the data axes, heads over `tensor`), as splash runs."""
    from spatial_jax.kernels.attention.flash import flash_attention

    B, H, Hkv = q.shape[0], q.shape[2], k.shape[2]
    if interpret is None:
        interpret = active_platform() not in ("gpu", "cuda")
    q_seg = mask.segment_ids.astype(jnp.int32)
    kv_seg = q_seg if mask.kv_segment_ids is None else mask.kv_segment_ids.astype(jnp.int32)

    def local(q, k, v, q_seg, kv_seg):
        return flash_attention(q, k, v, q_seg, kv_seg, scale=scale, causal=mask.causal,
                               causal_offset=mask.causal_offset, interpret=bool(interpret))

    mesh = jax.sharding.get_abstract_mesh()
    if mesh is not None and not mesh.empty and mesh.size > 1:
        P = jax.sharding.PartitionSpec
        batch_axes, head_axis = mesh_specs(mesh, B, H, Hkv)
        heads, rows = P(batch_axes, None, head_axis, None), P(batch_axes, None)
        # check_vma=False: pallas_call results carry no varying-axes type, so the checker cannot follow them
        local = jax.shard_map(local, mesh=mesh, in_specs=(heads, heads, heads, rows, rows), out_specs=heads,
                              check_vma=False)
    return local(q, k, v, q_seg, kv_seg).astype(q.dtype)


# ------------------------------------------------------------------ cuDNN (GPU)

def cudnn(q, k, v, mask: AttentionMask, *, scale: float, implementation: str = "cudnn") -> jax.Array:
    """cuDNN flash attention for a structured mask whose rows hold one contiguous run of real tokens: each row is
    rotated so the run starts at 0 (rotary positions are already in q and k, so the rotation is invisible), run
    with per-row lengths (padding + causal), and rotated back. `implementation="xla"` runs the same plumbing
    through jax's reference path (how it is tested off GPU)."""
    B, T, H, D = q.shape
    S = k.shape[1]
    q_real = mask.segment_ids != 0
    kv_real = q_real if mask.kv_segment_ids is None else mask.kv_segment_ids != 0
    q_start = jnp.argmax(q_real, axis=1)
    kv_start = jnp.argmax(kv_real, axis=1)

    def rotate(x, start, n, sign):
        idx = (jnp.arange(n)[None, :] + sign * start[:, None]) % n
        return jnp.take_along_axis(x, idx[:, :, None, None], axis=1)

    out = jax.nn.dot_product_attention(
        rotate(q, q_start, T, 1), rotate(k, kv_start, S, 1), rotate(v, kv_start, S, 1), scale=scale,
        is_causal=mask.causal, query_seq_lengths=q_real.sum(1).astype(jnp.int32),
        key_value_seq_lengths=kv_real.sum(1).astype(jnp.int32), implementation=implementation,
    )
    return rotate(out, q_start, T, -1).astype(q.dtype)
