"""The KV-cache sampler against full forwards (no cache), against transformers' generate on the same tiny weights,
and its contracts: determinism, stop tokens, left padding with differently sized images, one compile for all decode
steps, and multi-turn `extend`.

Tolerances: the sampler's logits come from cached attention, the reference's from one full causal forward, both in
float32 on CPU; per-token log-probs and entropies agree to 1e-4 absolute (observed ~1e-6).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spatial_jax.data.image_processing import ImageProcessingConfig, num_image_tokens, preprocess
from spatial_jax.models import ModelConfig, Qwen3VL, prepare_vision_inputs
from spatial_jax.models.hf_io import from_pretrained
from spatial_jax.models.registry import config_to_hf
from spatial_jax.rollout import SamplingConfig, decode, extend, generate, prefill
from spatial_jax.rollout import logits as lg
from spatial_jax.rollout import sampler as sampler_mod

TOL = 1e-4
VOCAB = 128
N_NEW = 6
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=N_NEW)


# ------------------------------------------------------------------ pure token-choice functions


def test_top_k_keeps_ties_and_handles_large_k():
    x = jnp.array([[1.0, 3.0, 2.0, 3.0, 0.0]])
    assert lg.top_k_mask(x, 1).tolist() == [[False, True, False, True, False]]  # both 3.0 kept
    assert lg.top_k_mask(x, 3).tolist() == [[False, True, True, True, False]]
    assert bool(lg.top_k_mask(x, 5).all()) and bool(lg.top_k_mask(x, 1000).all()) and bool(lg.top_k_mask(x, 0).all())


def test_top_p_keeps_ties_and_the_argmax():
    probs = jnp.array([[0.4, 0.2, 0.2, 0.1, 0.1]])
    x = jnp.log(probs)
    # 0.4 alone < 0.5: the next tier (two tokens of 0.2) is needed, and both tied tokens are kept
    assert lg.top_p_mask(x, 0.5).tolist() == [[True, True, True, False, False]]
    assert lg.top_p_mask(x, 1e-6).tolist() == [[True, False, False, False, False]]
    assert lg.top_p_mask(x, 0.85).tolist() == [[True, True, True, True, True]]
    assert bool(lg.top_p_mask(x, 1.0).all())


def test_masks_equal_sort_based_definitions_with_many_ties():
    """The bisection thresholds equal the textbook definitions (numpy, float64 sort) on rows full of ties,
    negative, huge and -inf logits."""
    rng = np.random.default_rng(2)
    V = 33
    x = rng.choice([-1e30, -np.inf, -3.0, -0.5, 0.0, 0.5, 2.0, 7.0, 1e4], size=(90, V)).astype(np.float32)
    x[:, 0] = 1.0  # at least one finite logit per row
    x[:30, 1:] = rng.choice([1.0, 0.5, -np.inf], size=(30, V - 1))  # rows whose top logit is tied
    for k in (1, 5, V - 1):
        kth = -np.sort(-x, axis=-1)[:, k - 1 : k]
        np.testing.assert_array_equal(np.asarray(jax.jit(lg.top_k_mask, static_argnums=1)(x, k)), x >= kth)
    probs = np.asarray(jax.nn.softmax(jnp.asarray(x), axis=-1), np.float64)
    mass_above = ((probs[:, None, :] > probs[:, :, None]) * probs[:, None, :]).sum(-1)
    for p in (0.05, 0.5, 0.9):
        got = np.asarray(jax.jit(lg.top_p_mask, static_argnums=1)(x, p))
        near = np.abs(mass_above - p) < 1e-6  # float32 summation may round either way only at the boundary
        np.testing.assert_array_equal(got[~near], (mass_above < p)[~near])
        assert got[np.arange(len(x)), probs.argmax(-1)].all()


def test_filters_match_hf_warpers_on_untied_logits():
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(0)
    for top_k, top_p, temp in [(5, 1.0, 1.0), (0, 0.7, 0.8), (20, 0.9, 1.3), (200, 0.5, 1.0)]:
        x = rng.normal(size=(4, 64)).astype(np.float32) * 2
        cfg = SamplingConfig(temperature=temp, top_k=top_k, top_p=top_p)
        ours = np.isfinite(np.asarray(lg.filtered_logits(jnp.asarray(x), cfg)))
        ref = torch.tensor(x) / temp
        if top_k:
            ref = TopKLogitsWarper(top_k)(None, ref)
        if top_p < 1:
            ref = TopPLogitsWarper(top_p)(None, ref)
        np.testing.assert_array_equal(ours, np.isfinite(ref.numpy()))


def test_entropy_and_logprob_formulas():
    x = np.random.default_rng(1).normal(size=(3, 17)).astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(lg.entropy(jnp.asarray(x, jnp.float32)), -(p * np.log(p)).sum(-1), atol=1e-5)
    tok = np.array([0, 5, 16])
    t = 0.7
    q = np.exp(x / t - (x / t).max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    np.testing.assert_allclose(lg.token_logprob(jnp.asarray(x, jnp.float32), jnp.asarray(tok), t),
                               np.log(q[np.arange(3), tok]), atol=1e-5)
    assert np.isfinite(np.asarray(lg.entropy(jnp.array([[0.0, -jnp.inf, 1.0]])))).all()


def test_config_validation():
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingConfig(top_k=-2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingConfig(max_new_tokens=0)


# ------------------------------------------------------------------ a tiny model shared with transformers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny HF Qwen3VLForConditionalGeneration (untied output head scaled up so next-token distributions are
    peaked, far from argmax ties, yet varied), saved and loaded back with spatial_jax's from_pretrained."""
    torch = pytest.importorskip("torch")
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    cfg = ModelConfig.tiny(vocab_size=VOCAB, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**config_to_hf(cfg))).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(8.0)
    path = tmp_path_factory.mktemp("tiny_qwen3vl")
    hf.save_pretrained(path)
    return hf, from_pretrained(path)


def _images(seed, sizes):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in sizes]


def _vision_cfg(cfg: ModelConfig) -> ImageProcessingConfig:
    f = cfg.vision.patch_size * cfg.vision.spatial_merge_size
    return ImageProcessingConfig(patch_size=cfg.vision.patch_size, merge_size=cfg.vision.spatial_merge_size,
                                 min_pixels=f * f * 4, max_pixels=f * f * 12)


def _image_span(cfg: ModelConfig, n_tokens: int) -> list[int]:
    return [cfg.vision_start_token_id] + [cfg.image_token_id] * n_tokens + [cfg.vision_end_token_id]


def _left_pad(rows):
    T = max(len(r) for r in rows)
    ids = np.zeros((len(rows), T), np.int32)
    mask = np.zeros((len(rows), T), np.int32)
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = r
        mask[i, T - len(r):] = 1
    return ids, mask


@pytest.fixture(scope="module")
def batch(tiny):
    """3 left-padded prompts: two with images of different sizes (and different token counts), one text-only."""
    _, model = tiny
    cfg = model.cfg
    pv, grid = preprocess(_images(0, [(50, 70), (100, 170)]), _vision_cfg(cfg))
    n_img = num_image_tokens(grid, cfg.vision.spatial_merge_size)
    assert n_img[0] != n_img[1]
    rng = np.random.default_rng(1)
    text = lambda n: [int(t) for t in rng.integers(1, 100, n)]
    rows = [text(2) + _image_span(cfg, int(n_img[0])) + text(3),
            text(1) + _image_span(cfg, int(n_img[1])) + text(1),
            text(5)]
    ids, mask = _left_pad(rows)
    return rows, ids, mask, pv, grid


def _max_len(ids):
    """One cache length for every test on the shared batch, so they share compiled prefill/decode programs."""
    return ids.shape[1] + 40


@nnx.jit
def _forward(model, ids, positions, mask, vision):
    return model(ids, positions=positions, attention_mask=mask, vision=vision)[0]


def _full_forward(model, rows_ids, pixel_values, grid):
    """No-cache forward of left-padded rows: logits [B, T, V] and the mask."""
    ids, mask = _left_pad(rows_ids)
    positions, _ = model.get_rope_index(ids, grid, mask)
    vision = prepare_vision_inputs(pixel_values, grid, model.cfg.vision)
    return np.asarray(_forward(model, ids, positions, mask, vision)), mask


def _completions(out):
    toks, m = np.asarray(out.tokens), np.asarray(out.mask)
    return [toks[i, : m[i].sum()].tolist() for i in range(toks.shape[0])]


def _check_against_full_forward(model, rows, pv, grid, out, temperature):
    """Every sampled token's log-prob (at `temperature`) and entropy (at 1) equal those of a full forward."""
    comps = _completions(out)
    full, mask = _full_forward(model, [r + c for r, c in zip(rows, comps)], pv, grid)
    T = full.shape[1]
    for i, c in enumerate(comps):
        # logits predicting completion token j sit at the position just before it
        at = np.arange(T - len(c) - 1, T - 1)
        step_logits = jnp.asarray(full[i, at])
        np.testing.assert_allclose(out.logprobs[i, : len(c)],
                                   lg.token_logprob(step_logits, jnp.asarray(c), temperature), atol=TOL)
        np.testing.assert_allclose(out.entropies[i, : len(c)], lg.entropy(step_logits), atol=TOL)
        if temperature == 0.0:
            allowed = full[i, at].copy()
            allowed[:, [model.cfg.image_token_id, model.cfg.video_token_id]] = -np.inf
            assert np.argmax(allowed, axis=-1).tolist() == c
    return comps


def test_greedy_equals_full_forward_argmax(tiny, batch):
    _, model = tiny
    rows, ids, mask, pv, grid = batch
    out, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=GREEDY,
                      max_len=_max_len(ids))
    assert np.asarray(out.lengths).tolist() == [N_NEW] * 3
    _check_against_full_forward(model, rows, pv, grid, out, 0.0)


def test_greedy_equals_transformers_generate(tiny, batch):
    torch = pytest.importorskip("torch")
    hf, model = tiny
    rows, ids, mask, pv, grid = batch
    out, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=GREEDY,
                      max_len=_max_len(ids))
    np.testing.assert_array_equal(np.asarray(out.tokens), _hf_greedy(torch, hf, model, ids, mask, pv, grid))


def _hf_greedy(torch, hf, model, ids, mask, pv, grid) -> np.ndarray:
    """transformers' greedy `generate` of N_NEW tokens per row (image tokens suppressed, as the sampler does)."""
    with torch.no_grad():
        ref = hf.generate(
            input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
            pixel_values=torch.tensor(pv), image_grid_thw=torch.tensor(grid),
            mm_token_type_ids=torch.tensor((ids == model.cfg.image_token_id).astype(np.int64)),
            do_sample=False, max_new_tokens=N_NEW, min_new_tokens=N_NEW, pad_token_id=0, eos_token_id=None,
            suppress_tokens=[model.cfg.image_token_id, model.cfg.video_token_id],
        )
    return ref[:, ids.shape[1]:].numpy()


def test_seeded_sampling_is_reproducible_and_scored_at_its_temperature(tiny, batch):
    _, model = tiny
    rows, ids, mask, pv, grid = batch
    cfg = SamplingConfig(temperature=1.3, top_p=0.95, top_k=40, max_new_tokens=N_NEW, seed=7)
    a, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=cfg, max_len=_max_len(ids))
    b, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=cfg, max_len=_max_len(ids))
    c, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=dataclasses.replace(cfg, seed=8),
                    max_len=_max_len(ids))
    for f in ("tokens", "logprobs", "entropies", "mask"):
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)))
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))
    _check_against_full_forward(model, rows, pv, grid, a, cfg.temperature)
    # every drawn token lies inside its step's top-k / top-p set
    comps = _completions(a)
    full, _ = _full_forward(model, [r + c for r, c in zip(rows, comps)], pv, grid)
    for i, c in enumerate(comps):
        at = np.arange(full.shape[1] - len(c) - 1, full.shape[1] - 1)
        allowed = np.isfinite(np.asarray(lg.filtered_logits(jnp.asarray(full[i, at]), cfg)))
        assert allowed[np.arange(len(c)), c].all()


def test_a_row_draws_by_its_global_id_not_its_batch_position(tiny, batch):
    """Rows decoded in another order and in another batch (under the same global ids) draw the same tokens; a row
    under another id draws others."""
    _, model = tiny
    rows, ids, mask, pv, grid = batch
    cfg = SamplingConfig(temperature=1.5, max_new_tokens=N_NEW, seed=4)
    a, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=cfg, max_len=_max_len(ids),
                    row_ids=[10, 11, 12])
    order = [2, 0, 1]  # row 2 (text only) first; the image rows keep their order, so pv and grid stay as they are
    b, _ = generate(model, ids[order], mask[order], pixel_values=pv, image_grid_thw=grid, cfg=cfg,
                    max_len=_max_len(ids), row_ids=[12, 10, 11])
    np.testing.assert_array_equal(np.asarray(b.tokens), np.asarray(a.tokens)[order])
    np.testing.assert_allclose(np.asarray(b.logprobs), np.asarray(a.logprobs)[order], atol=TOL)
    alone, _ = generate(model, ids[2:], mask[2:], cfg=cfg, max_len=_max_len(ids), row_ids=[12])
    np.testing.assert_array_equal(np.asarray(alone.tokens)[0], np.asarray(a.tokens)[2])
    other, _ = generate(model, ids[2:], mask[2:], cfg=cfg, max_len=_max_len(ids), row_ids=[13])
    assert not np.array_equal(np.asarray(other.tokens)[0], np.asarray(a.tokens)[2])
    with pytest.raises(ValueError, match="row_ids"):
        generate(model, ids, mask, cfg=cfg, row_ids=[1, 1, 2])


def test_stop_tokens_end_rows_and_mask(tiny, batch):
    _, model = tiny
    rows, ids, mask, pv, grid = batch
    free, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=GREEDY,
                      max_len=_max_len(ids))
    free_tokens = np.asarray(free.tokens)
    stop = int(free_tokens[0, 2])
    out, state = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid,
                          cfg=dataclasses.replace(GREEDY, stop_token_ids=(stop,)), max_len=_max_len(ids))
    tokens, m = np.asarray(out.tokens), np.asarray(out.mask)
    for i in range(3):
        hits = np.nonzero(free_tokens[i] == stop)[0]
        n = int(hits[0]) + 1 if len(hits) else N_NEW
        assert m[i].tolist() == [1] * n + [0] * (N_NEW - n)
        assert tokens[i, :n].tolist() == free_tokens[i, :n].tolist()
        assert (tokens[i, n:] == 0).all() and (np.asarray(out.logprobs)[i, n:] == 0).all()
        assert int(out.lengths[i]) == n
    assert bool(state.done[0])


def test_suppressed_ids_are_never_drawn_but_logprobs_stay_full_vocabulary(tiny, batch):
    _, model = tiny
    rows, ids, mask, pv, grid = batch
    free, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=GREEDY, max_len=_max_len(ids))
    banned = int(np.asarray(free.tokens)[0, 0])
    out, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, max_len=_max_len(ids),
                      cfg=dataclasses.replace(GREEDY, suppress_token_ids=(banned,)))
    tokens = np.asarray(out.tokens)
    assert (tokens != banned).all() and (tokens != model.cfg.image_token_id).all()
    _check_against_full_forward(model, rows, pv, grid, out, 1.0)


def test_decode_compiles_once_for_all_steps_and_calls(tiny, batch):
    """One compiled while-loop serves every step: after a first call, decoding another prompt with another seed and
    other stop ids compiles nothing, and the decode function's compile cache holds no new entry."""
    _, model = tiny
    rows, ids, mask, pv, grid = batch
    jax.block_until_ready(generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=GREEDY,
                                   max_len=_max_len(ids)))
    size = sampler_mod._decode_jit._cache_size()
    compiles = []

    def listener(event, *args, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        other = np.where((mask > 0) & (ids < 100), (ids * 7 + 3) % 100, ids)
        out, _ = generate(model, other, mask, pixel_values=pv * 0.5, image_grid_thw=grid, max_len=_max_len(ids),
                          cfg=dataclasses.replace(GREEDY, seed=3, stop_token_ids=(5,)))
        jax.block_until_ready(out)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    assert sampler_mod._decode_jit._cache_size() == size


def test_extend_equals_decoding_from_the_concatenated_prompt(tiny, batch):
    """Decode to a stop token, append tool output (ragged, one row with an image), decode again: the same as a fresh
    prefill of prompt + completion + tool output followed by decoding."""
    _, model = tiny
    cfg_m = model.cfg
    rows, ids, mask, pv, grid = batch
    free, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=GREEDY,
                      max_len=_max_len(ids))
    stop = int(np.asarray(free.tokens)[1, 1])
    turn1 = dataclasses.replace(GREEDY, stop_token_ids=(stop,))
    state = prefill(model, ids, mask, pixel_values=pv, image_grid_thw=grid, max_len=_max_len(ids))
    state, out1 = decode(model, state, turn1)
    comps1 = _completions(out1)

    tool_pv, tool_grid = preprocess(_images(5, [(60, 60)]), _vision_cfg(cfg_m))
    n_tool = int(num_image_tokens(tool_grid, cfg_m.vision.spatial_merge_size)[0])
    tools = [[11, 12] + _image_span(cfg_m, n_tool) + [13], [21, 22, 23], []]  # row 2 gets nothing: stays as it is
    T_ext = max(len(t) for t in tools)
    ext = np.zeros((3, T_ext), np.int32)
    ext_mask = np.zeros((3, T_ext), np.int32)
    for i, t in enumerate(tools):
        ext[i, : len(t)] = t  # right-padded: padding may sit anywhere
        ext_mask[i, : len(t)] = 1
    was_done = np.asarray(state.done).copy()
    state = extend(model, state, ext, ext_mask, pixel_values=tool_pv, image_grid_thw=tool_grid)
    assert np.asarray(state.done).tolist() == [False, False, bool(was_done[2])]
    state, out2 = decode(model, state, GREEDY)

    full_rows = [r + c + t for r, c, t in zip(rows, comps1, tools)]
    all_pv = np.concatenate([pv[: int(grid[0].prod())], tool_pv, pv[int(grid[0].prod()):]])
    all_grid = np.concatenate([grid[:1], tool_grid, grid[1:]])
    fids, fmask = _left_pad(full_rows)
    fresh = prefill(model, fids, fmask, pixel_values=all_pv, image_grid_thw=all_grid, max_len=_max_len(ids))
    fresh = fresh.replace(done=state.done)  # row 2 (if it stopped in turn 1) stays stopped in both
    fresh, ref = decode(model, fresh, GREEDY)
    np.testing.assert_array_equal(np.asarray(out2.mask), np.asarray(ref.mask))
    np.testing.assert_array_equal(np.asarray(out2.tokens), np.asarray(ref.tokens))
    np.testing.assert_allclose(np.asarray(out2.logprobs), np.asarray(ref.logprobs), atol=TOL)
    np.testing.assert_allclose(np.asarray(out2.entropies), np.asarray(ref.entropies), atol=TOL)
    np.testing.assert_array_equal(np.asarray(state.num_real), np.asarray(fresh.num_real))
    np.testing.assert_array_equal(np.asarray(state.num_real + state.rope_deltas),
                                  np.asarray(fresh.num_real + fresh.rope_deltas))


def test_cache_overflow_is_a_clear_error(tiny, batch):
    _, model = tiny
    _, ids, mask, pv, grid = batch
    state = prefill(model, ids, mask, pixel_values=pv, image_grid_thw=grid, max_len=_max_len(ids))
    with pytest.raises(ValueError, match="KV cache overflow"):
        decode(model, state, dataclasses.replace(GREEDY, max_new_tokens=41))
    with pytest.raises(ValueError, match="KV cache overflow"):
        extend(model, state, np.ones((3, 41), np.int32))
    with pytest.raises(ValueError, match="tokens must be"):
        extend(model, state, np.ones((2, 1), np.int32))


def test_untrained_init_model_runs_without_images():
    """A text-only batch through a freshly initialised model (no checkpoint): shapes and masks are consistent."""
    model = Qwen3VL(ModelConfig.tiny(vocab_size=64), rngs=nnx.Rngs(1))
    ids, mask = _left_pad([[1, 2, 3], [4, 5, 6, 7, 8]])
    out, state = generate(model, ids, mask, cfg=SamplingConfig(temperature=1.0, max_new_tokens=3, seed=1))
    assert out.tokens.shape == (2, 3) and np.asarray(out.mask).sum() == 6
    assert int(state.cache_index) == ids.shape[1] + 3
    assert np.isfinite(np.asarray(out.logprobs)).all() and np.isfinite(np.asarray(out.entropies)).all()
