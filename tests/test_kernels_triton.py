"""Triton fused log-prob/entropy vs the float64 materialised torch reference, run on CPU under TRITON_INTERPRET=1.

Tolerances: float32 inputs: forward max abs error <= 1e-4, gradients max abs error / max |reference| <= 1e-4;
bfloat16 inputs: 2e-2 for both (gradients come back in bfloat16, so they carry its rounding).
"""

import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from spatial_jax.kernels.logprob_entropy.reference_torch import logprob_entropy
from spatial_jax.kernels.logprob_entropy.triton_kernel import linear_logprob_entropy_triton

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
SMALL_BLOCKS = dict(block_n=16, block_v=64, block_d=16)


def _inputs(n, d, v, dtype, w_std, seed, transpose_w=False):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g)
    if transpose_w:  # an LM head stored [V, D] and passed as its transposed view, no copy
        w = (torch.randn(v, d, generator=g) * w_std).to(dtype).t()
    else:
        w = (torch.randn(d, v, generator=g) * w_std).to(dtype)
    targets = torch.randint(0, v, (n,), generator=g)
    g_lp = torch.randn(n, generator=g, dtype=torch.float64)
    g_ent = torch.randn(n, generator=g, dtype=torch.float64)
    return h.to(dtype).requires_grad_(), w.requires_grad_(), targets, g_lp, g_ent


def _rel(a, ref):
    return ((a.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


def _check(h, w, targets, g_lp, g_ent, temperature, blocks, tol):
    lp, ent = linear_logprob_entropy_triton(h, w, targets, temperature=temperature, **blocks)
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ent.shape == targets.shape
    dh, dw = torch.autograd.grad((lp.double() * g_lp + ent.double() * g_ent).sum(), (h, w))
    r_lp, r_ent = logprob_entropy(h, w, targets, temperature)
    r_dh, r_dw = torch.autograd.grad((r_lp * g_lp + r_ent * g_ent).sum(), (h, w))
    assert (lp.double() - r_lp).abs().max().item() <= tol
    assert (ent.double() - r_ent).abs().max().item() <= tol
    assert dh.dtype == h.dtype and dw.dtype == w.dtype and dw.shape == w.shape
    assert _rel(dh, r_dh) <= tol
    assert _rel(dw, r_dw) <= tol
    return r_lp, r_ent


# (n, d, v, temperature, w_std): N, D, V not multiples of the blocks; N = 1; temperature != 1; LM-head weight scale.
CASES = [
    (33, 40, 300, 0.7, 0.3),
    (1, 32, 100, 1.0, 0.3),
    (17, 64, 257, 1.3, 0.02),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("n,d,v,temperature,w_std", CASES)
def test_parity_with_reference(n, d, v, temperature, w_std, dtype):
    h, w, targets, g_lp, g_ent = _inputs(n, d, v, dtype, w_std, seed=n + v)
    _check(h, w, targets, g_lp, g_ent, temperature, SMALL_BLOCKS, TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_large_logits(dtype):
    # w scaled so |logits| reach 30-50: peaked rows where the online max shifts between tiles.
    h, w, targets, g_lp, g_ent = _inputs(9, 32, 200, dtype, w_std=2.1, seed=3)
    z = (h.detach().double() @ w.detach().double()).abs().max().item()
    assert 30.0 <= z <= 80.0, z
    _check(h, w, targets, g_lp, g_ent, 1.0, SMALL_BLOCKS, TOL[dtype])


def test_transposed_weight_and_other_blocks():
    h, w, targets, g_lp, g_ent = _inputs(20, 48, 150, torch.float32, 0.3, seed=5, transpose_w=True)
    assert not w.is_contiguous()
    _check(h, w, targets, g_lp, g_ent, 0.9, dict(block_n=32, block_v=32, block_d=32), TOL[torch.float32])


def test_strided_and_expanded_targets():
    h, w, targets, g_lp, g_ent = _inputs(12, 32, 90, torch.float32, 0.3, seed=9)
    table = torch.stack([targets.flip(0), targets, targets.roll(1)], dim=1)  # column 1 is a stride-3 view
    lp, ent = linear_logprob_entropy_triton(h, w, table[:, 1], **SMALL_BLOCKS)
    r_lp, r_ent = logprob_entropy(h, w, targets)
    assert (lp.double() - r_lp).abs().max().item() <= 1e-4 and (ent.double() - r_ent).abs().max().item() <= 1e-4
    same = torch.tensor([7]).expand(12)  # stride 0
    lp, _ = linear_logprob_entropy_triton(h, w, same, **SMALL_BLOCKS)
    r_lp, _ = logprob_entropy(h, w, torch.full((12,), 7))
    assert (lp.double() - r_lp).abs().max().item() <= 1e-4


def test_uniform_rows_with_very_negative_logits():
    # Every logit is -128 (exp underflows to 0 in float32 against a max of 0): only a max taken over real
    # columns, never the padded ones, gives H = log V and lp = -log V.
    h = torch.ones(5, 16)
    w = torch.full((16, 70), -8.0)
    lp, ent = linear_logprob_entropy_triton(h, w, torch.arange(5), **SMALL_BLOCKS)
    expected = torch.log(torch.tensor(70.0))
    torch.testing.assert_close(ent, expected.expand(5), atol=1e-5, rtol=0)
    torch.testing.assert_close(lp, -expected.expand(5), atol=1e-5, rtol=0)


def test_lp_only_gradient_with_frozen_head():
    h, w, targets, _, _ = _inputs(10, 32, 90, torch.float32, 0.3, seed=7)
    w = w.detach()
    lp, _ = linear_logprob_entropy_triton(h, w, targets, **SMALL_BLOCKS)
    (dh,) = torch.autograd.grad(lp.sum(), (h,))
    r_lp, _ = logprob_entropy(h, w, targets)
    (r_dh,) = torch.autograd.grad(r_lp.sum(), (h,))
    assert _rel(dh, r_dh) <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_entropy_off_is_the_cross_entropy_alone(dtype):
    # several splits and backward chunks, a temperature: lp and its gradients as the reference's for lp alone
    h, w, targets, g_lp, _ = _inputs(23, 48, 290, dtype, 0.3, seed=17)
    lp, ent = linear_logprob_entropy_triton(h, w, targets, temperature=0.7, entropy=False, num_splits=3,
                                            vocab_chunk=128, **SMALL_BLOCKS)
    assert ent is None
    grads = torch.autograd.grad((lp * g_lp.to(lp.dtype)).sum(), (h, w))
    r_lp, _ = logprob_entropy(h, w, targets, temperature=0.7)
    r_grads = torch.autograd.grad((r_lp * g_lp).sum(), (h, w))
    assert (lp.double() - r_lp.double()).abs().max().item() <= TOL[dtype]
    for a, b in zip(grads, r_grads):
        assert _rel(a, b) <= TOL[dtype]
    with pytest.raises(TypeError, match="entropy must be True or False"):
        linear_logprob_entropy_triton(h, w, targets, entropy=1, **SMALL_BLOCKS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("num_splits,vocab_chunk", [(1, 64), (2, 128), (4, None), (50, 192)])
def test_vocabulary_splits_and_backward_chunks(num_splits, vocab_chunk, dtype):
    # V = 300 in tiles of 64 is 5 tiles: 4 splits of 2 tiles leave the last split empty; 50 splits are capped at
    # 5; chunks of 64/128/192 columns end in a partial chunk.
    h, w, targets, g_lp, g_ent = _inputs(21, 40, 300, dtype, 0.3, seed=11)
    blocks = dict(SMALL_BLOCKS, num_splits=num_splits, vocab_chunk=vocab_chunk)
    _check(h, w, targets, g_lp, g_ent, 0.8, blocks, TOL[dtype])


def test_splits_and_chunks_do_not_change_results_beyond_rounding():
    h, w, targets, g_lp, g_ent = _inputs(19, 32, 260, torch.float32, 0.5, seed=13)
    outs = []
    for num_splits, vocab_chunk in ((1, 320), (3, 64), (1, 320)):
        lp, ent = linear_logprob_entropy_triton(h, w, targets, num_splits=num_splits, vocab_chunk=vocab_chunk,
                                                **SMALL_BLOCKS)
        outs.append((lp, ent) + torch.autograd.grad((lp * g_lp.float() + ent * g_ent.float()).sum(), (h, w)))
    for a, b in zip(outs[0], outs[1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(outs[0], outs[2]):  # same config twice: bit-identical (no atomics anywhere)
        assert torch.equal(a, b)


def test_empty_batch():
    h = torch.zeros(0, 16, requires_grad=True)
    w = torch.randn(16, 40, requires_grad=True)
    lp, ent = linear_logprob_entropy_triton(h, w, torch.zeros(0, dtype=torch.long), **SMALL_BLOCKS)
    assert lp.shape == ent.shape == (0,)
    dh, dw = torch.autograd.grad((lp.sum() + ent.sum()), (h, w))
    assert dh.shape == (0, 16) and torch.count_nonzero(dw) == 0


@pytest.mark.parametrize(
    "h_shape,w_shape,targets,error,match",
    [
        ((4, 8), (9, 20), torch.zeros(4, dtype=torch.long), ValueError, "hidden size mismatch"),
        ((4, 8), (8, 20), torch.zeros(5, dtype=torch.long), ValueError, "targets must be"),
        ((4, 8), (8, 20), torch.zeros(4), TypeError, "int32 or int64"),
        ((4, 8), (8, 20), torch.tensor([0, 1, 20, 3]), ValueError, r"\[0, 20\)"),
        ((4, 8), (8, 20), torch.tensor([0, -1, 2, 3]), ValueError, r"\[0, 20\)"),
        ((4, 8, 1), (8, 20), torch.zeros(4, dtype=torch.long), ValueError, r"\[N, D\]"),
    ],
)
def test_bad_inputs_raise(h_shape, w_shape, targets, error, match):
    with pytest.raises(error, match=match):
        linear_logprob_entropy_triton(torch.randn(h_shape), torch.randn(w_shape), targets)


def test_bad_dtype_temperature_and_blocks_raise():
    h, w, t = torch.randn(4, 8), torch.randn(8, 20), torch.zeros(4, dtype=torch.long)
    with pytest.raises(TypeError, match="float32/bfloat16"):
        linear_logprob_entropy_triton(h, w.to(torch.bfloat16), t)
    with pytest.raises(TypeError, match="float32/bfloat16"):
        linear_logprob_entropy_triton(h.double(), w.double(), t)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            linear_logprob_entropy_triton(h, w, t, temperature=bad)
    with pytest.raises(ValueError, match="block_v"):
        linear_logprob_entropy_triton(h, w, t, block_v=48)
    for bad in (0, 2.0):
        with pytest.raises(ValueError, match="num_stages"):
            linear_logprob_entropy_triton(h, w, t, num_stages=bad)
        with pytest.raises(ValueError, match="num_splits"):
            linear_logprob_entropy_triton(h, w, t, num_splits=bad)
    for bad in (128, 300, 256.0):
        with pytest.raises(ValueError, match="vocab_chunk"):
            linear_logprob_entropy_triton(h, w, t, vocab_chunk=bad)


_SM90_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
import spatial_jax.kernels.logprob_entropy.triton_kernel as te
blocks = {"BLOCK_N": 64, "BLOCK_V": 128, "BLOCK_D": 64, "UPCAST": False}
ptrs = {"h_ptr": "*bf16", "w_ptr": "*bf16", "dz_ptr": "*bf16", "tgt_ptr": "*i64", "inv_temp": "fp32"}
for fn in (te._fwd_kernel, te._dlogits_kernel):
    sig = {a: "constexpr" if a in blocks else ptrs.get(a, "*fp32" if a.endswith("_ptr") else "i32")
           for a in fn.arg_names}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in blocks.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3}).asm["ptx"]
    assert "wgmma" in ptx, fn.fn.__name__ + ": bf16 dots did not lower to Hopper tensor-core wgmma"
print("compiled")
"""


def test_gpu_path_compiles_for_hopper_with_bf16_tensor_cores():
    # The interpreter cannot see the compiled path (UPCAST=False, bf16 dots, bf16 dz): compile it ahead of time
    # for sm_90 in a fresh process without TRITON_INTERPRET, no GPU needed.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    res = subprocess.run([sys.executable, "-c", _SM90_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "compiled" in res.stdout, res.stderr[-3000:]
