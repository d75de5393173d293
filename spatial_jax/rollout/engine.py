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
tokens need, oldest request first; a slot that cannot get them sits the chunk out (its pages stay) and admissions
wait. When no slot can run, the youngest request still in its first round gives its pages back and starts over
later (drawing the same tokens); when there is none, the pool is too small: a RuntimeError says so (never a hang).
Every compiled shape is bucketed
(rows and prefill length to powers of two, each call's page window to a power of two of at least
MIN_WINDOW_TOKENS), so a run compiles a few
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

from spatial_jax.models import decode_positions, prepare_vision_inputs, rope_index
from spatial_jax.models.paged import SCRATCH_PAGE, PagedKVCache
from spatial_jax.models.vision import shared_items
from spatial_jax.rollout import logits as lg
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.sampler import SampleOutput, check_row_ids


@dataclasses.dataclass(frozen=True)
class Request:
    """One sequence to continue: its prompt's real token ids (no padding), its visual items (patches and grid, in
    the order their image tokens come), its global row id (which keys its draws), optionally a smaller draw budget
    per round than the sampling config's max_new_tokens, and optionally a group: requests of one group show the
    same images (the G rollouts of a prompt), which are encoded once when they are prefilled together.
    second_per_grid [items] beside image_grid_thw: each video item's seconds per temporal patch (models.rope_index;
    None: 1 second)."""

    tokens: np.ndarray
    row_id: int
    pixel_values: np.ndarray | None = None
    image_grid_thw: np.ndarray | None = None
    max_new_tokens: int | None = None
    group: int | None = None
    second_per_grid: np.ndarray | None = None


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
    order: int = 0  # admission count: older requests get pages first


# Windows below this many tokens are not worth a compile of their own: attending over them costs little.
MIN_WINDOW_TOKENS = 256


def _window(pages: int, engine: Engine) -> int:
    """Pages a chunk's or prefill's rows read: a power of two covering `pages`, at least MIN_WINDOW_TOKENS, capped
    at what a request can hold."""
    return min(max(_pow2(pages), -(-MIN_WINDOW_TOKENS // engine.page_size)), engine.max_pages)


def _field(slots: list[_Slot], name: str) -> np.ndarray:
    return np.asarray([getattr(s, name) for s in slots], np.int32)


def _on_device(x):
    """Host arrays as device arrays (vision inputs and None as they are: jit places those itself)."""
    return jnp.asarray(x) if isinstance(x, np.ndarray) else x


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
        tok, lp, ent = lg.draw(logits, lg.row_keys(key, row_ids, drawn), live, cfg, suppressed)
        toks, lps, ents = toks.at[:, step].set(tok), lps.at[:, step].set(lp), ents.at[:, step].set(ent)
        m = m.at[:, step].set(live)
        hit = live & jnp.any(tok[:, None] == stop_ids[None, :], axis=1)
        cache = PagedKVCache(keys=keys, values=values, page_table=page_table, lengths=lengths,
                             kernel=cfg.decode_kernel)
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

# XLA's command buffers (CUDA graphs) for the decode chunk, per function so the trainer's programs are untouched:
# besides the default kinds of command, the while loop and its conditionals, so a whole chunk of decode steps (36
# layers of small kernels each) replays as one graph instead of thousands of launches. The CPU compiler checks the
# names and ignores them.
COMMAND_BUFFERS = {"xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"}
_chunk_graph_jit = jax.jit(_chunk_impl, static_argnums=(0, 15, 16), donate_argnums=(2, 3, 4),
                           compiler_options=COMMAND_BUFFERS)


def chunk_function(cfg: SamplingConfig):
    """The jitted decode chunk a sampling config asks for (with command buffers or without)."""
    return _chunk_graph_jit if cfg.command_buffers else _chunk_jit


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
        self.peak_pages = 0  # the most pages (scratch excluded) in use at once in the last run
        self.free_pages: list[int] = []  # the pool's free pages when the last run ended
        self.stats = {"chunks": 0, "paused": 0, "restarts": 0}  # of the last run: slots sitting a chunk out, ...
        self.command_buffer_error: str | None = None  # why cfg.command_buffers fell back to the plain chunk

    @classmethod
    def from_sampling(cls, model, cfg: SamplingConfig, rows: int, max_len: int) -> Engine:
        """The engine a sampling config asks for, for `rows` requests: cfg.slots at once (0: all of them), its
        page size, pool and chunk."""
        return cls(model, cfg, slots=cfg.slots or max(1, rows), max_len=max_len, page_size=cfg.page_size,
                   pages=cfg.pages, chunk=cfg.chunk)

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
        check_row_ids(np.asarray([r.row_id for r in requests], np.int64), len(requests))
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
        static_cfg = dataclasses.replace(cfg, seed=0, stop_token_ids=(), suppress_token_ids=(),
                                         command_buffers=False)  # which jit runs it: _decode_chunk
        base_key = jax.random.PRNGKey(cfg.seed)
        self.peak_pages = 0
        self.stats = {"chunks": 0, "paused": 0, "restarts": 0}

        def grow(s: _Slot, tokens: int) -> bool:
            need = -(-tokens // self.page_size) - len(s.pages)
            if need > len(free):
                return False
            s.pages.extend(free.pop() for _ in range(max(0, need)))
            self.peak_pages = max(self.peak_pages, self.pages - 1 - len(free))
            return True

        admitted, pressed = 0, False
        while waiting or any(s.request >= 0 for s in slots):
            pressed = pressed and any(s.request >= 0 for s in slots)
            for s in slots:  # admissions into free slots, in order, while pages last and no slot waits for pages
                if s.request < 0 and waiting and not pressed:
                    i = waiting[0]
                    if not grow(s, len(requests[i].tokens) + 1):
                        break
                    waiting.popleft()
                    s.request, s.pending, s.row_id, s.order = i, requests[i], requests[i].row_id, admitted
                    admitted += 1
            by_age = sorted((s for s in slots if s.request >= 0), key=lambda s: s.order)
            batch = [s for s in by_age if s.pending is not None and grow(s, s.length + len(s.pending.tokens) + 1)]
            if batch:
                keys, values, logits = self._prefill(graphdef, params, keys, values, logits, slots, batch)
            ok = {id(s) for s in by_age if s.live and grow(s, s.length + min(self.chunk, s.budget))}
            runnable = [id(s) in ok for s in slots]
            pressed = len(ok) < sum(s.live for s in slots) or any(s.pending is not None for s in slots)
            if not ok:
                if batch:
                    continue
                # Every slot waits for pages: the youngest request still in its first round starts over later
                # (its draws are keyed by row and token index, so it redraws the same tokens); alone, nothing helps.
                victims = [s for s in by_age if not rounds[s.request]] if len(by_age) > 1 else []
                if not victims:
                    raise RuntimeError(
                        f"KV page pool exhausted: {self.pages} pages of {self.page_size} tokens cannot hold the "
                        f"requests in the {self.slots} slots (pages in use: {self.pages - 1 - len(free)}); give "
                        "more pages or fewer slots")
                victim = victims[-1]
                self.stats["restarts"] += 1
                partial.pop(victim.request, None)
                waiting.appendleft(victim.request)
                free.extend(reversed(victim.pages))
                slots[slots.index(victim)] = _Slot()
                continue
            self.stats["chunks"] += 1
            self.stats["paused"] += sum(s.live for s in slots) - len(ok)
            state, out = self._decode_chunk(graphdef, params, keys, values, logits,
                                             *map(_on_device, self._chunk_inputs(slots, runnable)), base_key,
                                             stop_ids, suppressed, static_cfg, self.chunk)
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
        self.free_pages = sorted(free)  # every page but the scratch one, once each: a page not handed back leaks
        return rounds

    def _decode_chunk(self, *args):
        """One decode chunk, with command buffers when the config asks for them and they compile: a failure before
        the chunk ran (its donated KV pools still alive: compiling or capturing the graph) falls back to the plain
        chunk for the rest of this engine's life, the reason kept in `command_buffer_error`."""
        if self.cfg.command_buffers and self.command_buffer_error is None:
            try:
                return _chunk_graph_jit(*args)
            except Exception as e:
                if any(x.is_deleted() for x in jax.tree.leaves(args[2:5])):
                    raise  # the chunk ran: not a capture failure, and its inputs are gone
                self.command_buffer_error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        return _chunk_jit(*args)

    def _check_fits(self, i: int, tokens: int) -> None:
        """A request's context of `tokens` must leave room for a whole round (so a decode never outgrows it)."""
        if tokens + self.cfg.max_new_tokens > self.max_len:
            raise ValueError(f"KV cache overflow: request {i} holds {tokens} tokens and may draw "
                             f"{self.cfg.max_new_tokens} more, over max_len={self.max_len}")

    def widest_prefill_inputs(self, request: Request, group_size: int = 1) -> tuple:
        """The inputs of the largest prefill a run of copies of `request` makes (every slot admitting one at once,
        G = group_size consecutive slots sharing its images): what `_prefill_jit` takes after the KV state, for
        `plan` to compile."""
        need = -(-(len(request.tokens) + 1) // self.page_size)
        slots = [_Slot(request=i, pages=[SCRATCH_PAGE] * need, row_id=i,
                       pending=dataclasses.replace(request, row_id=i, group=i // group_size))
                 for i in range(self.slots)]
        return self._prefill_inputs(slots, slots)[:-1]

    def widest_chunk_inputs(self) -> tuple[np.ndarray, ...]:
        """The per-slot inputs of the largest decode chunk (every slot live at its longest context): what
        `_chunk_jit` takes between the KV state and the key, for `plan` to compile."""
        slots = [_Slot(request=i, pages=[SCRATCH_PAGE] * self.max_pages, row_id=i, live=True)
                 for i in range(self.slots)]
        return self._chunk_inputs(slots, [True] * self.slots)

    def chunk_inputs_at(self, context: int) -> tuple[np.ndarray, ...]:
        """The per-slot inputs of a decode chunk with every slot live at `context` cached tokens, in pages of its
        own (slot j's after slot j - 1's), with a budget of one chunk: a decode step at a chosen context, as
        benchmarks/training/step_gpu.py times it."""
        need = -(-(context + self.chunk) // self.page_size)
        if context < 1 or need > self.max_pages or 1 + self.slots * need > self.pages:
            raise ValueError(f"context {context} + a chunk of {self.chunk} does not fit {self.slots} slots of "
                             f"max_len={self.max_len} in {self.pages} pages of {self.page_size}")
        slots = [_Slot(request=i, pages=list(range(1 + i * need, 1 + (i + 1) * need)), length=context, row_id=i,
                       live=True, budget=self.chunk) for i in range(self.slots)]
        return self._chunk_inputs(slots, [True] * self.slots)

    def _chunk_inputs(self, slots: list[_Slot], runnable: Sequence[bool]) -> tuple[np.ndarray, ...]:
        """A decode chunk's per-slot arrays: page table [slots, window], lengths, rope deltas, runnable, row ids,
        draws so far and budgets."""
        table = np.full((self.slots, _window(max(len(s.pages) for s in slots), self)), SCRATCH_PAGE, np.int32)
        for j, s in enumerate(slots):
            table[j, : len(s.pages)] = s.pages
        return (table, _field(slots, "length"), _field(slots, "rope_delta"), np.asarray(runnable, bool),
                _field(slots, "row_id"), _field(slots, "drawn"), _field(slots, "budget"))

    def _prefill(self, graphdef, params, keys, values, logits, slots, batch):
        """Writes each batch slot's pending tokens into its pages; the slot becomes live with a fresh round."""
        *inputs, deltas = self._prefill_inputs(slots, batch)
        keys, values, logits = _prefill_jit(graphdef, params, keys, values, logits, *map(_on_device, inputs))
        for b, s in enumerate(batch):
            s.length += len(s.pending.tokens)
            s.rope_delta += int(deltas[b])
            cap = s.pending.max_new_tokens
            s.pending, s.live = None, True
            s.budget = self.cfg.max_new_tokens if cap is None else max(1, min(cap, self.cfg.max_new_tokens))
        return keys, values, logits

    def _prefill_inputs(self, slots: list[_Slot], batch: list[_Slot]) -> tuple:
        """A prefill's host inputs for the `batch` slots' pending tokens: page table, cached lengths, ids, mask,
        M-RoPE positions, vision inputs (or None) and each row's slot, then each row's rope delta."""
        cfg = self.model.cfg
        n = _pow2(len(batch))
        T = _pow2(max(len(s.pending.tokens) for s in batch), 8)
        ids = np.zeros((n, T), np.int32)
        mask = np.zeros((n, T), np.int32)
        table = np.full((n, _window(max(len(s.pages) for s in batch), self)), SCRATCH_PAGE, np.int32)
        lengths = np.zeros((n,), np.int32)
        offsets = np.zeros((n,), np.int32)
        where = np.full((n,), self.slots, np.int32)  # padding rows' logits land out of bounds (dropped)
        pixels, grids, seconds, counts, groups = [], [], [], np.zeros((n,), np.int64), {}
        row_group = [groups.setdefault(("row", b), len(groups)) for b in range(n)]
        for b, s in enumerate(batch):
            r = s.pending
            ids[b, : len(r.tokens)] = r.tokens
            mask[b, : len(r.tokens)] = 1
            table[b, : len(s.pages)] = s.pages
            lengths[b], offsets[b], where[b] = s.length, s.length + s.rope_delta, slots.index(s)
            if r.pixel_values is not None:
                pixels.append(np.asarray(r.pixel_values))
                grids.append(np.asarray(r.image_grid_thw, np.int32).reshape(-1, 3))
                counts[b] = len(grids[-1])
                seconds.append(np.ones(counts[b], np.float32) if r.second_per_grid is None
                               else np.asarray(r.second_per_grid, np.float32))
                if r.group is not None:
                    row_group[b] = groups.setdefault(("group", r.group), len(groups))
        grid = np.concatenate(grids) if grids else None
        rel, deltas = rope_index(cfg, ids, grid, mask, np.concatenate(seconds) if grids else None)
        vision = None
        if grids:  # frame slots padded to a power of two: admissions with other images reuse the compile
            frames = int(grid[shared_items(grid, row_group, counts)[0], 0].sum())
            vision = prepare_vision_inputs(np.concatenate(pixels), grid, cfg.vision, buckets=cfg.vision_buckets,
                                           num_frames=_pow2(frames), row_group=row_group, row_image_counts=counts)
        positions = np.where(mask[None] > 0, rel + offsets[None, :, None], 0).astype(np.int32)
        return table, lengths, ids, mask, positions, vision, where, deltas


def split_rows(input_ids, attention_mask, pixel_values=None, image_grid_thw=None, image_counts=None, row_ids=None,
               row_group=None, second_per_grid=None) -> list[Request]:
    """A padded batch (any padding pattern) as one Request per row: its real tokens, its `image_counts[r]` visual
    items (the items come row by row; see `image_counts_of`) with their second_per_grid values when given, its
    global id (default its index) and its group (`row_group[r]`: rows of one group show the same images; default
    none)."""
    ids, mask = np.asarray(input_ids), np.asarray(attention_mask)
    R = ids.shape[0]
    row_ids = np.arange(R) if row_ids is None else np.asarray(row_ids)
    if row_ids.shape != (R,):
        raise ValueError(f"row_ids must be {R} integers, got shape {row_ids.shape}")
    if image_grid_thw is None:
        return [Request(ids[r][mask[r] > 0], int(row_ids[r])) for r in range(R)]
    grid = np.asarray(image_grid_thw, np.int32).reshape(-1, 3)
    counts = np.asarray(image_counts)
    if counts.shape != (R,) or counts.sum() != len(grid):
        raise ValueError(f"image_counts must give each of the {R} rows' items, {len(grid)} in all")
    items = np.concatenate([[0], np.cumsum(counts)])
    patches = np.concatenate([[0], np.cumsum(np.prod(grid, axis=-1))])
    out = []
    for r in range(R):
        a, b = items[r], items[r + 1]
        images = (np.asarray(pixel_values)[patches[a] : patches[b]], grid[a:b]) if b > a else (None, None)
        seconds = None if second_per_grid is None or b == a else np.asarray(second_per_grid, np.float32)[a:b]
        out.append(Request(ids[r][mask[r] > 0], int(row_ids[r]), *images,
                           group=None if row_group is None else int(row_group[r]), second_per_grid=seconds))
    return out


def image_counts_of(cfg, input_ids, attention_mask, image_grid_thw) -> np.ndarray:
    """How many of the (row-major) visual items each row shows, from its count of image/video tokens."""
    ids, mask = np.asarray(input_ids), np.asarray(attention_mask)
    wanted = (((ids == cfg.image_token_id) | (ids == cfg.video_token_id)) & (mask > 0)).sum(axis=1)
    sizes = np.prod(np.asarray(image_grid_thw).reshape(-1, 3), axis=-1) // cfg.vision.spatial_merge_size**2
    counts, item = np.zeros(len(ids), np.int64), 0
    for r, need in enumerate(wanted):
        while need > 0 and item < len(sizes):
            need, item, counts[r] = need - sizes[item], item + 1, counts[r] + 1
        if need != 0:
            raise ValueError(f"row {r}'s image tokens do not match the sizes of the visual items given")
    return counts


def generate(model, input_ids, attention_mask, *, cfg: SamplingConfig, pixel_values=None, image_grid_thw=None,
             image_counts=None, row_ids=None, row_group=None, max_len: int | None = None,
             second_per_grid=None) -> SampleOutput:
    """The static sampler's `generate` through the engine (cfg.slots, cfg.pages, cfg.page_size, cfg.chunk): the same
    SampleOutput ([R, cfg.max_new_tokens] tokens, log-probs, entropies, mask; numpy), rows in the given order.
    `row_group`: rows with one id show the same images (see `Request.group`); `second_per_grid`: see `Request`."""
    if image_grid_thw is not None and image_counts is None:
        image_counts = image_counts_of(model.cfg, input_ids, attention_mask, image_grid_thw)
    requests = split_rows(input_ids, attention_mask, pixel_values, image_grid_thw, image_counts, row_ids, row_group,
                          second_per_grid)
    longest = max((len(r.tokens) for r in requests), default=0)
    engine = Engine.from_sampling(model, cfg, len(requests), max_len or longest + cfg.max_new_tokens)
    rounds = engine.run(requests)
    R, N = len(requests), cfg.max_new_tokens
    tokens = np.full((R, N), cfg.pad_token_id, np.int32)
    logprobs = np.zeros((R, N), np.float32)
    entropies = np.zeros((R, N), np.float32)
    mask = np.zeros((R, N), np.int32)
    for r, (rnd,) in enumerate(rounds):
        n = len(rnd.tokens)
        tokens[r, :n], logprobs[r, :n], entropies[r, :n], mask[r, :n] = rnd.tokens, rnd.logprobs, rnd.entropies, 1
    return SampleOutput(tokens=tokens, logprobs=logprobs, entropies=entropies, mask=mask, lengths=mask.sum(axis=1))
