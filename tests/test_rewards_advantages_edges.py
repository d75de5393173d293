"""Eq. 2's advantages at their edges beside the parity tests: the config's exact refusals, the defaults (eps 1e-4,
population std) the trainer relies on when it passes none, the host helper's argument check, and ragged groups
(a mask) held to the torch reference on a few rows, cheap enough for mutation runs (tools/mutation.sh)."""

import numpy as np
import pytest

from spatial_jax.config import FieldError
from spatial_jax.reference import advantages_torch
from spatial_jax.rewards._host import host_float64
from spatial_jax.rewards.advantages import (
    STD_KINDS,
    AdvantageConfig,
    advantages_by_group,
    group_advantages,
    group_advantages_jit,
)


def test_config_accepts_each_kind_and_refuses_in_words():
    for kind in STD_KINDS:
        assert AdvantageConfig(eps=1e-12, std=kind).std == kind
    assert AdvantageConfig() == AdvantageConfig(eps=1e-4, std="population")
    with pytest.raises(FieldError) as err:
        AdvantageConfig(eps=0)
    assert str(err.value) == "eps must be > 0, got 0"
    with pytest.raises(FieldError) as err:
        AdvantageConfig(std="pop")
    assert str(err.value) == "std must be 'population', 'sample' or 'none' (Dr. GRPO), got 'pop'"


def test_defaults_are_eps_1e_4_and_the_population_std():
    r = np.array([[1.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(group_advantages(r)),
                                  np.asarray(group_advantages(r, 1e-4, "population")))
    assert not np.array_equal(np.asarray(group_advantages(r)), np.asarray(group_advantages(r, 1e-4, "sample")))
    with pytest.raises(ValueError, match="^std must be one of"):
        group_advantages(r, 1e-4, "pop")


def test_by_group_checks_its_lengths():
    with pytest.raises(ValueError) as err:
        advantages_by_group([1.0, 0.0], ["a", "a", "b"])
    assert str(err.value) == "2 rewards but 3 group ids"
    assert advantages_by_group([1.0, 0.0], [None, None]) == [None, None]


def test_ragged_groups_match_the_reference_row_by_row():
    """Each row's real members (mask) against the reference on those members alone: padding holding a larger, a
    smaller or a non-finite value must change nothing, two members are where the sample std's n - 1 differs most,
    and a row of one member, of equal members (0.1 three times, whose float mean is not exactly 0.1) or of none gets
    exactly 0 (SPEC 7), as padding does. The last axis is the group's, so one group may come as a vector; a 0/1
    float mask reads as the bool one; half-precision rewards keep their dtype."""
    import jax.numpy as jnp

    nan, inf = np.nan, np.inf
    r = np.array([
        [1.0, 0.0, 3.0, 9.0],
        [1.0, 4.0, -5.0, nan],
        [0.1, 0.1, 0.1, inf],
        [5.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0],
        [1.0, -inf, 2.0, 0.0],
        [0.5, 2.5, -1.0, 3.0],
    ])
    lengths = [3, 2, 3, 1, 0, 3, 4]
    mask = np.arange(4) < np.array(lengths)[:, None]
    for std in ("population", "sample", "none"):
        with host_float64():
            got = np.asarray(group_advantages_jit(r, 0.5, std, mask))
        want = np.zeros_like(r)
        for i, n in enumerate(lengths):
            want[i, :n] = advantages_torch.group_advantages(r[i, :n], 0.5, std).numpy()
        np.testing.assert_allclose(got, want, atol=1e-12, rtol=0, err_msg=std)
        assert np.all(got[2:6] == 0) and np.all(got[~mask] == 0) and np.all(got[[0, 1, 6]][mask[[0, 1, 6]]] != 0)
        if std == "sample":
            with host_float64():
                one = np.asarray(group_advantages_jit(r[6], 0.5, std))
            np.testing.assert_allclose(one, got[6], atol=1e-12, rtol=0)
    with host_float64():
        np.testing.assert_array_equal(np.asarray(group_advantages_jit(r, 0.5, "none", mask.astype(np.float64))), got)
    assert group_advantages_jit(jnp.asarray([[1.0, 0.0]], jnp.bfloat16)).dtype == jnp.bfloat16
