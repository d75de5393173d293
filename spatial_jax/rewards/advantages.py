"""Group-relative advantages (eq. 2, SpatialCORE; GRPO): A_i = (r_i - mean_G r) / (std_G r + eps).

std = "none" is Dr. GRPO's unscaled advantage A_i = r_i - mean_G r (Liu et al. 2025, "Understanding R1-Zero-Like
Training: A Critical Perspective", Sec. 3.1: GRPO's advantage with its std(.) divisor removed): dividing by the group's
standard deviation weights questions that are nearly always solved or nearly always failed the most (its
"question-level difficulty bias").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from spatial_jax.config import check_positive, require
from spatial_jax.rewards._host import bucket, host_float64

StdKind = Literal["population", "sample", "none"]
STD_KINDS = ("population", "sample", "none")


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Eq. 2's constants, a field of every method's reward config: eps (1e-4) and the kind of standard deviation
    ("none": Dr. GRPO, no division, so eps is unused)."""

    eps: float = 1e-4
    std: StdKind = "population"

    def __post_init__(self):
        check_positive(self, "eps")
        require("std", self.std, self.std in STD_KINDS, "be 'population', 'sample' or 'none' (Dr. GRPO)")


def group_advantages(
    rewards: jax.Array,
    eps: float = 1e-4,
    std: StdKind = "population",
    mask: jax.Array | None = None,
) -> jax.Array:
    """[num_groups, G] rewards -> advantages; `mask` marks real members of ragged groups (padding gets 0).

    A group with one member, or whose members all share one reward, gets advantage 0 (SPEC 7), and so does a group
    holding a NaN or infinite reward: its mean and spread are undefined, and a NaN would reach every weight.
    """
    if std not in STD_KINDS:
        raise ValueError(f"std must be one of {STD_KINDS}, got {std!r}")
    r = jnp.asarray(rewards)
    m = jnp.ones(r.shape, bool) if mask is None else jnp.asarray(mask, bool)
    n = jnp.sum(m, axis=-1, keepdims=True)
    nf = jnp.maximum(n, 1).astype(r.dtype)
    mean = jnp.sum(jnp.where(m, r, 0), axis=-1, keepdims=True) / nf
    hi = jnp.max(jnp.where(m, r, -jnp.inf), axis=-1, keepdims=True)
    lo = jnp.min(jnp.where(m, r, jnp.inf), axis=-1, keepdims=True)
    finite = jnp.all(jnp.where(m, jnp.isfinite(r), True), axis=-1, keepdims=True)
    spread = (n > 1) & (hi > lo) & finite
    adv = r - mean
    if std != "none":
        sq = jnp.sum(jnp.where(m, (r - mean) ** 2, 0), axis=-1, keepdims=True)
        denom = nf if std == "population" else jnp.maximum(nf - 1, 1)
        adv = adv / (jnp.sqrt(sq / denom) + eps)
    return jnp.where(m & spread, adv, jnp.zeros((), r.dtype))


# Jitted form for callers on the host or in the trainer; `std` selects the trace.
group_advantages_jit = jax.jit(group_advantages, static_argnames=("std",))


def advantages_by_group(
    rewards: Sequence[float],
    groups: Sequence[Hashable | None],
    eps: float = 1e-4,
    std: StdKind = "population",
) -> list[float | None]:
    """Host helper: advantages for records sharing a group id; records with group None get None."""
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group ids")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        if g is not None:
            members.setdefault(g, []).append(i)
    out: list[float | None] = [None] * len(rewards)
    if not members:
        return out
    # Padded to power-of-two buckets so that the jitted function compiles for a few shapes only.
    width = bucket(max(len(v) for v in members.values()), 4)
    table = np.zeros((bucket(len(members), 8), width), np.float64)
    mask = np.zeros(table.shape, bool)
    for row, idx in enumerate(members.values()):
        table[row, : len(idx)] = [float(rewards[i]) for i in idx]
        mask[row, : len(idx)] = True
    with host_float64():
        adv = np.asarray(group_advantages_jit(table, eps, std, mask))
    for row, idx in enumerate(members.values()):
        for slot, i in enumerate(idx):
            out[i] = float(adv[row, slot])
    return out
