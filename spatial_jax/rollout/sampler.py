"""Prefill + decode with a preallocated KV cache, for a batch of left-padded prompts with images.

The sampler's whole state is one pytree (`SamplerState`): the KV cache (with its key mask), the next free cache slot,
each row's count of real tokens and M-RoPE delta, the next-token logits, which rows are done, and the PRNG key. So a
multi-turn rollout is a host loop of plain calls:

    state = prefill(model, prompt_ids, prompt_mask, pixel_values=..., image_grid_thw=..., max_len=..., seed=...,
                    row_group=...)  # rows showing the same images encode them once
    state, out = decode(model, state, cfg)            # rows stop at cfg.stop_token_ids (e.g. `</tool_call>`)
    state = extend(model, state, tool_ids, tool_mask)  # tool output joins the context; its rows become live again
    state, out2 = decode(model, state, cfg)

`prefill` is `extend` from an empty cache. Decoding is one jitted `lax.while_loop` (static shapes: [B, 1] tokens,
the cache is never resized), so one compile serves every step and every call with the same shapes and config.
Tokens a row emits after it stopped are padding: they are written to the cache with key mask 0, so the cache holds
exactly what a fresh prefill of the concatenated text would hold, at the same positions.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spatial_jax.models import KVCache, decode_positions, prepare_vision_inputs, rope_index
from spatial_jax.rollout import logits as lg
from spatial_jax.rollout.config import SamplingConfig


@flax.struct.dataclass
class SamplerState:
    """Everything needed to continue a batch: pass it back to `decode` / `extend`."""

    cache: KVCache
    cache_index: jax.Array  # int32 scalar: next free cache slot (shared by all rows)
    num_real: jax.Array  # [B] int32: real (unmasked) tokens in the row so far
    rope_deltas: jax.Array  # [B] int32: position of the next text token = num_real + rope_delta
    logits: jax.Array  # [B, V] float32: next-token logits after the last real token
    done: jax.Array  # [B] bool: the row emits no more tokens until `extend` gives it new ones
    key: jax.Array  # the run's base PRNG key (from the seed); never advanced
    row_ids: jax.Array  # [B] int32: each row's global id (its draws do not depend on its batch position)
    drawn: jax.Array  # [B] int32: tokens the row has drawn so far (the index of its next draw)

    @property
    def max_len(self) -> int:
        return self.cache.max_len


@flax.struct.dataclass
class SampleOutput:
    """One `decode` call's completions, [B, max_new_tokens] each (padding after a row stops, mask 0 there)."""

    tokens: jax.Array  # int32
    logprobs: jax.Array  # float32: log softmax(logits / T) at the drawn token, full vocabulary (T = 1 when greedy)
    entropies: jax.Array  # float32: entropy (nats) of softmax(logits) over the full vocabulary, temperature 1
    mask: jax.Array  # int32: 1 up to and including the stop token
    lengths: jax.Array  # [B] int32: sum of mask


def init_state(model, batch: int, max_len: int, *, seed: int = 0, cache_dtype=None, row_ids=None) -> SamplerState:
    """An empty cache of `max_len` slots; every row is done until `extend` feeds it tokens.

    Row r's t-th draw uses `logits.row_key(PRNGKey(seed), row_ids[r], t)` (row_ids default arange(batch)), so a row
    gives the same tokens in any batch, slot or process that decodes it with the same global id.
    """
    vocab = model.cfg.text.vocab_size
    return SamplerState(
        cache=model.init_cache(batch, max_len, cache_dtype),
        cache_index=jnp.zeros((), jnp.int32),
        num_real=jnp.zeros((batch,), jnp.int32),
        rope_deltas=jnp.zeros((batch,), jnp.int32),
        logits=jnp.zeros((batch, vocab), jnp.float32),
        done=jnp.ones((batch,), bool),
        key=jax.random.PRNGKey(seed),
        row_ids=check_row_ids(row_ids, batch),
        drawn=jnp.zeros((batch,), jnp.int32),
    )


def check_row_ids(row_ids, batch: int) -> jax.Array:
    """Global row ids as int32 [batch] (default arange(batch)); they must be distinct non-negative integers."""
    if row_ids is None:
        return jnp.arange(batch, dtype=jnp.int32)
    ids = np.asarray(row_ids)
    if ids.shape != (batch,) or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"row_ids must be {batch} integers, got shape {ids.shape} of {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= 2**31 or len(np.unique(ids)) != ids.size):
        raise ValueError("row_ids must be distinct integers in [0, 2**31)")
    return jnp.asarray(ids, jnp.int32)


def _last_hidden_logits(model, hidden: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Logits [B, V] at each row's last real token (as the model computes them) and whether the row has one."""
    T = mask.shape[1]
    has = jnp.any(mask > 0, axis=1)
    last = T - 1 - jnp.argmax(mask[:, ::-1] > 0, axis=1)
    h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    w = model.lm_head_weight()
    return jnp.dot(h, w.astype(h.dtype), preferred_element_type=jnp.float32), has


def _extend_impl(graphdef, params, state: SamplerState, tokens, mask, rel_positions, rel_deltas, vision):
    model = nnx.merge(graphdef, params)
    offset = state.num_real + state.rope_deltas  # position of each row's next text token
    positions = rel_positions + offset[None, :, None]
    hidden, cache = model(tokens, positions=positions, attention_mask=mask, vision=vision, cache=state.cache,
                          cache_index=state.cache_index, return_hidden=True)
    logits, has = _last_hidden_logits(model, hidden, mask)
    return state.replace(
        cache=cache,
        cache_index=state.cache_index + tokens.shape[1],
        num_real=state.num_real + mask.sum(axis=1).astype(jnp.int32),
        rope_deltas=state.rope_deltas + rel_deltas,
        logits=jnp.where(has[:, None], logits, state.logits),
        done=state.done & ~has,
    )


_extend_jit = jax.jit(_extend_impl, static_argnums=(0,))


def extend(model, state: SamplerState, tokens, token_mask=None, *, pixel_values=None, image_grid_thw=None,
           row_group=None, row_image_counts=None, num_frames: int | None = None,
           second_per_grid=None) -> SamplerState:
    """Appends `tokens` [B, T] (real where `token_mask` is 1; any padding pattern) to every row's context.

    Their positions continue each row's sequence (M-RoPE positions for image tokens when `pixel_values` and
    `image_grid_thw` come with them), their keys/values enter the cache, and a row that receives at least one real
    token becomes live again with the logits after its last one. Nothing is sampled and no log-probs are produced.
    With `row_group` (vision.prepare_vision_inputs: rows with one id show the same images, given row by row with
    `row_image_counts` items each) those images are encoded once and their features shared: the G rollouts of a
    prompt. Frames are padded to the model's vision buckets (and to `num_frames` slots when given), so
    differently sized images share one compile. `second_per_grid` [items] beside image_grid_thw: each video item's
    seconds per temporal patch (models.rope_index).
    """
    tokens = np.asarray(tokens, np.int32)
    if tokens.ndim != 2 or tokens.shape[0] != state.done.shape[0]:
        raise ValueError(f"tokens must be [B={state.done.shape[0]}, T], got shape {tokens.shape}")
    mask = np.ones(tokens.shape, np.int32) if token_mask is None else np.asarray(token_mask, np.int32)
    if mask.shape != tokens.shape:
        raise ValueError(f"token_mask shape {mask.shape} != tokens shape {tokens.shape}")
    if tokens.shape[1] == 0:
        return state
    used = int(state.cache_index)
    if used + tokens.shape[1] > state.max_len:
        raise ValueError(
            f"KV cache overflow: {used} of {state.max_len} slots used, cannot append {tokens.shape[1]} more tokens"
        )
    if (pixel_values is None) != (image_grid_thw is None):
        raise ValueError("pixel_values and image_grid_thw go together")
    cfg = model.cfg
    rel_positions, rel_deltas = rope_index(cfg, tokens, image_grid_thw, mask, second_per_grid)
    vision = None
    if pixel_values is not None:
        vision = prepare_vision_inputs(pixel_values, image_grid_thw, cfg.vision, buckets=cfg.vision_buckets,
                                       num_frames=num_frames, row_group=row_group, row_image_counts=row_image_counts)
    graphdef, params = nnx.split(model)
    return _extend_jit(graphdef, params, state, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(rel_positions),
                       jnp.asarray(rel_deltas), vision)


def prefill(model, input_ids, attention_mask=None, *, pixel_values=None, image_grid_thw=None, max_len: int,
            seed: int = 0, cache_dtype=None, row_group=None, row_image_counts=None,
            num_frames: int | None = None, row_ids=None, second_per_grid=None) -> SamplerState:
    """Fresh cache of `max_len` slots filled with the (left-padded) prompts; ready for `decode`. `row_ids`: the
    rows' global ids, which key their draws (see `init_state`)."""
    input_ids = np.asarray(input_ids)
    state = init_state(model, input_ids.shape[0], max_len, seed=seed, cache_dtype=cache_dtype, row_ids=row_ids)
    return extend(model, state, input_ids, attention_mask, pixel_values=pixel_values,
                  image_grid_thw=image_grid_thw, row_group=row_group, row_image_counts=row_image_counts,
                  num_frames=num_frames, second_per_grid=second_per_grid)


def _decode_impl(graphdef, params, state: SamplerState, stop_ids: jax.Array, suppressed: jax.Array,
                 cfg: SamplingConfig):
    model = nnx.merge(graphdef, params)
    B = state.done.shape[0]
    N = cfg.max_new_tokens
    out = SampleOutput(
        tokens=jnp.full((B, N), cfg.pad_token_id, jnp.int32),
        logprobs=jnp.zeros((B, N), jnp.float32),
        entropies=jnp.zeros((B, N), jnp.float32),
        mask=jnp.zeros((B, N), jnp.int32),
        lengths=jnp.zeros((B,), jnp.int32),
    )

    def cond(carry):
        step, st, _ = carry
        return (step < N) & ~jnp.all(st.done)

    def body(carry):
        step, st, o = carry
        live = ~st.done
        tok, lp, ent = lg.draw(st.logits, lg.row_keys(st.key, st.row_ids, st.drawn), live, cfg, suppressed)
        o = o.replace(
            tokens=o.tokens.at[:, step].set(tok),
            logprobs=o.logprobs.at[:, step].set(lp),
            entropies=o.entropies.at[:, step].set(ent),
            mask=o.mask.at[:, step].set(live.astype(jnp.int32)),
        )
        stopped = live & jnp.any(tok[:, None] == stop_ids[None, :], axis=1)
        logits, cache = model(tok[:, None], positions=decode_positions(st.num_real, st.rope_deltas),
                              attention_mask=live[:, None].astype(jnp.int32), cache=st.cache,
                              cache_index=st.cache_index)
        st = st.replace(cache=cache, cache_index=st.cache_index + 1, num_real=st.num_real + live.astype(jnp.int32),
                        logits=logits[:, 0], done=st.done | stopped, drawn=st.drawn + live.astype(jnp.int32))
        return step + 1, st, o

    _, state, out = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), state, out))
    return state, out.replace(lengths=out.mask.sum(axis=1))


_decode_jit = jax.jit(_decode_impl, static_argnums=(0, 5))


def decode(model, state: SamplerState, cfg: SamplingConfig) -> tuple[SamplerState, SampleOutput]:
    """Draws up to cfg.max_new_tokens tokens for every live row (stopping early once all rows are done).

    The seed is not used here: randomness comes from `state.key` and the rows' ids and draw counts (set by
    `prefill`). Seeds, stop ids and suppressed
    ids (for a given number of them) are not part of the compiled loop's key, so changing them does not recompile.
    Needs cfg.max_new_tokens free cache slots.
    """
    used = int(state.cache_index)
    if used + cfg.max_new_tokens > state.max_len:
        raise ValueError(
            f"KV cache overflow: {used} of {state.max_len} slots used, cannot decode {cfg.max_new_tokens} more tokens"
        )
    graphdef, params = nnx.split(model)
    stop_ids = jnp.asarray(cfg.stop_token_ids or (-1,), jnp.int32)
    suppressed = jnp.asarray((model.cfg.image_token_id, model.cfg.video_token_id, *cfg.suppress_token_ids), jnp.int32)
    static_cfg = dataclasses.replace(cfg, seed=0, stop_token_ids=(), suppress_token_ids=())
    return _decode_jit(graphdef, params, state, stop_ids, suppressed, static_cfg)


def generate(model, input_ids, attention_mask=None, *, pixel_values=None, image_grid_thw=None,
             cfg: SamplingConfig = SamplingConfig(), max_len: int | None = None, cache_dtype=None,
             row_group=None, row_image_counts=None, num_frames: int | None = None, row_ids=None,
             second_per_grid=None) -> tuple[SampleOutput, SamplerState]:
    """prefill + decode in one call; the cache has room for the prompt plus cfg.max_new_tokens unless max_len says.
    `row_ids` [B]: the rows' global ids (default arange(B)); row r's draws depend only on (cfg.seed, row_ids[r])."""
    prompt_len = np.asarray(input_ids).shape[1]
    state = prefill(model, input_ids, attention_mask, pixel_values=pixel_values, image_grid_thw=image_grid_thw,
                    max_len=max_len or prompt_len + cfg.max_new_tokens, seed=cfg.seed, cache_dtype=cache_dtype,
                    row_group=row_group, row_image_counts=row_image_counts, num_frames=num_frames, row_ids=row_ids,
                    second_per_grid=second_per_grid)
    state, out = decode(model, state, cfg)
    return out, state
