"""Fused LM-head log-prob + full-vocabulary entropy in Triton (NVIDIA GPUs; CPU via TRITON_INTERPRET=1).

From final hidden states h [N, D], LM-head weight w [D, V] and targets [N] it returns, for
z = h @ w / temperature, lp = log softmax(z)[target] and H = -sum_j p_j log p_j, without ever holding [N, V]:
logits are produced one [block_n, block_v] tile at a time and folded into per-row running statistics.

Kernels (all accumulate in float32):
- forward, one program per row block: online log-sum-exp over vocabulary tiles carrying the running max m,
  s = sum exp(z - m), a = sum exp(z - m) (z - m) (kept relative to m so H = log s - a / s has no cancellation of
  large logits) and the target logit; saves lse and H for the backward.
- backward dh, one program per row block: recomputes each logit tile, forms
  dz_j = g_lp (onehot_j - p_j) - g_H p_j (log p_j + H)   (log p_j + H = z_j - mu, mu = sum_j p_j z_j)
  divided by the temperature, and adds dz @ w_tile^T into its own rows of a float32 dh.
- backward dw, one program per vocabulary tile: recomputes the same tiles row block by row block and adds
  h_rows^T @ dz into its own columns of a float32 dw.
dw uses this second kernel instead of atomics from the row-block kernel: every dw (and dh) element is then written
by exactly one program in a fixed order, so gradients are bit-reproducible run to run (float atomics are not) and
there is no contention on the [D, V] buffer (with atomics, every row block would add into all of it). The price is
one extra logit recompute; it is skipped entirely when w does not need a gradient (the usual frozen LM head).

Indices are int64 so offsets such as d * V (4096 x 151,936 and beyond) cannot overflow 32 bits.

Masking: padded vocabulary columns are set to -inf before the max and excluded (not multiplied) from the sums, and
their dz is zero. Padded rows load zeros (finite logits, so no -inf - -inf NaN), get zero upstream gradient, and are
never stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# triton.jit chooses interpreter vs compiler when the kernels below are decorated; mirror that choice here.
_INTERPRET = bool(triton.knobs.runtime.interpret)
_DTYPES = (torch.float32, torch.bfloat16)
# finite start for the running max, so s * (m_old - m_new) is 0 * finite (not 0 * -inf) on the first tile
_NEG_INIT = tl.constexpr(-1.0e30)


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    # The interpreter gets bf16 dots wrong: upcast there; on GPU keep bf16 tensor-core dots (fp32 accumulate).
    # "ieee" only affects fp32 operands: it forbids TF32 so fp32 inputs keep fp32 parity.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _logit_tile(h_ptr, w_ptr, rows, row_ok, cols, col_ok, D, stride_hn, stride_hd, stride_wd, stride_wv, inv_temp,
                BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    """z[rows, cols] = (h[rows] @ w[:, cols]) / temperature, float32, reduced over D in BLOCK_D chunks."""
    acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        dd = (d0 + tl.arange(0, BLOCK_D)).to(tl.int64)
        d_ok = dd < D
        h_t = tl.load(h_ptr + rows[:, None] * stride_hn + dd[None, :] * stride_hd,
                      mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        w_t = tl.load(w_ptr + dd[:, None] * stride_wd + cols[None, :] * stride_wv,
                      mask=d_ok[:, None] & col_ok[None, :], other=0.0)
        acc += _dot(h_t, w_t, UPCAST)
    return acc * inv_temp


@triton.jit
def _dlogits(z, cols, col_ok, tgt, lse, ent, g_lp, g_ent, inv_temp):
    """d(g_lp . lp + g_H . H)/d(raw logits) for one tile."""
    logp = z - lse[:, None]
    p = tl.where(col_ok[None, :], tl.exp(logp), 0.0)  # padded columns have probability 0, hence dz = 0
    onehot = tl.where(cols[None, :] == tgt[:, None], 1.0, 0.0)
    # dlp/dz_j = onehot_j - p_j ; dH/dz_j = -p_j (z_j - mu) = -p_j (log p_j + H)
    dz = g_lp[:, None] * (onehot - p) - g_ent[:, None] * p * (logp + ent[:, None])
    return dz * inv_temp


@triton.jit
def _fwd_kernel(h_ptr, w_ptr, tgt_ptr, lp_ptr, ent_ptr, lse_ptr, N, D, V,
                stride_hn, stride_hd, stride_wd, stride_wv, inv_temp,
                BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < N
    tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=-1)
    m = tl.full([BLOCK_N], _NEG_INIT, dtype=tl.float32)
    s = tl.zeros([BLOCK_N], dtype=tl.float32)
    a = tl.zeros([BLOCK_N], dtype=tl.float32)
    z_tgt = tl.zeros([BLOCK_N], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = (v0 + tl.arange(0, BLOCK_V)).to(tl.int64)
        col_ok = cols < V
        z = _logit_tile(h_ptr, w_ptr, rows, row_ok, cols, col_ok, D, stride_hn, stride_hd, stride_wd, stride_wv,
                        inv_temp, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST)
        z = tl.where(col_ok[None, :], z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))
        shift = m - m_new
        alpha = tl.exp(shift)
        zc = tl.where(col_ok[None, :], z - m_new[:, None], 0.0)
        e = tl.where(col_ok[None, :], tl.exp(zc), 0.0)
        # online update of a = sum e^(z-m)(z-m) when m moves to m_new: each old term gains (m - m_new)
        a = alpha * (a + s * shift) + tl.sum(e * zc, axis=1)
        s = alpha * s + tl.sum(e, axis=1)
        m = m_new
        z_tgt += tl.sum(tl.where(cols[None, :] == tgt[:, None], z, 0.0), axis=1)
    lse = m + tl.log(s)
    tl.store(lp_ptr + rows, z_tgt - lse, mask=row_ok)
    tl.store(ent_ptr + rows, tl.log(s) - a / s, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)


@triton.jit
def _bwd_dh_kernel(h_ptr, w_ptr, tgt_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, dh_ptr, N, D, V,
                   stride_hn, stride_hd, stride_wd, stride_wv, stride_dn, stride_dd, inv_temp,
                   BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < N
    tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=-1)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
    g_lp = tl.load(glp_ptr + rows, mask=row_ok, other=0.0)
    g_ent = tl.load(gent_ptr + rows, mask=row_ok, other=0.0)
    for v0 in range(0, V, BLOCK_V):
        cols = (v0 + tl.arange(0, BLOCK_V)).to(tl.int64)
        col_ok = cols < V
        z = _logit_tile(h_ptr, w_ptr, rows, row_ok, cols, col_ok, D, stride_hn, stride_hd, stride_wd, stride_wv,
                        inv_temp, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST)
        # dz rounded to the input dtype: the gradient GEMM then runs on bf16 tensor cores like the logit GEMM
        dz = _dlogits(z, cols, col_ok, tgt, lse, ent, g_lp, g_ent, inv_temp).to(w_ptr.dtype.element_ty)
        for d0 in range(0, D, BLOCK_D):
            dd = (d0 + tl.arange(0, BLOCK_D)).to(tl.int64)
            d_ok = dd < D
            w_t = tl.load(w_ptr + dd[:, None] * stride_wd + cols[None, :] * stride_wv,
                          mask=d_ok[:, None] & col_ok[None, :], other=0.0)
            ptrs = dh_ptr + rows[:, None] * stride_dn + dd[None, :] * stride_dd
            ok = row_ok[:, None] & d_ok[None, :]
            # this program alone owns these dh rows: plain read-add-write, no atomics
            tl.store(ptrs, tl.load(ptrs, mask=ok, other=0.0) + _dot(dz, tl.trans(w_t), UPCAST), mask=ok)


@triton.jit
def _bwd_dw_kernel(h_ptr, w_ptr, tgt_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, dw_ptr, N, D, V,
                   stride_hn, stride_hd, stride_wd, stride_wv, stride_dd, stride_dv, inv_temp,
                   BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
    cols = (tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
    col_ok = cols < V
    for n0 in range(0, N, BLOCK_N):
        rows = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        row_ok = rows < N
        tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=-1)
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
        ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
        g_lp = tl.load(glp_ptr + rows, mask=row_ok, other=0.0)
        g_ent = tl.load(gent_ptr + rows, mask=row_ok, other=0.0)
        z = _logit_tile(h_ptr, w_ptr, rows, row_ok, cols, col_ok, D, stride_hn, stride_hd, stride_wd, stride_wv,
                        inv_temp, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST)
        dz = _dlogits(z, cols, col_ok, tgt, lse, ent, g_lp, g_ent, inv_temp).to(h_ptr.dtype.element_ty)
        for d0 in range(0, D, BLOCK_D):
            dd = (d0 + tl.arange(0, BLOCK_D)).to(tl.int64)
            d_ok = dd < D
            h_t = tl.load(h_ptr + rows[:, None] * stride_hn + dd[None, :] * stride_hd,
                          mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            ptrs = dw_ptr + dd[:, None] * stride_dd + cols[None, :] * stride_dv
            ok = d_ok[:, None] & col_ok[None, :]
            # this program alone owns these dw columns: plain read-add-write, no atomics
            tl.store(ptrs, tl.load(ptrs, mask=ok, other=0.0) + _dot(tl.trans(h_t), dz, UPCAST), mask=ok)


def _check_inputs(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, temperature: float,
                  blocks: tuple[int, int, int]) -> None:
    """Raise ValueError/TypeError with a clear message for anything the kernels cannot handle."""
    if not all(isinstance(t, torch.Tensor) for t in (h, w, targets)):
        raise TypeError("h, w and targets must be torch tensors")
    if h.dim() != 2 or w.dim() != 2:
        raise ValueError(f"h must be [N, D] and w [D, V]; got h {tuple(h.shape)}, w {tuple(w.shape)}")
    if h.shape[1] != w.shape[0]:
        raise ValueError(f"hidden size mismatch: h is {tuple(h.shape)} but w is {tuple(w.shape)} (expected [D, V])")
    if targets.dim() != 1 or targets.shape[0] != h.shape[0]:
        raise ValueError(f"targets must be [N] = [{h.shape[0]}]; got {tuple(targets.shape)}")
    if h.dtype not in _DTYPES or w.dtype != h.dtype:
        raise TypeError(f"h and w must share a dtype in float32/bfloat16; got {h.dtype} and {w.dtype}")
    if targets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"targets must be int32 or int64 token ids; got {targets.dtype}")
    if not (h.device == w.device == targets.device):
        raise ValueError(f"h, w, targets must be on one device; got {h.device}, {w.device}, {targets.device}")
    if not _INTERPRET and h.device.type != "cuda":
        raise ValueError(f"the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1 for CPU); got {h.device}")
    if w.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"w must have D > 0 and V > 0; got {tuple(w.shape)}")
    if not (isinstance(temperature, (int, float)) and temperature > 0 and temperature < float("inf")):
        raise ValueError(f"temperature must be a positive finite number; got {temperature!r}")
    for name, b in zip(("block_n", "block_v", "block_d"), blocks):
        if not isinstance(b, int) or b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot tile); got {b!r}")
    if targets.numel():
        lo, hi = (int(x) for x in torch.aminmax(targets))
        if lo < 0 or hi >= w.shape[1]:
            raise ValueError(f"targets must lie in [0, {w.shape[1]}); got range [{lo}, {hi}]")


def _forward(h, w, targets, temperature, blocks, num_warps):
    n, d = h.shape
    v = w.shape[1]
    bn, bv, bd = blocks
    lp = torch.empty(n, dtype=torch.float32, device=h.device)
    ent = torch.empty_like(lp)
    lse = torch.empty_like(lp)
    if n:
        _fwd_kernel[(triton.cdiv(n, bn),)](
            h, w, targets, lp, ent, lse, n, d, v, h.stride(0), h.stride(1), w.stride(0), w.stride(1),
            1.0 / temperature, BLOCK_N=bn, BLOCK_V=bv, BLOCK_D=bd, UPCAST=_INTERPRET, num_warps=num_warps)
    return lp, ent, lse


def _backward(h, w, targets, lse, ent, g_lp, g_ent, temperature, blocks, num_warps, need_dh, need_dw):
    n, d = h.shape
    v = w.shape[1]
    bn, bv, bd = blocks
    g_lp = g_lp.to(torch.float32).contiguous()
    g_ent = g_ent.to(torch.float32).contiguous()
    common = dict(BLOCK_N=bn, BLOCK_V=bv, BLOCK_D=bd, UPCAST=_INTERPRET, num_warps=num_warps)
    dh = dw = None
    if need_dh:
        acc = torch.zeros(n, d, dtype=torch.float32, device=h.device)
        if n:
            _bwd_dh_kernel[(triton.cdiv(n, bn),)](
                h, w, targets, lse, ent, g_lp, g_ent, acc, n, d, v, h.stride(0), h.stride(1), w.stride(0),
                w.stride(1), acc.stride(0), acc.stride(1), 1.0 / temperature, **common)
        dh = acc.to(h.dtype)
    if need_dw:
        acc = torch.zeros(d, v, dtype=torch.float32, device=w.device)
        if n:
            _bwd_dw_kernel[(triton.cdiv(v, bv),)](
                h, w, targets, lse, ent, g_lp, g_ent, acc, n, d, v, h.stride(0), h.stride(1), w.stride(0),
                w.stride(1), acc.stride(0), acc.stride(1), 1.0 / temperature, **common)
        dw = acc.to(w.dtype)
    return dh, dw


class _LinearLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, targets, temperature, blocks, num_warps):
        lp, ent, lse = _forward(h, w, targets, temperature, blocks, num_warps)
        ctx.save_for_backward(h, w, targets, lse, ent)
        ctx.config = (temperature, blocks, num_warps)
        return lp, ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_lp, g_ent):
        h, w, targets, lse, ent = ctx.saved_tensors
        temperature, blocks, num_warps = ctx.config
        dh, dw = _backward(h, w, targets, lse, ent, g_lp, g_ent, temperature, blocks, num_warps,
                           ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return dh, dw, None, None, None, None


def linear_logprob_entropy_triton(
    h: torch.Tensor,
    w: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    block_n: int = 64,
    block_v: int = 128,
    block_d: int = 64,
    num_warps: int = 8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h [N, D], w [D, V] (float32 or bfloat16, any strides), targets [N] int -> (lp [N], entropy [N]) float32.

    lp = log softmax(h @ w / temperature)[target], entropy over the full vocabulary; differentiable in h and w.
    """
    blocks = (block_n, block_v, block_d)
    _check_inputs(h, w, targets, temperature, blocks)
    return _LinearLogprobEntropy.apply(h, w, targets, float(temperature), blocks, num_warps)
