"""A paged KV cache: keys/values live in a pool of fixed-size pages shared by all rows, and each row reads and writes
its own pages through a page table, so a row holds only the pages its tokens need.

Pools are laid out [n_kv, pages, page_size, head_dim], the layout of jax's TPU paged-attention Pallas kernel: a
one-token decode step on TPU (attention "auto" or "splash") runs that kernel over the rows' pages; with the cache's
`kernel` "pallas" a one-token step runs this project's GPU kernel (kernels/attention/paged.py: pages read in place
through the page table; the Pallas interpreter off GPU); everything else (prefill, other backends) scatters into the
pools and gathers the rows' pages for the XLA attention path.

Row b's logical position p (0, 1, ... in the order its tokens arrived; no padding inside a row) is slot
p % page_size of page page_table[b, p // page_size]. Page 0 is scratch: padding tokens are written there and
table entries a row does not use point there, so it is never handed to a row. A forward over T new tokens per row
takes them right-padded (a row's real tokens first): the real ones go to positions lengths[b] .. lengths[b] + n_b - 1
and each sees its row's keys up to its own position.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from spatial_jax.kernels.attention.paged import paged_decode_attention
from spatial_jax.kernels.platform import active_platform
from spatial_jax.models.attention import AttentionMask, mesh_specs, resolve_impl
from spatial_jax.models.config import ModelConfig
from spatial_jax.models.sharding import constrain

SCRATCH_PAGE = 0
# Decode kernels a cache may ask for: "auto" (the TPU's where attention resolves to splash, else the XLA path) or
# "pallas" (kernels/attention/paged.py)
DECODE_KERNELS = ("auto", "pallas")


@flax.struct.dataclass
class PagedKVCache:
    """Per-layer pools keys/values [n_kv, pages, page_size, head_dim]; page_table [B, W] int32 (the W pages a row
    may use in this call, scratch where unused); lengths [B] int32 (tokens already cached per row); kernel: which
    of DECODE_KERNELS a one-token step attends with."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    page_table: jax.Array
    lengths: jax.Array
    kernel: str = flax.struct.field(pytree_node=False, default="auto")

    @property
    def page_size(self) -> int:
        return self.keys[0].shape[2]

    @classmethod
    def zeros(cls, cfg: ModelConfig, pages: int, page_size: int, dtype=None) -> tuple[tuple, tuple]:
        """Zeroed pools (keys, values) for every layer; page_table and lengths come per call."""
        t = cfg.text
        shape = (t.num_key_value_heads, pages, page_size, t.head_dim)
        dt = jnp.dtype(dtype or cfg.dtype)

        def pool():  # heads split as the attention's kv heads are (tensor parallel), pages whole on each device
            return constrain(jnp.zeros(shape, dt), ("act_kv_heads", None, None, None))

        return (tuple(pool() for _ in range(t.num_hidden_layers)), tuple(pool() for _ in range(t.num_hidden_layers)))


@flax.struct.dataclass
class PagedIndex:
    """Where this call's tokens go and what the rows read, as flat indices into a pool viewed as
    [n_kv, pages * page_size, head_dim]: write [B, T] (padding -> scratch) and read [B, W * page_size]; and for the
    decode kernel the page table [B, W], the rows' lengths after this call [B] and the cache's kernel."""

    write: jax.Array
    read: jax.Array
    page_table: jax.Array
    lengths: jax.Array
    kernel: str = flax.struct.field(pytree_node=False, default="auto")


def paged_inputs(cache: PagedKVCache, attention_mask: jax.Array) -> tuple[AttentionMask, PagedIndex, jax.Array]:
    """The attention mask [B, T, W * page_size], the flat write/read indices and the rows' new lengths."""
    B, T = attention_mask.shape
    ps = cache.page_size
    W = cache.page_table.shape[1]
    n = jnp.sum(attention_mask > 0, axis=1).astype(jnp.int32)
    pos = cache.lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]  # [B, T] logical positions
    real = jnp.arange(T)[None, :] < n[:, None]
    page = jnp.take_along_axis(cache.page_table, jnp.clip(pos // ps, 0, W - 1), axis=1)
    write = jnp.where(real, page * ps + pos % ps, SCRATCH_PAGE * ps + jnp.arange(T)[None, :] % ps)
    read = (cache.page_table[:, :, None] * ps + jnp.arange(ps)[None, None, :]).reshape(B, W * ps)
    # a padding query sees the keys up to its would-be position: never none (no NaN), never read by the model
    visible = jnp.arange(W * ps)[None, None, :] <= pos[:, :, None]
    lengths = cache.lengths + n
    if cache.kernel not in DECODE_KERNELS:
        raise ValueError(f"paged decode kernel must be one of {DECODE_KERNELS}, got {cache.kernel!r}")
    index = PagedIndex(write=write, read=read, page_table=cache.page_table, lengths=lengths, kernel=cache.kernel)
    return AttentionMask(dense=visible), index, lengths


def write(pool_k: jax.Array, pool_v: jax.Array, k: jax.Array, v: jax.Array, index: PagedIndex
          ) -> tuple[jax.Array, jax.Array]:
    """The pools with this call's k/v [B, T, n_kv, hd] scattered into their slots (in place under jit)."""
    kv, pages, ps, hd = pool_k.shape
    w = index.write.reshape(-1)

    def put(pool, x):
        x = jnp.moveaxis(x.reshape(-1, kv, hd), 1, 0).astype(pool.dtype)  # [n_kv, B * T, hd]
        return pool.reshape(kv, pages * ps, hd).at[:, w].set(x).reshape(pool.shape)

    return put(pool_k, k), put(pool_v, v)


def read(pool: jax.Array, index: PagedIndex) -> jax.Array:
    """Every row's pages as one sequence [B, W * page_size, n_kv, hd] (for the XLA attention path)."""
    kv, pages, ps, hd = pool.shape
    B, S = index.read.shape
    got = jnp.take(pool.reshape(kv, pages * ps, hd), index.read.reshape(-1), axis=1)
    return jnp.moveaxis(got.reshape(kv, B, S, hd), 0, 2)


def uses_kernel(impl: str, dtype, T: int, head_dim: int = 128, kernel: str = "auto") -> bool:
    """Whether a call of T tokens per row decodes with a paged-attention kernel: one token, and the cache's kernel
    "pallas" (the GPU kernel) or attention resolving to the TPU kernels (splash: on TPU, or asked for by name, then
    in the Pallas TPU interpreter). On a TPU the kernel's blocks span whole heads, which Mosaic tiles only at a
    multiple of 128 lanes: a smaller head (a tiny test policy's) decodes on the XLA path there."""
    if T == 1 and kernel == "pallas":
        return True
    if T != 1 or resolve_impl(impl, dtype) != "splash":
        return False
    return head_dim % 128 == 0 or active_platform() != "tpu"


def decode_attention(q: jax.Array, pool_k: jax.Array, pool_v: jax.Array, index: PagedIndex, scale: float
                     ) -> jax.Array:
    """One query per row [B, 1, H, hd] over its pages with jax's TPU paged-attention kernel, or with the index's
    kernel "pallas" this project's GPU kernel: [B, 1, H, hd]. Each row sees its first `index.lengths` positions
    (this call's token included); off their platform both run interpreted. The TPU kernel's matmuls take the TPU's
    default precision (bfloat16 passes for float32 pools), as the splash kernels do.

    Under a mesh of several devices the kernel runs per shard in shard_map (a Mosaic kernel cannot be partitioned
    automatically): rows over the mesh's batch axes where they divide, heads over `tensor` where it divides both
    head counts, as the pools' kv heads are laid out; each shard reads the whole page range of its heads (pages
    are shared by all rows), so no pool crosses devices."""
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    W = index.page_table.shape[1]
    block = next(b for b in (8, 4, 2, 1) if W % b == 0)
    lengths = jnp.maximum(index.lengths, 1).astype(jnp.int32)  # a row with no keys (an idle slot) reads scratch
    if index.kernel == "pallas":
        qs = q[:, 0].astype(pool_k.dtype)
    else:  # the TPU kernel takes its queries scaled
        qs = (q[:, 0].astype(jnp.float32) * scale).astype(pool_k.dtype)
    table = index.page_table.astype(jnp.int32)
    mesh = jax.sharding.get_abstract_mesh()
    sharded = mesh is not None and not mesh.empty and mesh.size > 1
    platform = active_platform()

    def run(qs, pool_k, pool_v, lengths, table):
        if index.kernel == "pallas":
            return paged_decode_attention(qs, pool_k, pool_v, table, lengths, scale=scale,
                                          interpret=platform not in ("gpu", "cuda"))
        if platform == "tpu":
            return paged_attention(qs, pool_k, pool_v, lengths, table, pages_per_compute_block=block)
        with pltpu.force_tpu_interpret_mode():
            return paged_attention(qs, pool_k, pool_v, lengths, table, pages_per_compute_block=block)

    if sharded:
        P = jax.sharding.PartitionSpec
        rows, heads = mesh_specs(mesh, q.shape[0], q.shape[2], pool_k.shape[0])
        pool, per_row = P(heads, None, None, None), P(rows, heads, None)
        # check_vma=False: pallas_call results carry no varying-axes type, so the checker cannot follow them
        run = jax.shard_map(run, mesh=mesh, in_specs=(per_row, pool, pool, P(rows), P(rows, None)),
                            out_specs=per_row, check_vma=False)
    out = run(qs, pool_k, pool_v, lengths, table)
    return out[:, None].astype(q.dtype)
