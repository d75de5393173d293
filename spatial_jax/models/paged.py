"""A paged KV cache: keys/values live in a pool of fixed-size pages shared by all rows, and each row reads and writes
its own pages through a page table, so a row holds only the pages its tokens need.

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

from spatial_jax.models.attention import AttentionMask
from spatial_jax.models.config import ModelConfig

SCRATCH_PAGE = 0


@flax.struct.dataclass
class PagedKVCache:
    """Per-layer pools keys/values [pages, page_size, n_kv, head_dim]; page_table [B, W] int32 (the W pages a row
    may use in this call, scratch where unused); lengths [B] int32 (tokens already cached per row)."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    page_table: jax.Array
    lengths: jax.Array

    @property
    def page_size(self) -> int:
        return self.keys[0].shape[1]

    @classmethod
    def zeros(cls, cfg: ModelConfig, pages: int, page_size: int, dtype=None) -> tuple[tuple, tuple]:
        """Zeroed pools (keys, values) for every layer; page_table and lengths come per call."""
        t = cfg.text
        shape = (pages, page_size, t.num_key_value_heads, t.head_dim)
        dt = jnp.dtype(dtype or cfg.dtype)
        return (tuple(jnp.zeros(shape, dt) for _ in range(t.num_hidden_layers)),
                tuple(jnp.zeros(shape, dt) for _ in range(t.num_hidden_layers)))


@flax.struct.dataclass
class PagedIndex:
    """Where this call's tokens go and what the rows read, as flat indices into a pool viewed as [pages * page_size]:
    write [B, T] (padding -> scratch) and read [B, W * page_size]."""

    write: jax.Array
    read: jax.Array


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
    return AttentionMask(dense=visible), PagedIndex(write=write, read=read), cache.lengths + n


def write_and_read(pool_k: jax.Array, pool_v: jax.Array, k: jax.Array, v: jax.Array, index: PagedIndex
                   ) -> tuple[tuple[jax.Array, jax.Array], jax.Array, jax.Array]:
    """Scatters this call's k/v [B, T, n_kv, hd] into the pools and gathers every row's pages: returns the updated
    pools and the rows' keys/values [B, W * page_size, n_kv, hd] (this call's included)."""
    shape = pool_k.shape
    flat = (-1,) + shape[2:]
    w = index.write.reshape(-1)
    pk = pool_k.reshape(flat).at[w].set(k.reshape(flat).astype(pool_k.dtype))
    pv = pool_v.reshape(flat).at[w].set(v.reshape(flat).astype(pool_v.dtype))
    return (pk.reshape(shape), pv.reshape(shape)), jnp.take(pk, index.read, axis=0), jnp.take(pv, index.read, axis=0)
