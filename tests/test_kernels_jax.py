"""Parity of the JAX fused log-prob / entropy kernels ("naive", "xla") with the float64 torch reference.

Tolerances (stated once, used everywhere): float32 inputs: outputs max abs error <= 1e-4, gradients max abs error
relative to the largest reference gradient entry <= 1e-4; bfloat16 inputs: 2e-2 for both. The reference sees the
same (bf16-rounded) input values in float64.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from spatial_jax.kernels import IMPLS, coordinate_uncertainty, linear_logprob_entropy, position_entropy, resolve_impl
from spatial_jax.kernels.logprob_entropy import reference_torch as torch_reference
from spatial_jax.kernels.logprob_entropy import xla
from spatial_jax.kernels.position import reference_torch as position_reference

TOL = {jnp.float32: 1e-4, jnp.bfloat16: 2e-2}


def make_case(n, d, v, *, h_std=1.0, w_std=1.0, seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    h = jnp.asarray(rng.normal(scale=h_std, size=(n, d)), dtype)
    w = jnp.asarray(rng.normal(scale=w_std, size=(d, v)), dtype)
    targets = jnp.asarray(rng.integers(0, v, size=n), jnp.int32)
    g_lp = rng.normal(size=n).astype(np.float32)
    g_h = rng.normal(size=n).astype(np.float32)
    return h, w, targets, g_lp, g_h


def torch_expected(h, w, targets, g_lp, g_h, temperature):
    """float64 (lp, H, d/dh, d/dw) of sum(g_lp * lp + g_h * H) from kernels/logprob_entropy/reference_torch.py."""
    ht = torch.tensor(np.asarray(h.astype(jnp.float32)), dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(np.asarray(w.astype(jnp.float32)), dtype=torch.float64, requires_grad=True)
    lp, ent = torch_reference.logprob_entropy(ht, wt, torch.tensor(np.asarray(targets)), temperature)
    (lp * torch.tensor(g_lp, dtype=torch.float64) + ent * torch.tensor(g_h, dtype=torch.float64)).sum().backward()
    return lp.detach().numpy(), ent.detach().numpy(), ht.grad.numpy(), wt.grad.numpy()


def jax_outputs(h, w, targets, g_lp, g_h, **kwargs):
    def loss(h, w):
        lp, ent = linear_logprob_entropy(h, w, targets, **kwargs)
        return jnp.sum(lp * g_lp + ent * g_h), (lp, ent)

    (_, (lp, ent)), (dh, dw) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(h, w)
    assert lp.dtype == ent.dtype == jnp.float32 and dh.dtype == h.dtype and dw.dtype == w.dtype
    return tuple(np.asarray(x, np.float64) for x in (lp, ent, dh, dw))


def assert_parity(got, want, tol):
    names = ("logprob", "entropy", "dh", "dw")
    for name, g, e in zip(names[:2], got[:2], want[:2]):
        assert np.all(np.isfinite(g)), name
        assert np.max(np.abs(g - e)) <= tol, f"{name}: max abs error {np.max(np.abs(g - e)):.3g} > {tol}"
    for name, g, e in zip(names[2:], got[2:], want[2:]):
        rel = np.max(np.abs(g - e)) / max(np.max(np.abs(e)), 1e-30)
        assert rel <= tol, f"{name}: relative error {rel:.3g} > {tol}"


# (n, d, v, temperature, h_std, w_std, block_n, block_v): N = 1; N and V off the blocks; T != 1; the realistic
# weight scale std 0.02 with large hidden states (logits of tens: the online max and the entropy's cancellation);
# the real vocabulary at std 0.02 with logits of order 1 (where a zero logit counted for a padded column would
# visibly shift the log-sum-exp), tiny N and D, V not a multiple of the block.
CASES = {
    "single_token": (1, 8, 5, 1.0, 1.0, 1.0, 4, 2),
    "off_block_temperature": (13, 16, 1000, 0.7, 1.0, 1.0, 4, 64),
    "realistic_large_logits": (9, 64, 3001, 1.0, 60.0, 0.02, 4, 512),
    "qwen_vocab": (3, 8, 151_936, 1.3, 20.0, 0.02, 2, 8192),
}


@pytest.mark.parametrize("impl", ["naive", "xla"])
@pytest.mark.parametrize("case", list(CASES))
def test_float32_parity(impl, case):
    n, d, v, temperature, h_std, w_std, block_n, block_v = CASES[case]
    h, w, targets, g_lp, g_h = make_case(n, d, v, h_std=h_std, w_std=w_std)
    blocks = dict(block_n=block_n, block_v=block_v) if impl == "xla" else {}
    got = jax_outputs(h, w, targets, g_lp, g_h, impl=impl, temperature=temperature, **blocks)
    assert_parity(got, torch_expected(h, w, targets, g_lp, g_h, temperature), TOL[jnp.float32])


@pytest.mark.parametrize("impl", ["naive", "xla"])
def test_bfloat16_parity(impl):
    h, w, targets, g_lp, g_h = make_case(11, 32, 1500, h_std=20.0, w_std=0.02, dtype=jnp.bfloat16, seed=1)
    blocks = dict(block_n=4, block_v=256) if impl == "xla" else {}
    got = jax_outputs(h, w, targets, g_lp, g_h, impl=impl, temperature=0.8, **blocks)
    assert_parity(got, torch_expected(h, w, targets, g_lp, g_h, 0.8), TOL[jnp.bfloat16])


def test_peaked_distribution_is_finite():
    """Logits in the thousands: one token takes all mass; H ~ 0, log p(argmax) ~ 0, no nan in value or gradient."""
    h, w, _, g_lp, g_h = make_case(5, 16, 300, h_std=30.0, w_std=3.0, seed=2)
    z = np.asarray(h, np.float64) @ np.asarray(w, np.float64)
    targets = jnp.asarray(z.argmax(-1), jnp.int32)
    got = jax_outputs(h, w, targets, g_lp, g_h, impl="xla", block_n=2, block_v=64)
    assert all(np.all(np.isfinite(x)) for x in got)
    want = torch_expected(h, w, targets, g_lp, g_h, 1.0)
    assert np.max(np.abs(got[1] - want[1])) <= 1e-4 and np.max(np.abs(got[0] - want[0])) <= 1e-4


@pytest.mark.parametrize("impl", ["naive", "xla"])
def test_target_outside_vocabulary_is_nan(impl):
    h, w, _, _, _ = make_case(3, 8, 10)
    lp, ent = linear_logprob_entropy(h, w, jnp.asarray([-1, 10, 4]), impl=impl)
    assert np.isnan(lp[0]) and np.isnan(lp[1]) and np.isfinite(lp[2]) and np.all(np.isfinite(ent))


def test_xla_never_holds_the_logits():
    """XLA's compiled temp memory for forward and forward+backward stays far below one [N, V] float32 array."""
    n, d, v = 512, 64, 32_768
    h, w, targets, _, _ = make_case(n, d, v, w_std=0.02)

    def fwd(h, w):
        return xla.linear_logprob_entropy(h, w, targets, block_n=256, block_v=1024)

    def fwd_bwd(h, w):
        return jax.grad(lambda h, w: sum(jnp.sum(x) for x in fwd(h, w)), argnums=(0, 1))(h, w)

    logits_bytes = n * v * 4
    for f in (fwd, fwd_bwd):
        temp = jax.jit(f).lower(h, w).compile().memory_analysis().temp_size_in_bytes
        assert temp < logits_bytes / 4, f"{f.__name__}: temp {temp} bytes vs logits {logits_bytes}"


def test_xla_default_tiles_follow_the_backend():
    # GPU loops pay launches per trip: larger tiles there; elsewhere the CPU-measured tiles. The defaults apply
    # only where block sizes are left unset, and give the same numbers as explicit tiles.
    assert xla.default_blocks("gpu") == xla.default_blocks("cuda") == (8192, 4096)
    assert xla.default_blocks("cpu") == xla.default_blocks("tpu") == (xla.DEFAULT_BLOCK_N, xla.DEFAULT_BLOCK_V)
    h, w, targets, _, _ = make_case(40, 16, 3000, w_std=0.3)
    auto = xla.linear_logprob_entropy(h, w, targets)
    explicit = xla.linear_logprob_entropy(h, w, targets, block_n=16, block_v=256)
    for a, b in zip(auto, explicit):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_token_chunks_are_balanced():
    # chunks never exceed block_n, and padding stays under 8 rows per chunk (a GPU tile of 8192 rows must not
    # double the work at N = 8193)
    for n in (1, 7, 100, 1025, 8193, 18_432, 40_000):
        for block_n in (2, 16, 1024, 8192):
            rows = xla._row_block(n, block_n)
            chunks = -(-n // rows)
            assert rows <= block_n and chunks == -(-n // block_n) and chunks * rows - n < 8 * chunks
    assert xla._row_block(8193, 8192) == 4104


def test_position_entropy_matches_reference():
    h, w, _, _, _ = make_case(20, 16, 700, h_std=10.0, w_std=0.05, seed=3)
    positions = jnp.asarray([0, 19, 7, 7, 3], jnp.int32)
    want = position_reference.position_entropy(
        torch.tensor(np.asarray(h), dtype=torch.float64),
        torch.tensor(np.asarray(w), dtype=torch.float64),
        torch.tensor(np.asarray(positions)),
        0.9,
    ).numpy()
    for impl in ("naive", "xla"):
        got = np.asarray(position_entropy(h, w, positions, temperature=0.9, impl=impl,
                                          block_v=128 if impl == "xla" else None))
        assert np.max(np.abs(got - want)) <= 1e-4, impl
    batched = position_entropy(jnp.stack([h, h[::-1]]), w, jnp.asarray([[0, 19], [19, 0]]), temperature=0.9)
    np.testing.assert_allclose(np.asarray(batched), np.asarray([want[:2], want[:2]]), atol=1e-4)
    out = np.asarray(position_entropy(h, w, jnp.asarray([-1, 20, 5])))
    assert np.isnan(out[0]) and np.isnan(out[1]) and np.isfinite(out[2])


def test_coordinate_uncertainty_matches_eq5():
    """Eq. 5, SpatialCORE, recomputed by hand from the torch entropies: per-coordinate mean, mean of 4, / ln 10.

    The logits are peaked enough (entropies 0.02 to 3 nats) that H lies well inside (0, 1), unclipped, and the
    coordinates hold 1, 2, 3 and 3 digits, the lone digit of coordinate 0 the most uncertain: a flat mean over all
    digits misses by > 0.1, another divisor than ln 10 (ln 9, say) by > 0.02, far beyond the 1e-5 tolerance."""
    h, w, _, _, _ = make_case(2 * 12, 16, 500, h_std=8.0, w_std=0.3, seed=4)
    h3 = h.reshape(2, 12, 16)
    positions = np.array([[[9, 0, 0], [1, 2, 0], [3, 4, 5], [6, 7, 8]],  # token 9 (3 nats) alone in coordinate 0
                          [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]], np.int32)
    mask = np.array([[[1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]],
                     [[1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1]]], bool)  # box 1 lacks coordinate 2: no H
    positions[0, 0, 2] = 99  # out of range but masked: ignored
    got_h, got_has = coordinate_uncertainty(h3, w, jnp.asarray(positions), jnp.asarray(mask), impl="xla")
    ent = position_reference.position_entropy(
        torch.tensor(np.asarray(h), dtype=torch.float64),
        torch.tensor(np.asarray(w), dtype=torch.float64),
        torch.tensor(np.clip(positions, 0, 11) + 12 * np.arange(2)[:, None, None]).reshape(-1),
    ).numpy().reshape(2, 4, 3)
    per_coord = [ent[0, c][mask[0, c]].mean() for c in range(4)]
    want0 = np.mean(per_coord) / math.log(10.0)
    assert 0.1 < want0 < 0.9  # no clipping hides the average or the divisor
    flat0 = ent[0][mask[0]].mean() / math.log(10.0)
    assert abs(flat0 - want0) > 0.1
    assert bool(got_has[0]) and not bool(got_has[1])
    assert abs(float(got_h[0]) - want0) <= 1e-5 and float(got_h[1]) == 0.0


def test_dispatch_and_bad_input():
    assert resolve_impl("auto") == "xla" and set(IMPLS) == {"auto", "naive", "xla", "pallas"}
    h, w, targets, _, _ = make_case(4, 8, 10)
    with pytest.raises(ValueError, match="impl"):
        linear_logprob_entropy(h, w, targets, impl="cuda")
    with pytest.raises(ValueError, match="temperature"):
        linear_logprob_entropy(h, w, targets, temperature=0.0)
    with pytest.raises(ValueError, match="hidden sizes"):
        linear_logprob_entropy(h, w.T, targets)
    with pytest.raises(ValueError, match="targets"):
        linear_logprob_entropy(h, w, targets[:3])
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        linear_logprob_entropy(h.astype(jnp.float16), w, targets)
    with pytest.raises(ValueError, match="block_d"):
        linear_logprob_entropy(h, w, targets, impl="xla", block_d=8)
    with pytest.raises(ValueError, match="B, 4, K"):
        coordinate_uncertainty(h, w, jnp.zeros((2, 3, 1), jnp.int32), jnp.ones((2, 3, 1), bool))
