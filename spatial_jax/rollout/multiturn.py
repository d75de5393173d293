"""Multi-turn tool rollouts (AlloSpatial): the model calls tools mid-trajectory and reads their output.

A host loop over the sampler's state: decode every live row until it stops at `<|im_end|>` or `</tool_call>`; for
each row that stopped at `</tool_call>`, parse its call from this turn's text, run the tool on the row's sample and
append the answer as one tool turn (ragged: rows without a call get no tokens); decode again; at most `max_turns`
tool turns (SPEC 5). A tool turn's tokens are `data/tool_turns.tool_turn_ids` (the Qwen3 chat shape, the tool
result as a user turn), the output cut so the whole turn fits `max_tool_tokens`. A tool that answers with a picture
as well (`view_image`) puts it first in the response as a vision block of n image tokens, n being the picture's
merged-patch count under the policy's image processor; its patches go through the vision tower with the turn
(`extend(..., pixel_values=, image_grid_thw=)`), and the rollout's visual items are the prompt's followed by its
tool pictures, so the training forward over (prompt + completion) sees them at the same positions. A picture that
does not fit `max_tool_tokens` is left out and the response says so.

A row's completion is its model tokens and tool tokens in order, compacted (the sampler's padding slots dropped):
the sequence a training forward over (prompt + completion) sees, at the same positions, so the trainer's log-probs at
model tokens equal the sampler's. `mask` is 1 on model tokens only (tool tokens carry no loss and have log-prob and
entropy 0); `context_mask` is 1 on every real token and is the attention mask the training forward needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax.numpy as jnp
import numpy as np

from spatial_jax.data.image_processing import ImageProcessingConfig, num_image_tokens, preprocess
from spatial_jax.data.pipeline import Batch
from spatial_jax.data.tokenizer import SpatialTokenizer
from spatial_jax.data.tool_turns import TOOL_TURN_PREFIX, TOOL_TURN_SUFFIX, picture_block, tool_turn_ids
from spatial_jax.data.world_map import PICTURE_SIDE, error
from spatial_jax.distributed import to_host
from spatial_jax.models.registry import architecture
from spatial_jax.rewards.parse_harness import find_tool_call
from spatial_jax.rollout.completions import Completions, repeat_batch
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.engine import Engine, Request, Round, split_rows
from spatial_jax.rollout.sampler import decode, extend, prefill
from spatial_jax.rollout.tools import Tool, default_tools, run_call_with_picture

__all__ = ["TOOL_TURN_PREFIX", "TOOL_TURN_SUFFIX", "MultiTurnCompletions", "picture_block", "picture_config",
           "required_cache_len", "sample_multiturn", "tool_turn_ids"]


@dataclasses.dataclass(frozen=True)
class MultiTurnCompletions(Completions):
    """`Completions` whose rows interleave model and tool tokens (see the module docstring)."""

    context_mask: np.ndarray  # int32 [R, N]: model and tool tokens (the training forward's attention mask)
    num_tool_calls: np.ndarray  # int32 [R]: tool turns appended to each row
    num_tool_pictures: np.ndarray  # int32 [R]: pictures among them (the last of each row's visual items)


def picture_config(model) -> ImageProcessingConfig:
    """The image processor for tool pictures when none is given: the model's patch layout, and at most a
    PICTURE_SIDE-pixel square's pixels."""
    v = model.cfg.vision
    factor = v.patch_size * v.spatial_merge_size
    norm = architecture(model.cfg.model_type).image_processing
    return ImageProcessingConfig(patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                                 merge_size=v.spatial_merge_size, min_pixels=factor * factor,
                                 image_mean=norm["image_mean"], image_std=norm["image_std"],
                                 max_pixels=max(factor * factor, PICTURE_SIDE * PICTURE_SIDE))


def required_cache_len(prompt_len: int, max_new_tokens: int, max_turns: int, max_tool_tokens: int) -> int:
    """KV slots a rollout can use: the prompt, max_turns + 1 decode rounds and max_turns tool turns."""
    return prompt_len + (max_turns + 1) * max_new_tokens + max_turns * max_tool_tokens


@dataclasses.dataclass
class _Row:
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    entropies: list[float] = dataclasses.field(default_factory=list)
    model: list[int] = dataclasses.field(default_factory=list)  # 1 = model token, 0 = tool token
    turn: list[int] = dataclasses.field(default_factory=list)  # model tokens since the last tool turn
    calls: int = 0
    pictures: list[tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)  # (patches, grid [1, 3])

    def add(self, tokens, logprobs, entropies, model: int) -> None:
        self.tokens.extend(int(t) for t in tokens)
        self.logprobs.extend(float(x) for x in logprobs)
        self.entropies.extend(float(x) for x in entropies)
        self.model.extend([model] * len(tokens))


def sample_multiturn(
    model,
    batch: Batch,
    tokenizer: SpatialTokenizer,
    sampling_cfg: SamplingConfig,
    group_size: int,
    seed: int,
    tools: Mapping[str, Tool] | None = None,
    max_turns: int = 5,
    max_tool_tokens: int = 512,
    max_len: int | None = None,
    decode_fn: Callable = decode,
    image_cfg: ImageProcessingConfig | None = None,
    row_ids=None,
) -> MultiTurnCompletions:
    """G multi-turn rollouts per prompt (rollout r answers prompt r // G), as `rollouts.sample` but with tools.

    Each decode round draws at most sampling_cfg.max_new_tokens per row; a row that does not stop within a round is
    truncated there. `max_len` (default: exactly `required_cache_len`) is the KV cache size; a smaller one is an
    error up front. The completion width is the longest row rounded up to a multiple of max_new_tokens (capped at
    the most a rollout can hold), which bounds the number of distinct training shapes. `decode_fn` is the sampler's
    `decode` (tests pass a scripted stand-in with the same signature). `image_cfg` preprocesses tool pictures as
    the prompt's images are (the policy's image processor; default `picture_config(model)`). `row_ids`: the
    rollouts' global ids, as `completions.sample` takes them.
    """
    if max_turns < 0:
        raise ValueError(f"max_turns must be >= 0, got {max_turns}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    tools = default_tools() if tools is None else tools
    image_cfg = picture_config(model) if image_cfg is None else image_cfg
    tool_turn_ids(tokenizer, "", max_tool_tokens)  # the wrapper must fit before anything runs
    N = sampling_cfg.max_new_tokens
    stops = tuple(dict.fromkeys((*sampling_cfg.stop_token_ids, tokenizer.im_end_id, tokenizer.tool_call_end_id)))
    cfg = dataclasses.replace(sampling_cfg, seed=seed, stop_token_ids=stops)
    ids, mask, pixels, grid, counts, seconds = repeat_batch(batch, group_size)
    need = required_cache_len(ids.shape[1], N, max_turns, max_tool_tokens)
    if max_len is None:
        max_len = need
    elif max_len < need:
        raise ValueError(
            f"KV cache too small for multi-turn rollouts: max_len={max_len} < prompt {ids.shape[1]} + "
            f"{max_turns + 1} decode rounds x {N} tokens + {max_turns} tool turns x {max_tool_tokens} tokens = {need}"
        )
    R = ids.shape[0]
    rows = [_Row() for _ in range(R)]

    def tool_turn(r: int) -> tuple[list[int], tuple[np.ndarray, np.ndarray] | None]:
        """Runs row r's call of this turn; its answer (and picture) joins the row."""
        row = rows[r]
        call = find_tool_call(tokenizer.decode(row.turn))
        text, picture = run_call_with_picture(call, tools, batch.records[r // group_size])
        answer, patches = _tool_answer(tokenizer, text, picture, image_cfg, max_tool_tokens)
        if patches is not None:
            row.pictures.append(patches)
        row.add(answer, [0.0] * len(answer), [0.0] * len(answer), model=0)
        row.turn = []
        row.calls += 1
        return answer, patches

    if cfg.engine == "paged" and decode_fn is decode:
        _run_paged(model, cfg, rows, ids, mask, pixels, grid, counts, seconds, row_ids, max_len, max_turns,
                   tool_turn, tokenizer.tool_call_end_id, group_size)
    else:
        _run_static(model, cfg, rows, ids, mask, pixels, grid, counts, seconds, row_ids, max_len, max_turns,
                    tool_turn, tokenizer.tool_call_end_id, group_size, max_tool_tokens, decode_fn)
    pixels, grid, counts, seconds = _with_pictures(rows, pixels, grid, counts, seconds)
    return _assemble(rows, ids, mask, pixels, grid, counts, seconds, tokenizer, cfg, need - ids.shape[1])


def _run_static(model, cfg, rows, ids, mask, pixels, grid, counts, seconds, row_ids, max_len, max_turns, tool_turn,
                call_end_id, group_size, max_tool_tokens, decode_fn) -> None:
    """All rows in lockstep on the static sampler: a decode round, then one `extend` with every caller's tool turn."""
    state = prefill(model, ids, mask, pixel_values=pixels, image_grid_thw=grid, max_len=max_len, seed=cfg.seed,
                    row_group=np.arange(len(ids)) // group_size, row_image_counts=counts, row_ids=row_ids,
                    second_per_grid=seconds)
    R = len(rows)
    for turn in range(max_turns + 1):
        state, out = decode_fn(model, state, cfg)
        toks, lps, ents = to_host(out.tokens), to_host(out.logprobs), to_host(out.entropies)
        lengths, done = to_host(out.mask).sum(axis=1), to_host(state.done)
        called = []
        for r, row in enumerate(rows):
            n = int(lengths[r])
            row.add(toks[r, :n], lps[r, :n], ents[r, :n], model=1)
            row.turn.extend(int(t) for t in toks[r, :n])
            if n and done[r] and toks[r, n - 1] == call_end_id:
                called.append(r)
        state = state.replace(done=jnp.ones_like(state.done))  # rows that ran out of tokens this round are truncated
        if turn == max_turns or not called:
            break
        tool_tokens = np.full((R, max_tool_tokens), cfg.pad_token_id, np.int32)
        tool_mask = np.zeros((R, max_tool_tokens), np.int32)
        shown = []  # this turn's pictures, in row order (the order their image tokens come in the batch)
        for r in called:
            answer, patches = tool_turn(r)
            if patches is not None:
                shown.append(patches)
            tool_tokens[r, : len(answer)] = answer
            tool_mask[r, : len(answer)] = 1
        if shown:
            state = extend(model, state, tool_tokens, tool_mask, pixel_values=np.concatenate([p for p, _ in shown]),
                           image_grid_thw=np.concatenate([g for _, g in shown]))
        else:
            state = extend(model, state, tool_tokens, tool_mask)


def _run_paged(model, cfg, rows, ids, mask, pixels, grid, counts, seconds, row_ids, max_len, max_turns, tool_turn,
               call_end_id, group_size) -> None:
    """Each row on its own through the engine: a row that stops at a tool call gets its tool turn at once and
    decodes on while the others do; the same tokens as the static path (draws are keyed per row)."""
    requests = split_rows(ids, mask, pixels, grid, counts, row_ids, np.arange(len(ids)) // group_size, seconds)

    def on_round(r: int, rnd: Round) -> Request | None:
        row = rows[r]
        row.add(rnd.tokens, rnd.logprobs, rnd.entropies, model=1)
        row.turn.extend(int(t) for t in rnd.tokens)
        if not (rnd.stopped and len(rnd.tokens) and rnd.tokens[-1] == call_end_id and row.calls < max_turns):
            return None
        answer, patches = tool_turn(r)
        extra = () if patches is None else patches
        return Request(np.asarray(answer, np.int32), requests[r].row_id, *extra)

    Engine.from_sampling(model, cfg, len(rows), max_len).run(requests, on_round)


def _tool_answer(tokenizer: SpatialTokenizer, text: str, picture: np.ndarray | None, image_cfg: ImageProcessingConfig,
                 max_tool_tokens: int) -> tuple[list[int], tuple[np.ndarray, np.ndarray] | None]:
    """A tool turn's ids and its picture's (patches, grid), or None when there is no picture or it does not fit."""
    if picture is None:
        return tool_turn_ids(tokenizer, text, max_tool_tokens), None
    patches, grid = preprocess([picture], image_cfg)
    n = int(num_image_tokens(grid, image_cfg.merge_size)[0])
    try:
        return tool_turn_ids(tokenizer, text, max_tool_tokens, image_tokens=n), (patches, grid.astype(np.int32))
    except ValueError:
        note = error(f"the picture ({n} tokens) does not fit the tool turn's {max_tool_tokens} tokens; its caption:")
        return tool_turn_ids(tokenizer, f"{note}\n{text}", max_tool_tokens), None


def _with_pictures(rows: list[_Row], pixels, grid, counts, seconds
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each row's visual items: its prompt's, then its tool pictures in turn order (a picture's second_per_grid is
    never read: it is an image)."""
    if not any(row.pictures for row in rows):
        return pixels, grid, counts, seconds
    items = np.concatenate([[0], np.cumsum(counts)])
    starts = np.concatenate([[0], np.cumsum(np.prod(grid, axis=-1))])
    out_pixels, out_grid, out_seconds = [], [], []
    for r, row in enumerate(rows):
        out_pixels.append(pixels[starts[items[r]] : starts[items[r + 1]]])
        out_grid.append(grid[items[r] : items[r + 1]])
        out_seconds.append(seconds[items[r] : items[r + 1]])
        out_pixels.extend(p for p, _ in row.pictures)
        out_grid.extend(g for _, g in row.pictures)
        out_seconds.append(np.zeros(len(row.pictures), np.float32))
    return (np.concatenate(out_pixels, axis=0), np.concatenate(out_grid, axis=0).astype(grid.dtype),
            np.asarray(counts) + np.asarray([len(row.pictures) for row in rows], np.int32),
            np.concatenate(out_seconds).astype(np.float32))


def _assemble(rows: list[_Row], ids, mask, pixels, grid, counts, seconds, tokenizer: SpatialTokenizer,
              cfg: SamplingConfig, capacity: int) -> MultiTurnCompletions:
    longest = max(len(row.tokens) for row in rows)
    N = cfg.max_new_tokens
    width = min(capacity, max(N, -(-longest // N) * N))
    R = len(rows)
    tokens = np.full((R, width), cfg.pad_token_id, np.int32)
    logprobs = np.zeros((R, width), np.float32)
    entropies = np.zeros((R, width), np.float32)
    loss = np.zeros((R, width), np.int32)
    context = np.zeros((R, width), np.int32)
    texts, offsets = [], []
    for r, row in enumerate(rows):
        n = len(row.tokens)
        tokens[r, :n] = row.tokens
        logprobs[r, :n] = row.logprobs
        entropies[r, :n] = row.entropies
        loss[r, :n] = row.model
        context[r, :n] = 1
        # The text ends before the first <|im_end|> / <|endoftext|> the model emits, as tokenizer.trim_completion
        # cuts a single-turn completion; tool turns (whose own <|im_end|> is no stop) stay in, since the rewards
        # blank <tool_response> spans. Token k of the completion is character span offsets[k] of the text.
        stops = (tokenizer.im_end_id, tokenizer.pad_id)
        end = next((k for k in range(n) if row.model[k] and row.tokens[k] in stops), n)
        text, off = tokenizer.decode_with_offsets(row.tokens[:end])
        texts.append(text)
        offsets.append(tuple(off))
    return MultiTurnCompletions(
        prompt_ids=ids, prompt_mask=mask, pixel_values=pixels, image_grid_thw=grid, tokens=tokens,
        logprobs=logprobs, entropies=entropies, mask=loss, texts=tuple(texts), offsets=tuple(offsets),
        context_mask=context, num_tool_calls=np.asarray([row.calls for row in rows], np.int32),
        num_tool_pictures=np.asarray([len(row.pictures) for row in rows], np.int32), image_counts=counts,
        second_per_grid=seconds,
    )
