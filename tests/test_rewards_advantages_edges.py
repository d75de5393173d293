"""Eq. 2's advantages at their edges beside the parity tests: the config's exact refusals, the defaults (eps 1e-4,
population std) the trainer relies on when it passes none, and the host helper's argument check."""

import numpy as np
import pytest

from spatial_jax.config import FieldError
from spatial_jax.rewards.advantages import STD_KINDS, AdvantageConfig, advantages_by_group, group_advantages


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
