"""DAPO's soft overlong punishment (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
Scale", Sec. 3.4, eq. 13), a length-aware term added to a rollout's reward:

    R_length(y) = 0                                 if |y| <= L_max - L_cache
                  ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                  -1                                if L_max < |y|

|y| counts the tokens the policy wrote (its loss tokens: tool output excluded, the stop token included). Truncated
rollouts are punished gradually over the last L_cache tokens of the budget instead of all at once, which DAPO finds
less noisy than a flat penalty on every truncated sample.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from spatial_jax.config import check_at_least, require
from spatial_jax.rewards._host import host_float64


@dataclasses.dataclass(frozen=True)
class OverlongPenaltyConfig:
    """cache: L_cache, the length of the punishment interval (0: no penalty, the default). max_length: L_max
    (0: the rollout's model-token budget, rl.sampling.max_new_tokens x (turns + 1), so that a rollout cut at the
    budget gets -1). DAPO's run: L_max 20480, L_cache 4096."""

    cache: int = 0
    max_length: int = 0

    def __post_init__(self):
        check_at_least(self, cache=0, max_length=0)
        require("cache", self.cache, self.max_length == 0 or self.cache <= self.max_length,
                f"be <= max_length={self.max_length} (the interval [L_max - L_cache, L_max] starts at 0 or later)")

    @property
    def enabled(self) -> bool:
        return self.cache > 0


def overlong_penalty(lengths, max_length: int, cache: int):
    """Eq. 13 for each length in `lengths` (any shape); dtype of the default float (float64 under host_float64)."""
    n = jnp.asarray(lengths).astype(jnp.result_type(float))
    start = max_length - cache
    return jnp.where(n <= start, 0.0, jnp.where(n <= max_length, (start - n) / cache, -1.0))


def overlong_penalties(lengths: np.ndarray, max_length: int, cache: int) -> np.ndarray:
    """Host helper: eq. 13 in float64, as the rewards are scored (SPEC 7)."""
    with host_float64():
        return np.asarray(overlong_penalty(lengths, max_length, cache))
