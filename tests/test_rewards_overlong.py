"""DAPO's soft overlong punishment (Yu et al. 2025, Sec. 3.4, eq. 13): hand values, parity with the torch float64
reference (tolerance 1e-12 absolute: both sides compute one subtraction and one division in float64), config rules."""

import numpy as np
import pytest

from spatial_jax.config import FieldError
from spatial_jax.reference import overlong_torch
from spatial_jax.rewards.overlong import OverlongPenaltyConfig, overlong_penalties, overlong_penalty


def test_eq13_by_hand():
    """L_max = 20, L_cache = 4: no penalty up to 16 tokens, then -1/4 per token, -1 at and beyond L_max."""
    got = overlong_penalties(np.array([0, 10, 16, 17, 18, 19, 20, 21, 500]), 20, 4)
    np.testing.assert_array_equal(got, [0, 0, 0, -0.25, -0.5, -0.75, -1, -1, -1])
    assert got.dtype == np.float64
    # DAPO's run: L_max 20480, L_cache 4096
    assert overlong_penalties(np.array([16384, 18432, 20480]), 20480, 4096).tolist() == [0.0, -0.5, -1.0]
    # the interval may start at 0: every token is punished
    np.testing.assert_array_equal(overlong_penalties(np.array([[0, 3], [6, 7]]), 6, 6), [[0, -0.5], [-1, -1]])


def test_parity_with_torch():
    rng = np.random.default_rng(13)
    for _ in range(50):
        max_length = int(rng.integers(1, 5000))
        cache = int(rng.integers(1, max_length + 1))
        lengths = rng.integers(0, 2 * max_length, size=40)
        got = overlong_penalties(lengths, max_length, cache)
        ref = [overlong_torch.overlong_penalty(int(n), max_length, cache) for n in lengths]
        np.testing.assert_allclose(got, ref, atol=1e-12, rtol=0)


def test_lengths_of_any_integer_dtype():
    """The penalty casts the lengths to float before L_max - L_cache - n: unsigned counts would wrap around."""
    np.testing.assert_array_equal(overlong_penalty(np.array([16, 17, 21], np.uint32), 20, 4), [0, -0.25, -1])
    assert overlong_penalties(np.array([True, False]), 1, 1).tolist() == [-1.0, 0.0]


def test_config_rules():
    assert not OverlongPenaltyConfig().enabled and OverlongPenaltyConfig(cache=4).enabled
    assert OverlongPenaltyConfig(cache=4, max_length=4).enabled  # the interval may start at 0
    with pytest.raises(FieldError, match=r"max_length must be >= 0, got -1"):
        OverlongPenaltyConfig(max_length=-1)
    with pytest.raises(FieldError, match=r"cache must be <= max_length=4 .*, got 8"):
        OverlongPenaltyConfig(cache=8, max_length=4)
    with pytest.raises(FieldError, match=r"cache must be >= 0, got -1"):
        OverlongPenaltyConfig(cache=-1)
