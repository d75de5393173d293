"""The Pallas kernels, run in the Pallas interpreter on CPU, against the float64 torch reference.

Tiny shapes only (the interpreter is slow). Tolerances as in test_kernels_jax.py: float32 1e-4 (outputs absolute,
gradients relative to the largest reference entry), bfloat16 2e-2. The interpreter fills reads past the end of an
array with nan, so a vocabulary tail that is not masked to -inf fails these tests loudly.
"""

import jax.numpy as jnp
import pytest
from test_kernels_jax import TOL, assert_parity, jax_outputs, make_case, torch_expected

from spatial_jax.kernels import linear_logprob_entropy
from spatial_jax.kernels.logprob_entropy import pallas


@pytest.mark.parametrize(
    "n, d, v, temperature, h_std, w_std, blocks",
    [
        # N and V off the blocks (V tail of 44 columns), two hidden blocks, T != 1, logits of tens at w std 0.02
        (13, 16, 300, 0.7, 80.0, 0.02, dict(block_n=8, block_v=128, block_d=8)),
        # a single token, a vocabulary smaller than one block
        (1, 8, 5, 1.0, 1.0, 1.0, dict(block_n=8, block_v=128, block_d=8)),
    ],
)
def test_float32_parity(n, d, v, temperature, h_std, w_std, blocks):
    h, w, targets, g_lp, g_h = make_case(n, d, v, h_std=h_std, w_std=w_std, seed=n)
    got = jax_outputs(h, w, targets, g_lp, g_h, impl="pallas", temperature=temperature, **blocks)
    assert_parity(got, torch_expected(h, w, targets, g_lp, g_h, temperature), TOL[jnp.float32])


def test_bfloat16_parity():
    h, w, targets, g_lp, g_h = make_case(10, 16, 200, h_std=20.0, w_std=0.02, dtype=jnp.bfloat16, seed=7)
    got = jax_outputs(h, w, targets, g_lp, g_h, impl="pallas", temperature=1.2, block_n=8, block_v=128, block_d=16)
    assert_parity(got, torch_expected(h, w, targets, g_lp, g_h, 1.2), TOL[jnp.bfloat16])


def test_block_validation():
    h, w, targets, _, _ = make_case(4, 24, 10)
    with pytest.raises(ValueError, match="divide the hidden size"):
        pallas.linear_logprob_entropy(h, w, targets, block_d=16)
    with pytest.raises(ValueError, match="TPU tiles"):
        pallas.linear_logprob_entropy(h, w, targets, block_n=8, block_v=100, interpret=False)
    with pytest.raises(ValueError, match=">= 1"):
        linear_logprob_entropy(h, w, targets, impl="pallas", block_v=0)
