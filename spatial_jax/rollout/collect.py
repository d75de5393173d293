"""`collect`: a batch of prompts -> the rollouts a method needs, scored by its reward. Training and evaluation both
call it, so what is rolled out (single-turn or with tools, with or without ProSR's blank rollouts) is decided here
once, from the method's plug-in."""

from __future__ import annotations

import dataclasses
from typing import Any

from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.data.pipeline import Batch, blank_batch
from spatial_jax.data.tokenizer import SpatialTokenizer
from spatial_jax.methods import Method
from spatial_jax.records import Rollout
from spatial_jax.rollout.completions import Completions, sample, to_rollouts
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.hosts import HostShare
from spatial_jax.rollout.multiturn import sample_multiturn


@dataclasses.dataclass(frozen=True)
class ToolSettings:
    """Multi-turn rollouts for a method that uses tools: at most max_turns tool turns of max_tokens tokens each
    (max_turns 0: single-turn)."""

    max_turns: int = 0
    max_tokens: int = 512


@dataclasses.dataclass(frozen=True)
class Collected:
    completions: Completions  # the arrays the loss needs (tokens, old log-probs, masks), every process's rollouts
    rollouts: list[Rollout]  # the scorer's records, rollout r answering prompt r // G (this process's prompts)
    scores: list[dict[str, float]]  # the method's reward components per rollout of `rollouts`


def collect(
    model,
    batch: Batch,
    tokenizer: SpatialTokenizer,
    method: Method,
    reward_cfg: Any,
    sampling: SamplingConfig,
    group_size: int,
    seed: int,
    *,
    blank_seed: int = 0,
    step: int = 0,
    tools: ToolSettings = ToolSettings(),
    blank_fill: str = "mean",
    image_cfg: ImageProcessingConfig = ImageProcessingConfig(),
    hosts: HostShare = HostShare(),
) -> Collected:
    """G completions per prompt (with tool turns when the method uses tools and tools.max_turns > 0), plus one
    blank-image completion per prompt when the method needs it (paired with its whole group, ProSR eq. 8).
    `batch` is this process's block of prompts (rollout/hosts.py): they are decoded with every process's blocks,
    and only this process's rollouts become records and are scored."""
    if method.uses_tools and tools.max_turns > 0:
        if hosts.count > 1:  # the tool loop runs tools for every row on each process
            raise ValueError("multi-turn rollouts need the whole batch on every process (HostShare of one)")
        comps = sample_multiturn(model, batch, tokenizer, sampling, group_size, seed, max_turns=tools.max_turns,
                                 max_tool_tokens=tools.max_tokens, image_cfg=image_cfg)
    else:
        comps = sample(model, hosts.gather(batch), tokenizer, sampling, group_size, seed)
    blank = None
    if method.needs_blank:
        blank = hosts.own(sample(model, hosts.gather(blank_batch(batch, blank_fill, image_cfg)), tokenizer, sampling,
                                 1, blank_seed))
    rollouts = to_rollouts(batch, hosts.own(comps), group_size, step, blank)
    return Collected(comps, rollouts, list(method.score_batch(rollouts, reward_cfg)))
