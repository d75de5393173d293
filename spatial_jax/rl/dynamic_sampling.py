"""DAPO's dynamic sampling (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
Sec. 3.2, the constraint 0 < |{o_i | is_equivalent(a, o_i)}| < G of eq. 11).

A group whose rollouts all earn one reward has group-relative advantage 0 on every rollout (eq. 2, and Dr. GRPO's
unscaled form alike): it adds no policy gradient and only dilutes the batch. Dynamic sampling drops such groups and
samples further batches of prompts until the batch holds prompts_per_step groups that do carry a gradient. The
criterion is the reward itself (every term, shaping included), not only accuracy as in DAPO's math setting: the
advantage is what must be non-zero. After max_rounds extra rounds, the slots still empty take dropped groups, in the
order sampled, with their loss masked out, so the batch keeps its size (and its compiled shapes) and the gradient
comes from informative groups only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from spatial_jax.config import check_at_least


@dataclasses.dataclass(frozen=True)
class DynamicSamplingConfig:
    """enabled: drop all-equal groups and refill (off by default). max_rounds: sampling rounds after the first, each
    of rl.prompts_per_step prompts (DAPO's max_num_gen_batches less one); a step decodes at most 1 + max_rounds
    batches."""

    enabled: bool = False
    max_rounds: int = 3

    def __post_init__(self):
        check_at_least(self, max_rounds=0)


def informative_groups(rewards: np.ndarray) -> np.ndarray:
    """[groups, G] rewards -> bool [groups]: groups whose rewards are finite and not all equal, the only ones with a
    non-zero group-relative advantage (SPEC 7)."""
    r = np.asarray(rewards, np.float64)
    return np.all(np.isfinite(r), axis=1) & (np.max(r, axis=1) > np.min(r, axis=1))


@dataclasses.dataclass(frozen=True)
class Selection:
    """The groups of the batch as (round, group within the round) in batch order, informative ones first; `trained`
    [prompts]: False for a dropped group that pads the batch after the cap (its loss is masked out)."""

    picks: list[tuple[int, int]]
    trained: np.ndarray
    rounds: int  # sampling rounds run, the first included
    dropped: int  # all-equal (or non-finite) groups among every sampled one

    def metrics(self) -> dict[str, float]:
        return {"dynamic/rounds": float(self.rounds), "dynamic/dropped_groups": float(self.dropped),
                "dynamic/padded_groups": float(np.sum(~self.trained))}


def fill(sample_round: Callable[[int], np.ndarray], prompts: int, max_rounds: int) -> Selection:
    """Calls sample_round(k) -> [prompts, G] rewards for k = 0, 1, ... until `prompts` informative groups are found
    or 1 + max_rounds rounds ran, and picks the batch's groups."""
    kept: list[tuple[int, int]] = []
    spare: list[tuple[int, int]] = []
    rounds = 0
    while len(kept) < prompts and rounds <= max_rounds:
        good = informative_groups(sample_round(rounds))
        kept += [(rounds, int(g)) for g in np.flatnonzero(good)]
        spare += [(rounds, int(g)) for g in np.flatnonzero(~good)]
        rounds += 1
    kept = kept[:prompts]
    pad = spare[: prompts - len(kept)]
    trained = np.asarray([True] * len(kept) + [False] * len(pad))
    return Selection(kept + pad, trained, rounds, len(spare))
