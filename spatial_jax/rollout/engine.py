"""Continuous batching over a paged KV cache: a fixed number of decode slots, a finished request's slot taken by the
next waiting one, and KV memory held in pages that each request takes as its tokens need them.

A host loop: admit waiting requests into free slots (prefill: their tokens, images and M-RoPE positions as the static
sampler's `extend` computes them, written into freshly allocated pages), then run one jitted chunk of at most
`chunk` decode steps over all slots, read back what each slot drew, and repeat. A request's round ends at a stop
token or after max_new_tokens draws; `on_round` then sees the round and may append tokens (a tool turn), which are
prefilled into the request's own pages before it decodes again (multi-turn rollouts), or let the request finish,
freeing its slot and pages.

Draws are keyed by (seed, the request's global row id, its token index) (`logits.row_key`), and logits, log-probs
and entropies are computed as the static sampler computes them, so a request's completion does not depend on its
slot, on its neighbours or on when it was admitted. Before each chunk a live slot gets the pages its next `chunk`
tokens need; a slot that cannot get them sits the chunk out (its pages stay), and when no slot can run and none
can be admitted the pool is too small: a RuntimeError says so (never a hang). Every compiled shape is bucketed
(rows and prefill length to powers of two, each chunk's page window to a power of two), so a run compiles a few
programs, not one per admission.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spatial_jax.models import decode_positions, get_rope_index, prepare_vision_inputs
from spatial_jax.models.paged import SCRATCH_PAGE, PagedKVCache
from spatial_jax.rollout import logits as lg
from spatial_jax.rollout.config import SamplingConfig


@dataclasses.dataclass(frozen=True)
class Request:
    """One sequence to continue: its prompt's real token ids (no padding), its visual items (patches and grid, in
    the order their image tokens come) and its global row id (which keys its draws)."""

    tokens: np.ndarray
    row_id: int
    pixel_values: np.ndarray | None = None
    image_grid_thw: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Round:
    """What a request drew in one round: tokens, log-probs at the sampling temperature, entropies at 1."""

    tokens: np.ndarray
    logprobs: np.ndarray
    entropies: np.ndarray
    stopped: bool  # ended at a stop token (else it ran out of max_new_tokens)


# on_round(request index, the round) -> None (the request is finished) or a Request-like continuation whose
# tokens (and images) join the request's context before it decodes another round (its row_id is ignored)
OnRound = Callable[[int, Round], "Request | None"]


@dataclasses.dataclass
class _Slot:
    request: int = -1  # -1: free
    pages: list[int] = dataclasses.field(default_factory=list)
    length: int = 0  # tokens in its pages
    rope_delta: int = 0
    drawn: int = 0
    budget: int = 0
    row_id: int = 0
    live: bool = False  # decoding (else waiting for its prefill)
    pending: Request | None = None  # tokens to prefill before it decodes again


def _field(slots: list[_Slot], name: str) -> jax.Array:
    return jnp.asarray(np.asarray([getattr(s, name) for s in slots], np.int32))


def _pow2(n: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, int(n) - 1).bit_length())


def _prefill_impl(graphdef, params, keys, values, logits, page_table, lengths, tokens, mask, positions, vision, slots):
    model = nnx.merge(graphdef, params)
    cache = PagedKVCache(keys=keys, values=values, page_table=page_table, lengths=lengths)
    hidden, cache = model(tokens, positions=positions, attention_mask=mask, vision=vision, cache=cache,
                          return_hidden=True)
    last = jnp.maximum(mask.sum(axis=1) - 1, 0)
    h = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    new = jnp.dot(h, model.lm_head_weight().astype(h.dtype), preferred_element_type=jnp.float32)
    return cache.keys, cache.values, logits.at[slots].set(new, mode="drop")


_prefill_jit = jax.jit(_prefill_impl, static_argnums=(0,), donate_argnums=(2, 3, 4))


def _chunk_impl(graphdef, params, keys, values, logits, page_table, lengths, rope_deltas, live, row_ids, drawn, budget,
                key, stop_ids, suppressed, cfg: SamplingConfig, steps: int):
    model = nnx.merge(graphdef, params)
    S = live.shape[0]
    out = (jnp.full((S, steps), cfg.pad_token_id, jnp.int32), jnp.zeros((S, steps), jnp.float32),
           jnp.zeros((S, steps), jnp.float32), jnp.zeros((S, steps), bool))

    def cond(carry):
        return (carry[0] < steps) & jnp.any(carry[1][4])

    def body(carry):
        step, (keys, values, logits, lengths, live, drawn, budget, stopped), (toks, lps, ents, m) = carry
        tok = jnp.where(live, lg.choose(logits, lg.row_keys(key, row_ids, drawn), cfg, suppressed), cfg.pad_token_id)
        toks = toks.at[:, step].set(tok)
        lps = lps.at[:, step].set(jnp.where(live, lg.token_logprob(logits, tok, cfg.temperature), 0.0))
        ents = ents.at[:, step].set(jnp.where(live, lg.entropy(logits), 0.0))
        m = m.at[:, step].set(live)
        hit = live & jnp.any(tok[:, None] == stop_ids[None, :], axis=1)
        cache = PagedKVCache(keys=keys, values=values, page_table=page_table, lengths=lengths)
        new_logits, cache = model(tok[:, None], positions=decode_positions(lengths, rope_deltas),
                                  attention_mask=live[:, None].astype(jnp.int32), cache=cache)
        step_live = live.astype(jnp.int32)
        budget = budget - step_live
        state = (cache.keys, cache.values, jnp.where(live[:, None], new_logits[:, 0], logits), cache.lengths,
                 live & ~hit & (budget > 0), drawn + step_live, budget, stopped | hit)
        return step + 1, state, (toks, lps, ents, m)

    state = (keys, values, logits, lengths, live, drawn, budget, jnp.zeros_like(live))
    _, state, out = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), state, out))
    return state, out


_chunk_jit = jax.jit(_chunk_impl, static_argnums=(0, 15, 16), donate_argnums=(2, 3, 4))


class Engine:
    """Decode slots over a page pool for one model and sampling config (see the module docstring).

    slots: requests decoded at once; page_size: tokens per page; pages: pool size (page 0 is scratch), default
    enough for every slot to hold `max_len` tokens; max_len: the most tokens one request may hold (prompt, draws
    and continuations); chunk: decode steps per jitted call between admissions.
    """

    def __init__(self, model, cfg: SamplingConfig, *, slots: int, max_len: int, page_size: int = 16,
                 pages: int = 0, chunk: int = 16, cache_dtype=None):
        for name, v in (("slots", slots), ("max_len", max_len), ("page_size", page_size), ("chunk", chunk)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        self.model, self.cfg = model, cfg
        self.slots, self.page_size, self.chunk, self.max_len = slots, page_size, chunk, max_len
        self.max_pages = -(-max_len // page_size)
        self.pages = pages or slots * self.max_pages + 1
        if self.pages < 2:
            raise ValueError(f"the pool needs the scratch page and at least one more, got pages={self.pages}")
        self.cache_dtype = cache_dtype
        self.peak_pages = 0

    @property
    def kv_bytes(self) -> int:
        """Bytes of the KV pool (keys and values of every layer)."""
        t = self.model.cfg.text
        dt = jnp.dtype(self.cache_dtype or self.model.cfg.dtype)
        return 2 * t.num_hidden_layers * self.pages * self.page_size * t.num_key_value_heads * t.head_dim * dt.itemsize

    def run(self, requests: Sequence[Request], on_round: OnRound | None = None) -> list[list[Round]]:
        """Every request decoded to its end: each one's rounds in order (one unless `on_round` continues it)."""
        model, cfg = self.model, self.cfg
        for i, r in enumerate(requests):
            if len(r.tokens) == 0:
                raise ValueError(f"request {i} has no tokens")
            self._check_fits(i, len(r.tokens))
        row_ids = np.asarray([r.row_id for r in requests])
        if len(np.unique(row_ids)) != len(requests) or (len(requests) and row_ids.min() < 0):
            raise ValueError("requests' row ids must be distinct non-negative integers")
        graphdef, params = nnx.split(model)
        keys, values = PagedKVCache.zeros(model.cfg, self.pages, self.page_size, self.cache_dtype)
        logits = jnp.zeros((self.slots, model.cfg.text.vocab_size), jnp.float32)
        free = list(range(self.pages - 1, SCRATCH_PAGE, -1))  # pop() hands out low pages first
        slots = [_Slot() for _ in range(self.slots)]
        waiting = deque(range(len(requests)))
        rounds: list[list[Round]] = [[] for _ in requests]
        partial: dict[int, list[tuple]] = {}
        stop_ids = jnp.asarray(cfg.stop_token_ids or (-1,), jnp.int32)
        suppressed = jnp.asarray((model.cfg.image_token_id, model.cfg.video_token_id, *cfg.suppress_token_ids),
                                 jnp.int32)
        static_cfg = dataclasses.replace(cfg, seed=0, stop_token_ids=(), suppress_token_ids=())
        base_key = jax.random.PRNGKey(cfg.seed)
        self.peak_pages = 0

        def grow(s: _Slot, tokens: int) -> bool:
            need = -(-tokens // self.page_size) - len(s.pages)
            if need > len(free):
                return False
            s.pages.extend(free.pop() for _ in range(max(0, need)))
            self.peak_pages = max(self.peak_pages, self.pages - 1 - len(free))
            return True

        while waiting or any(s.request >= 0 for s in slots):
            for s in slots:  # admissions into free slots, in order, while pages last
                if s.request < 0 and waiting:
                    i = waiting[0]
                    s.pending, s.row_id = requests[i], requests[i].row_id
                    if not grow(s, len(requests[i].tokens) + 1):
                        s.pending = None
                        break
                    waiting.popleft()
                    s.request, s.length, s.rope_delta, s.drawn = i, 0, 0, 0
            batch = [s for s in slots if s.pending is not None and grow(s, s.length + len(s.pending.tokens) + 1)]
            if batch:
                keys, values, logits = self._prefill(graphdef, params, keys, values, logits, slots, batch)
            runnable = [s.live and grow(s, s.length + min(self.chunk, s.budget)) for s in slots]
            if not any(runnable):
                if batch:
                    continue
                raise RuntimeError(
                    f"KV page pool exhausted: {self.pages} pages of {self.page_size} tokens cannot hold the "
                    f"requests in the {self.slots} slots (pages in use: {self.pages - 1 - len(free)}); give more "
                    "pages or fewer slots")
            window = min(_pow2(max(len(s.pages) for s in slots)), self.max_pages)
            table = np.full((self.slots, window), SCRATCH_PAGE, np.int32)
            for j, s in enumerate(slots):
                table[j, : len(s.pages)] = s.pages
            state, out = _chunk_jit(
                graphdef, params, keys, values, logits, jnp.asarray(table), _field(slots, "length"),
                _field(slots, "rope_delta"), jnp.asarray(np.asarray(runnable, bool)), _field(slots, "row_id"),
                _field(slots, "drawn"), _field(slots, "budget"), base_key, stop_ids, suppressed, static_cfg,
                self.chunk)
            keys, values, logits = state[0], state[1], state[2]
            lengths, live, drawn, budget, stopped = (np.asarray(x) for x in state[3:])
            toks, lps, ents, m = (np.asarray(x) for x in out)
            for j, s in enumerate(slots):
                if not runnable[j]:
                    continue
                n = int(m[j].sum())
                partial.setdefault(s.request, []).append((toks[j, :n], lps[j, :n], ents[j, :n]))
                s.length, s.drawn, s.budget = int(lengths[j]), int(drawn[j]), int(budget[j])
                if live[j]:
                    continue
                s.live = False
                parts = partial.pop(s.request)
                rnd = Round(*(np.concatenate([p[k] for p in parts]) for k in range(3)), stopped=bool(stopped[j]))
                rounds[s.request].append(rnd)
                more = None if on_round is None else on_round(s.request, rnd)
                if more is not None and len(more.tokens):
                    self._check_fits(s.request, s.length + len(more.tokens))
                    s.pending = more
                else:
                    free.extend(reversed(s.pages))
                    slots[j] = _Slot()
        return rounds

    def _check_fits(self, i: int, tokens: int) -> None:
        """A request's context of `tokens` must leave room for a whole round (so a decode never outgrows it)."""
        if tokens + self.cfg.max_new_tokens > self.max_len:
            raise ValueError(f"KV cache overflow: request {i} holds {tokens} tokens and may draw "
                             f"{self.cfg.max_new_tokens} more, over max_len={self.max_len}")

    def _prefill(self, graphdef, params, keys, values, logits, slots, batch):
        """Writes each batch slot's pending tokens into its pages; the slot becomes live with a fresh round."""
        cfg = self.model.cfg
        n = _pow2(len(batch))
        T = _pow2(max(len(s.pending.tokens) for s in batch), 8)
        ids = np.zeros((n, T), np.int32)
        mask = np.zeros((n, T), np.int32)
        table = np.full((n, min(_pow2(max(len(s.pages) for s in batch)), self.max_pages)), SCRATCH_PAGE, np.int32)
        lengths = np.zeros((n,), np.int32)
        offsets = np.zeros((n,), np.int32)
        where = np.full((n,), self.slots, np.int32)  # padding rows' logits land out of bounds (dropped)
        pixels, grids = [], []
        for b, s in enumerate(batch):
            r = s.pending
            ids[b, : len(r.tokens)] = r.tokens
            mask[b, : len(r.tokens)] = 1
            table[b, : len(s.pages)] = s.pages
            lengths[b], offsets[b], where[b] = s.length, s.length + s.rope_delta, slots.index(s)
            if r.pixel_values is not None:
                pixels.append(np.asarray(r.pixel_values))
                grids.append(np.asarray(r.image_grid_thw, np.int32).reshape(-1, 3))
        grid = np.concatenate(grids) if grids else None
        rel, deltas = get_rope_index(ids, grid, mask, image_token_id=cfg.image_token_id,
                                     spatial_merge_size=cfg.vision.spatial_merge_size,
                                     video_token_id=cfg.video_token_id)
        vision = None
        if grids:
            vision = prepare_vision_inputs(np.concatenate(pixels), grid, cfg.vision, buckets=cfg.vision_buckets)
        positions = np.where(mask[None] > 0, rel + offsets[None, :, None], 0).astype(np.int32)
        keys, values, logits = _prefill_jit(graphdef, params, keys, values, logits, jnp.asarray(table),
                                            jnp.asarray(lengths), jnp.asarray(ids), jnp.asarray(mask),
                                            jnp.asarray(positions), vision, jnp.asarray(where))
        for b, s in enumerate(batch):
            s.length += len(s.pending.tokens)
            s.rope_delta += int(deltas[b])
            s.pending, s.live, s.budget = None, True, self.cfg.max_new_tokens
        return keys, values, logits
