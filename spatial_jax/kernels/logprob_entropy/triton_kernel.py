"""Fused LM-head log-prob + full-vocabulary entropy in Triton (NVIDIA GPUs; CPU via TRITON_INTERPRET=1).

From final hidden states h [N, D], LM-head weight w [D, V] and targets [N] it returns, for
z = h @ w / temperature, lp = log softmax(z)[target] and H = -sum_j p_j log p_j, without ever holding [N, V]:
logits are produced one [block_n, block_v] tile at a time and folded into per-row running statistics.

Forward, a kernel over (row block, vocabulary split): each program walks its share of the vocabulary tiles with an
online log-sum-exp carrying the running max m, s = sum exp(z - m), a = sum exp(z - m) (z - m) (kept relative to m so
H = log s - a / s has no cancellation of large logits) and the target logit; a few float32 ops over [splits, N] then
merge the splits. Splitting the vocabulary gives a small N enough programs to fill the GPU.

Backward, per vocabulary chunk of `vocab_chunk` columns: a kernel over (row block, vocabulary tile) recomputes the
logit tile and writes
  dz_j = g_lp (onehot_j - p_j) - g_H p_j (log p_j + H)   (log p_j + H = z_j - mu, mu = sum_j p_j z_j)
divided by the temperature, in the input dtype, into a [N, vocab_chunk] buffer; the two gradient GEMMs
dh += dz @ w_c^T and dw_c = h^T @ dz then run as plain matmuls on the vendor BLAS. An earlier design kept
everything in Triton (one kernel per row block adding dz @ w^T into its dh rows, one per vocabulary tile for dw):
on an H200 its read-add-write of float32 accumulators in every tile made
forward+backward 6-8x the matmul floor (benchmarks/RESULTS.md). Every output element is still written by one
program or one GEMM in a fixed order (no atomics), so gradients are bit-reproducible run to run. The dz buffer is
the only [N, x] allocation (near 512 MiB by default); with a frozen head (w needs no gradient) the dw GEMM is skipped.

Indices are int64 so offsets such as d * V (4096 x 151,936 and beyond) cannot overflow 32 bits.

Masking: padded vocabulary columns are set to -inf before the max and excluded (not multiplied) from the sums, and
their dz is never stored. Padded rows load zeros (finite logits, so no -inf - -inf NaN) and are never stored.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# triton.jit chooses interpreter vs compiler when the kernels below are decorated; mirror that choice here
# (triton.knobs from Triton 3.4; older releases read the environment variable directly).
_knobs = getattr(triton, "knobs", None)
_INTERPRET = bool(_knobs.runtime.interpret) if _knobs is not None else os.environ.get("TRITON_INTERPRET") == "1"
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
def _dlogits(z, cols, col_ok, tgt, lse, ent, g_lp, g_ent, inv_temp, ENTROPY: tl.constexpr):
    """d(g_lp . lp + g_H . H)/d(raw logits) for one tile (the g_H term only with ENTROPY)."""
    logp = z - lse[:, None]
    p = tl.where(col_ok[None, :], tl.exp(logp), 0.0)  # padded columns have probability 0, hence dz = 0
    onehot = tl.where(cols[None, :] == tgt[:, None], 1.0, 0.0)
    # dlp/dz_j = onehot_j - p_j ; dH/dz_j = -p_j (z_j - mu) = -p_j (log p_j + H)
    dz = g_lp[:, None] * (onehot - p)
    if ENTROPY:
        dz -= g_ent[:, None] * p * (logp + ent[:, None])
    return dz * inv_temp


@triton.jit
def _fwd_kernel(h_ptr, w_ptr, tgt_ptr, m_ptr, s_ptr, a_ptr, zt_ptr, N, D, V, tiles_per_split,
                stride_hn, stride_hd, stride_wd, stride_wv, inv_temp,
                BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
                ENTROPY: tl.constexpr):
    """Row block program_id(0), vocabulary split program_id(1): partial (m, s, a, target logit) at [split, rows]
    (a stays 0 without ENTROPY)."""
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < N
    split = tl.program_id(1)
    v_lo = split * tiles_per_split * BLOCK_V
    v_hi = tl.minimum(v_lo + tiles_per_split * BLOCK_V, V)
    tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=-1)
    m = tl.full([BLOCK_N], _NEG_INIT, dtype=tl.float32)
    s = tl.zeros([BLOCK_N], dtype=tl.float32)
    a = tl.zeros([BLOCK_N], dtype=tl.float32)
    z_tgt = tl.zeros([BLOCK_N], dtype=tl.float32)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = (v0 + tl.arange(0, BLOCK_V)).to(tl.int64)
        col_ok = cols < v_hi
        z = _logit_tile(h_ptr, w_ptr, rows, row_ok, cols, col_ok, D, stride_hn, stride_hd, stride_wd, stride_wv,
                        inv_temp, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST)
        z = tl.where(col_ok[None, :], z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))
        shift = m - m_new
        alpha = tl.exp(shift)
        zc = tl.where(col_ok[None, :], z - m_new[:, None], 0.0)
        e = tl.where(col_ok[None, :], tl.exp(zc), 0.0)
        if ENTROPY:
            # online update of a = sum e^(z-m)(z-m) when m moves to m_new: each old term gains (m - m_new)
            a = alpha * (a + s * shift) + tl.sum(e * zc, axis=1)
        s = alpha * s + tl.sum(e, axis=1)
        m = m_new
        z_tgt += tl.sum(tl.where(cols[None, :] == tgt[:, None], z, 0.0), axis=1)
    out = split.to(tl.int64) * N + rows
    tl.store(m_ptr + out, m, mask=row_ok)
    tl.store(s_ptr + out, s, mask=row_ok)
    tl.store(a_ptr + out, a, mask=row_ok)
    tl.store(zt_ptr + out, z_tgt, mask=row_ok)


@triton.jit
def _dlogits_kernel(h_ptr, w_ptr, tgt_ptr, lse_ptr, ent_ptr, glp_ptr, gent_ptr, dz_ptr, N, D, v0, width,
                    stride_hn, stride_hd, stride_wd, stride_wv, stride_zn, stride_zv, inv_temp,
                    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
                    ENTROPY: tl.constexpr):
    """dz[rows, cols - v0] for the vocabulary chunk [v0, v0 + width): one [BLOCK_N, BLOCK_V] tile per program."""
    rows = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    local = (tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)).to(tl.int64)
    row_ok = rows < N
    col_ok = local < width
    cols = v0 + local
    tgt = tl.load(tgt_ptr + rows, mask=row_ok, other=-1)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
    g_lp = tl.load(glp_ptr + rows, mask=row_ok, other=0.0)
    g_ent = tl.load(gent_ptr + rows, mask=row_ok, other=0.0)
    z = _logit_tile(h_ptr, w_ptr, rows, row_ok, cols, col_ok, D, stride_hn, stride_hd, stride_wd, stride_wv,
                    inv_temp, BLOCK_N, BLOCK_V, BLOCK_D, UPCAST)
    dz = _dlogits(z, cols, col_ok, tgt, lse, ent, g_lp, g_ent, inv_temp, ENTROPY)
    ptrs = dz_ptr + rows[:, None] * stride_zn + local[None, :] * stride_zv
    tl.store(ptrs, dz.to(dz_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


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


def _launch_options(blocks, num_warps, num_stages, entropy):
    """Compile-time constants and launch options shared by the kernels."""
    bn, bv, bd = blocks
    opts = dict(BLOCK_N=bn, BLOCK_V=bv, BLOCK_D=bd, UPCAST=_INTERPRET, ENTROPY=entropy, num_warps=num_warps)
    return opts if num_stages is None else {**opts, "num_stages": num_stages}


def _auto_splits(device: torch.device, row_blocks: int, v_tiles: int) -> int:
    """Vocabulary splits so the forward grid covers about two programs per multiprocessor (one row block alone
    leaves most of a large GPU idle at small N); 1 under the interpreter."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(v_tiles, triton.cdiv(2 * sms, row_blocks)))


def _combine(m, s, a, zt):
    """Merge per-split statistics [S, N] into (lp, H, lse) [N]: re-centre every split on the global max."""
    m_all = m.max(dim=0).values
    scale = torch.exp(m - m_all)  # 0 for an empty split (m is the finite -1e30 start)
    s_all = (scale * s).sum(0)
    a_all = (scale * (a + (m - m_all) * s)).sum(0)
    log_s = torch.log(s_all)
    lse = m_all + log_s
    return zt.sum(0) - lse, log_s - a_all / s_all, lse


def _forward(h, w, targets, temperature, blocks, num_warps, num_stages, num_splits, entropy):
    n, d = h.shape
    v = w.shape[1]
    bn, bv, _ = blocks
    if not n:
        empty = torch.empty(0, dtype=torch.float32, device=h.device)
        return empty, empty.clone(), empty.clone()
    row_blocks, v_tiles = triton.cdiv(n, bn), triton.cdiv(v, bv)
    splits = min(num_splits or _auto_splits(h.device, row_blocks, v_tiles), v_tiles)
    tiles_per_split = triton.cdiv(v_tiles, splits)
    m, s, a, zt = torch.empty(4, splits, n, dtype=torch.float32, device=h.device)
    _fwd_kernel[(row_blocks, splits)](
        h, w, targets, m, s, a, zt, n, d, v, tiles_per_split, h.stride(0), h.stride(1), w.stride(0), w.stride(1),
        1.0 / temperature, **_launch_options(blocks, num_warps, num_stages, entropy))
    return _combine(m, s, a, zt)


def _auto_chunk(n: int, v: int, block_v: int, itemsize: int) -> int:
    """Vocabulary columns per backward chunk: dz [N, chunk] in the input dtype stays near 512 MiB."""
    cols = max(block_v, (512 * 2**20) // max(1, n * itemsize))
    return min(triton.cdiv(v, block_v), max(1, cols // block_v)) * block_v


def _backward(h, w, targets, lse, ent, g_lp, g_ent, temperature, blocks, num_warps, num_stages, vocab_chunk,
              need_dh, need_dw, entropy):
    """dz for one vocabulary chunk at a time from the Triton kernel (logits recomputed, never [N, V]), then the
    two gradient GEMMs per chunk on the vendor BLAS: dh += dz @ w_c^T (float32 accumulator), dw_c = h^T @ dz."""
    n, d = h.shape
    v = w.shape[1]
    bn, bv, _ = blocks
    dh = torch.zeros(n, d, dtype=torch.float32, device=h.device) if need_dh else None
    dw = torch.zeros(d, v, dtype=w.dtype, device=w.device) if need_dw else None
    if n:
        g_lp = g_lp.to(torch.float32).contiguous()
        g_ent = g_ent.to(torch.float32).contiguous()
        chunk = vocab_chunk or _auto_chunk(n, v, bv, h.element_size())
        dz = torch.empty(n, min(chunk, v), dtype=h.dtype, device=h.device)
        opts = _launch_options(blocks, num_warps, num_stages, entropy)
        for v0 in range(0, v, chunk):
            width = min(chunk, v - v0)
            dz_c = dz[:, :width]
            _dlogits_kernel[(triton.cdiv(n, bn), triton.cdiv(width, bv))](
                h, w, targets, lse, ent, g_lp, g_ent, dz_c, n, d, v0, width, h.stride(0), h.stride(1),
                w.stride(0), w.stride(1), dz_c.stride(0), dz_c.stride(1), 1.0 / temperature, **opts)
            w_c = w[:, v0:v0 + width]
            if need_dh:
                # float32 adds in place; bfloat16 products (fp32-accumulated inside the GEMM) are rounded once
                # per chunk before they join the float32 sum
                if h.dtype == torch.float32:
                    dh.addmm_(dz_c, w_c.t())
                else:
                    dh += dz_c @ w_c.t()
            if need_dw:
                dw[:, v0:v0 + width] = h.t() @ dz_c
    return (dh.to(h.dtype) if need_dh else None), dw


class _LinearLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, w, targets, temperature, blocks, num_warps, num_stages, num_splits, vocab_chunk, entropy):
        lp, ent, lse = _forward(h, w, targets, temperature, blocks, num_warps, num_stages, num_splits, entropy)
        ctx.save_for_backward(h, w, targets, lse, ent)
        ctx.config = (temperature, blocks, num_warps, num_stages, vocab_chunk, entropy)
        return (lp, ent) if entropy else lp

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_lp, g_ent=None):
        h, w, targets, lse, ent = ctx.saved_tensors
        temperature, blocks, num_warps, num_stages, vocab_chunk, entropy = ctx.config
        # without entropy the kernel never reads g_ent: g_lp stands in as a valid pointer
        dh, dw = _backward(h, w, targets, lse, ent, g_lp, g_lp if g_ent is None else g_ent, temperature, blocks,
                           num_warps, num_stages, vocab_chunk, ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                           entropy)
        return dh, dw, None, None, None, None, None, None, None, None


def _check_optional_int(name: str, value, minimum: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(f"{name} must be an int >= {minimum} or None; got {value!r}")


def linear_logprob_entropy_triton(
    h: torch.Tensor,
    w: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    block_n: int = 128,
    block_v: int = 256,
    block_d: int = 64,
    num_warps: int = 8,
    num_stages: int | None = 3,
    num_splits: int | None = None,
    vocab_chunk: int | None = None,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """h [N, D], w [D, V] (float32 or bfloat16, any strides), targets [N] int (any strides) -> (lp [N], entropy [N]),
    float32.

    lp = log softmax(h @ w / temperature)[target], entropy over the full vocabulary; differentiable in h and w.
    `entropy=False` leaves the entropy out of both passes and returns (lp, None): the cross-entropy alone, as the
    fused cross-entropy kernels of other libraries compute it.
    Tuning knobs: block sizes, num_warps, num_stages (software-pipelining depth; None = Triton's default),
    num_splits (forward vocabulary splits; None = enough to fill the GPU) and vocab_chunk (backward columns per
    dz chunk, a multiple of block_v; None = dz near 512 MiB).
    """
    blocks = (block_n, block_v, block_d)
    _check_inputs(h, w, targets, temperature, blocks)
    _check_optional_int("num_stages", num_stages, 1)
    _check_optional_int("num_splits", num_splits, 1)
    _check_optional_int("vocab_chunk", vocab_chunk, block_v)
    if vocab_chunk is not None and vocab_chunk % block_v:
        raise ValueError(f"vocab_chunk must be a multiple of block_v={block_v}; got {vocab_chunk}")
    if not isinstance(entropy, bool):
        raise TypeError(f"entropy must be True or False; got {entropy!r}")
    # the kernels read targets with unit stride: a strided or expanded view would be read as other token ids
    out = _LinearLogprobEntropy.apply(h, w, targets.contiguous(), float(temperature), blocks, num_warps,
                                      num_stages, num_splits, vocab_chunk, entropy)
    return out if entropy else (out, None)
