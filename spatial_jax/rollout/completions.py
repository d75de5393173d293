"""Rollouts: a batch of prompts -> G sampled completions each -> text, token offsets, rewards' records.

Everything here is host-side glue around the jitted sampler; the numbers (tokens, old log-probs, entropies at
temperature 1, masks) stay arrays for the loss, and each completion becomes a `Rollout` record for its scorer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from spatial_jax.data.pipeline import Batch
from spatial_jax.data.tokenizer import SpatialTokenizer
from spatial_jax.distributed import to_host
from spatial_jax.records import BlankRollout, Rollout, TokenTrace
from spatial_jax.rollout import engine
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.sampler import generate

# Completions fields of prompt rows (left-padded) and of completion rows (right-padded: a multi-turn completion's
# width is its batch's longest rollout); joining rows of batches of other widths pads them so
PROMPT_ROWS = ("prompt_ids", "prompt_mask")
COMPLETION_ROWS = ("tokens", "logprobs", "entropies", "mask", "context_mask")


def pad_to(value: np.ndarray, width: int, fill, left: bool) -> np.ndarray:
    pad = np.full((value.shape[0], width - value.shape[1]), fill, value.dtype)
    return np.concatenate([pad, value] if left else [value, pad], axis=1)


@dataclasses.dataclass(frozen=True)
class Completions:
    """R = B * G rollouts of a prompt batch; rollout r answers prompt r // G."""

    prompt_ids: np.ndarray  # int32 [R, P] (left-padded)
    prompt_mask: np.ndarray  # int32 [R, P]
    pixel_values: np.ndarray  # float32 [sum of patches, patch_dim], rows' patches in rollout order
    image_grid_thw: np.ndarray  # int32 [sum of items, 3], rows' visual items in rollout order
    tokens: np.ndarray  # int32 [R, N]
    logprobs: np.ndarray  # float32 [R, N] at the sampling temperature (pi_old)
    entropies: np.ndarray  # float32 [R, N] at temperature 1
    mask: np.ndarray  # int32 [R, N]: generated tokens, the stop token included
    texts: tuple[str, ...]
    offsets: tuple[tuple[tuple[int, int], ...], ...]
    image_counts: np.ndarray  # int32 [R]: visual items of each rollout's prompt
    # float32 [sum of items] beside image_grid_thw: each video item's seconds per temporal patch (models.rope_index);
    # None: 1 second each
    second_per_grid: np.ndarray | None = dataclasses.field(default=None, kw_only=True)

    def item_starts(self) -> tuple[np.ndarray, np.ndarray]:
        """(first item of each row and one past the last [R + 1], first patch of each item and the end [items + 1])."""
        return (np.concatenate([[0], np.cumsum(self.image_counts)]),
                np.concatenate([[0], np.cumsum(np.prod(self.image_grid_thw, axis=-1))]))


def take_rows(parts: Sequence[tuple[Completions, Sequence[int]]], pad_id: int) -> Completions:
    """The rows `rows` of each part's completions, in order, as one batch (all parts of one class): prompt rows
    left-padded and completion rows right-padded to the widest part's (pad id for ids, 0 otherwise), each row's
    visual items and patches carried with it. Texts and offsets are kept when every part has them."""
    first = parts[0][0]
    out: dict[str, object] = {}
    for field in dataclasses.fields(first):
        name = field.name
        values = [getattr(c, name) for c, _ in parts]
        if name in ("texts", "offsets"):
            whole = all(len(v) == len(c.image_counts) for v, (c, _) in zip(values, parts))
            out[name] = tuple(v[r] for v, (_, rows) in zip(values, parts) for r in rows) if whole else ()
        elif name == "second_per_grid" and any(v is None for v in values):
            out[name] = None
        elif name in ("pixel_values", "image_grid_thw", "second_per_grid"):
            chunks = []
            for c, rows in parts:
                items, patches = c.item_starts()
                for r in rows:
                    i0, i1 = items[r], items[r + 1]
                    chunks.append(c.pixel_values[patches[i0] : patches[i1]] if name == "pixel_values"
                                  else getattr(c, name)[i0:i1])
            out[name] = np.concatenate(chunks, axis=0)
        elif name in PROMPT_ROWS or name in COMPLETION_ROWS:
            width = max(v.shape[1] for v in values)
            fill = pad_id if name in ("prompt_ids", "tokens") else 0
            out[name] = np.concatenate([pad_to(v[np.asarray(rows, int)], width, fill, left=name in PROMPT_ROWS)
                                        for v, (_, rows) in zip(values, parts)], axis=0)
        else:  # per-row values
            out[name] = np.concatenate([v[np.asarray(rows, int)] for v, (_, rows) in zip(values, parts)], axis=0)
    return dataclasses.replace(first, **out)


def repeat_batch(batch: Batch, group_size: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each prompt row (and its visual items' patches) repeated group_size times, in place: row i -> rows
    i*G .. i*G+G-1. Returns ids, mask, pixel_values, image_grid_thw, image_counts, second_per_grid."""
    items = np.concatenate([[0], np.cumsum(batch.image_counts)])
    patches = np.concatenate([[0], np.cumsum(np.prod(batch.image_grid_thw, axis=-1))])
    rows = range(len(batch.image_counts))
    pixels = [batch.pixel_values[patches[items[i]] : patches[items[i + 1]]] for i in rows for _ in range(group_size)]
    grids = [batch.image_grid_thw[items[i] : items[i + 1]] for i in rows for _ in range(group_size)]
    seconds = [batch.second_per_grid[items[i] : items[i + 1]] for i in rows for _ in range(group_size)]
    return (
        np.repeat(batch.input_ids, group_size, axis=0),
        np.repeat(batch.attention_mask, group_size, axis=0),
        np.concatenate(pixels, axis=0),
        np.concatenate(grids, axis=0),
        np.repeat(batch.image_counts, group_size),
        np.concatenate(seconds, axis=0),
    )


def sample(
    model,
    batch: Batch,
    tokenizer: SpatialTokenizer,
    cfg: SamplingConfig,
    group_size: int,
    seed: int,
    row_ids=None,
) -> Completions:
    """G completions of each prompt, decoded by the engine cfg.engine names. `row_ids` [B * G]: the rollouts'
    global ids (default arange(B * G)); rollout r's draws depend only on (seed, row_ids[r]), so a process decoding
    prompts p0.. of a global batch passes p0 * G + arange(B * G) and samples what one process decoding the whole
    batch would."""
    ids, mask, pixels, grid, counts, seconds = repeat_batch(batch, group_size)
    cfg = dataclasses.replace(cfg, seed=seed)
    if cfg.engine == "paged":
        out = engine.generate(model, ids, mask, cfg=cfg, pixel_values=pixels, image_grid_thw=grid, image_counts=counts,
                              row_ids=row_ids, row_group=np.arange(len(ids)) // group_size, second_per_grid=seconds)
    else:
        out, _ = generate(model, ids, mask, pixel_values=pixels, image_grid_thw=grid, cfg=cfg,
                          row_group=np.arange(len(ids)) // group_size, row_image_counts=counts,
                          row_ids=row_ids, second_per_grid=seconds)  # each prompt's images encoded once for its G rows
    tokens, m = to_host(out.tokens), to_host(out.mask)
    texts, offsets = [], []
    for r in range(tokens.shape[0]):
        kept = tokenizer.trim_completion(tokens[r, : int(m[r].sum())])
        text, off = tokenizer.decode_with_offsets(kept)
        texts.append(text)
        offsets.append(tuple(off))
    return Completions(
        prompt_ids=ids, prompt_mask=mask, pixel_values=pixels, image_grid_thw=grid, tokens=tokens,
        logprobs=to_host(out.logprobs), entropies=to_host(out.entropies), mask=m,
        texts=tuple(texts), offsets=tuple(offsets), image_counts=counts, second_per_grid=seconds,
    )


def trace(c: Completions, r: int) -> TokenTrace:
    n = len(c.offsets[r])
    return TokenTrace(entropies=tuple(float(e) for e in c.entropies[r, :n]), offsets=c.offsets[r])


def to_rollouts(
    batch: Batch, c: Completions, group_size: int, step: int, blank: Completions | None = None
) -> list[Rollout]:
    """The scorers' records; a ProSR blank completion (one per prompt) is paired with every rollout of its group."""
    out = []
    for r, text in enumerate(c.texts):
        i = r // group_size
        sample_ = batch.records[i]
        rollout = sample_.to_rollout(
            text, rollout_id=f"{sample_.id}/{step}/{r % group_size}", trace=trace(c, r),
            group=f"{step}/{sample_.id}/{i}", num_generated_tokens=int(c.mask[r].sum()),
        )
        if blank is not None:
            rollout = dataclasses.replace(rollout, blank=BlankRollout(blank.texts[i], trace(blank, i)))
        out.append(rollout)
    return out
