"""`collect`: a batch of prompts -> the rollouts a method needs, scored by its reward. Training and evaluation both
call it, so what is rolled out (single-turn or with tools, with or without ProSR's blank rollouts) is decided here
once, from the method's plug-in."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.data.pipeline import Batch, blank_batch
from spatial_jax.data.tokenizer import SpatialTokenizer
from spatial_jax.methods import Method
from spatial_jax.records import Rollout
from spatial_jax.rollout.completions import Completions, sample, to_rollouts
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.decode_copy import DecodeCopy
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
    completions: Completions  # the arrays the loss needs (tokens, old log-probs, masks) of this batch's rollouts
    rollouts: list[Rollout]  # the scorer's records, rollout r answering prompt r // G
    scores: list[dict[str, float]]  # the method's reward components per rollout of `rollouts`
    decoded: int  # rows this process decoded (rollouts, plus blank rollouts)


def _decoding(model) -> contextlib.AbstractContextManager:
    """A decoding copy is used on its own mesh; a plain model as it is, under whatever mesh is active."""
    return model.scope() if isinstance(model, DecodeCopy) else contextlib.nullcontext(model)


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

    `model`: a DecodeCopy (rollout/decode_copy.py) or a model. `batch` is this process's block of prompts
    (rollout/hosts.py): only they are decoded, tool calls run and scored here, each rollout keyed by its global id
    (`hosts.row_ids`), so the draws are those of one process decoding every block. Nothing crosses hosts here:
    `hosts.assemble` makes the whole batch's arrays for the update."""
    prompts = len(batch.records)
    with _decoding(model) as decoder:
        if method.uses_tools and tools.max_turns > 0:
            comps = sample_multiturn(decoder, batch, tokenizer, sampling, group_size, seed,
                                     max_turns=tools.max_turns, max_tool_tokens=tools.max_tokens,
                                     image_cfg=image_cfg, row_ids=hosts.row_ids(prompts, group_size))
        else:
            comps = sample(decoder, batch, tokenizer, sampling, group_size, seed,
                           row_ids=hosts.row_ids(prompts, group_size))
        blank = None
        if method.needs_blank:
            blank = sample(decoder, blank_batch(batch, blank_fill, image_cfg), tokenizer, sampling, 1, blank_seed,
                           row_ids=hosts.row_ids(prompts, 1))
    rollouts = to_rollouts(batch, comps, group_size, step, blank)
    decoded = len(comps.texts) + (0 if blank is None else len(blank.texts))
    return Collected(comps, rollouts, list(method.score_batch(rollouts, reward_cfg)), decoded)
