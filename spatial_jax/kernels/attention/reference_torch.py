"""Torch reference for the attention kernels: float64 masked softmax attention, paged decode through its page table,
attention by segment ids with an offset causal mask (parity only)."""

from __future__ import annotations

import torch


def _masked_softmax_attention(q, k, v, visible, scale):
    """q [B, T, H, D], k/v [B, S, Hkv, D], visible [B, T, S] bool -> [B, T, H, D], float64; query head h reads kv
    head h // (H / Hkv); a query that sees nothing averages every key (as the kernels' finite mask value does)."""
    group = q.shape[2] // k.shape[2]
    k, v = k.double().repeat_interleave(group, dim=2), v.double().repeat_interleave(group, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q.double(), k) * scale
    s = s.masked_fill(~visible[:, None], -1e30)
    return torch.einsum("bhts,bshd->bthd", torch.softmax(s, dim=-1), v)


def paged_decode_attention(q: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, page_table: torch.Tensor,
                           lengths: torch.Tensor, scale: float) -> torch.Tensor:
    """One query per row q [B, H, D] over its first max(lengths[b], 1) positions, read from pools
    [Hkv, pages, page_size, D] through page_table [B, W]: [B, H, D] float64 (attention/paged.py)."""
    Hkv, _, page_size, D = pool_k.shape
    B, W = page_table.shape
    gather = lambda pool: pool[:, page_table.long()].reshape(Hkv, B, W * page_size, D).permute(1, 2, 0, 3)
    visible = torch.arange(W * page_size)[None, None, :] < lengths.clamp(min=1).long()[:, None, None]
    return _masked_softmax_attention(q[:, None], gather(pool_k), gather(pool_v), visible, scale)[:, 0]


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_segment_ids: torch.Tensor,
                      kv_segment_ids: torch.Tensor, scale: float, causal: bool = False,
                      causal_offset: int = 0) -> torch.Tensor:
    """Attention with segment ids (0 = padding) and a causal mask offset by causal_offset (query i sees keys up to
    i + causal_offset): [B, T, H, D] float64, gradients through autograd (attention/flash.py)."""
    T, S = q.shape[1], k.shape[1]
    visible = (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]) & (kv_segment_ids[:, None, :] != 0)
    if causal:
        visible = visible & (torch.arange(S)[None, :] <= torch.arange(T)[:, None] + causal_offset)[None]
    return _masked_softmax_attention(q, k, v, visible, scale)
