"""The shared-prefix RL step: the G rollouts of a prompt run it through the decoder once and their completions
attend to its keys. Against the whole-row forward on the same rows: log-probs and entropies 2e-6, one train step's
loss 1e-6 and every weight after an SGD step 1e-6 (float32), unrolled and scanned, with and without remat,
DeepStack image features in the prompts, left-padded prompts of two lengths and right-padded completions. The
attention mask's causal offset equals an explicit mask on the XLA path and in splash (Pallas interpreter); rows
that do not share their prompt, or a target holding an image token, are refused on the host."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from spatial_jax.models import ModelConfig, Qwen3VL
from spatial_jax.models.attention import AttentionMask, attention, query_blocks
from spatial_jax.rl import step as st
from spatial_jax.rl.losses import LossConfig

G = 4
VOCAB = 256


def config(**kw) -> ModelConfig:
    return ModelConfig.tiny(VOCAB, num_hidden_layers=3).replace(**kw)


def rows(cfg: ModelConfig, seed: int = 0):
    """Two prompts (a 16-patch and a 12-patch image, different left padding) repeated G times, and G completions
    each, right-padded to different lengths."""
    rng = np.random.default_rng(seed)
    v = cfg.vision
    grids = np.array([[1, 4, 4], [1, 2, 6]])
    merged = grids.prod(-1) // v.spatial_merge_size**2
    img, start, end = cfg.image_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id
    prompts = [[5, start] + [img] * merged[0] + [end, 7, 8], [9, start] + [img] * merged[1] + [end, 11, 12, 13, 14]]
    P = max(map(len, prompts))
    ids, mask = np.zeros((2, P), np.int32), np.zeros((2, P), np.int32)
    for b, row in enumerate(prompts):
        ids[b, P - len(row):], mask[b, P - len(row):] = row, 1
    dim = v.in_channels * v.temporal_patch_size * v.patch_size**2
    pixels = rng.standard_normal((int(grids.prod(-1).sum()), dim)).astype(np.float32)
    sizes = grids.prod(-1)
    rep_pixels = np.concatenate([pixels[: sizes[0]]] * G + [pixels[sizes[0]:]] * G)
    N = 7
    targets = rng.integers(0, VOCAB - 4, size=(2 * G, N)).astype(np.int32)
    lengths = rng.integers(2, N + 1, size=2 * G)
    tmask = (np.arange(N)[None] < lengths[:, None]).astype(np.int32)
    return dict(prompt_ids=np.repeat(ids, G, 0), prompt_mask=np.repeat(mask, G, 0), targets=targets,
                target_mask=tmask, pixel_values=rep_pixels, image_grid_thw=np.repeat(grids, G, 0),
                row_group=np.arange(2 * G) // G, row_image_counts=np.ones(2 * G, np.int32))


def seq_pair(cfg, data):
    whole = st.make_seq_batch(cfg, **data)
    shared = st.make_seq_batch(cfg, **data, group=G)
    return whole, shared


@pytest.mark.parametrize("scan, remat", [(False, "none"), (True, "none"), (False, "full"), (True, "dots")])
def test_logprobs_and_entropy_equal_the_whole_row_forward(scan, remat):
    cfg = config(scan_layers=scan, remat_policy=remat)
    model = Qwen3VL(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    whole, shared = seq_pair(cfg, rows(cfg))
    fn = jax.jit(lambda p, seq: st.target_logprobs(nnx.merge(graphdef, p), seq, 0.7))
    (lp1, ent1), (lp2, ent2) = fn(params, whole), fn(params, shared)
    real = np.asarray(whole.target_mask) > 0
    assert np.isfinite(np.asarray(lp2)).all() and np.isfinite(np.asarray(ent2)).all()
    np.testing.assert_allclose(np.asarray(lp2)[real], np.asarray(lp1)[real], atol=2e-6, rtol=2e-6)
    np.testing.assert_allclose(np.asarray(ent2)[real], np.asarray(ent1)[real], atol=2e-6, rtol=2e-6)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_one_update_equals_the_whole_row_update(scan):
    cfg = config(scan_layers=scan, remat_policy="full")
    data = rows(cfg, seed=1)
    whole, shared = seq_pair(cfg, data)
    rng = np.random.default_rng(3)
    R, N = data["targets"].shape
    old = jnp.asarray(rng.normal(-2.0, 0.3, (R, N)), jnp.float32)
    adv = jnp.asarray(rng.standard_normal(R), jnp.float32)
    tx = optax.sgd(0.1)  # the weights move by the gradient itself (Adam would rescale a near-zero one's rounding)
    loss_cfg = LossConfig(kl_coef=0.0)
    results = []
    for seq in (whole, shared):
        model = Qwen3VL(cfg, rngs=nnx.Rngs(0))
        graphdef, trainable, frozen = nnx.split(model, nnx.Param, ...)
        data_ = st.RLData(seq=seq, old_logp=old, ref_logp=jnp.zeros_like(old), advantages=adv,
                          normalizer=jnp.asarray(float(np.asarray(seq.target_mask).sum())))
        new, _, loss, metrics, _ = st.rl_update(graphdef, trainable, frozen, tx.init(trainable), data_, loss_cfg, 1.0,
                                             tx, None)
        results.append((new, float(loss), float(metrics["grad_norm"])))
    (w1, l1, g1), (w2, l2, g2) = results
    assert l1 != 0 and g1 > 0  # a real update, not a zero-gradient one
    np.testing.assert_allclose(l2, l1, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(g2, g1, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(w1), jax.tree.leaves(w2), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-6)


def _offset_case(seed, B=3, T=9, P=6, H=4, Hkv=2, D=8):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((B, P + T, Hkv, D)), jnp.float32) for _ in range(2))
    pre = (np.arange(P)[None] >= rng.integers(0, P, size=(B, 1))).astype(np.int32)  # left padding
    suf = (np.arange(T)[None] < rng.integers(1, T + 1, size=(B, 1))).astype(np.int32)  # right padding
    kv_seg = np.concatenate([pre, suf], 1)
    dense = (kv_seg[:, None, :] > 0) & (np.arange(P + T)[None, None, :] <= np.arange(T)[None, :, None] + P)
    mask = AttentionMask(segment_ids=jnp.asarray(suf), kv_segment_ids=jnp.asarray(kv_seg), causal=True,
                         causal_offset=P)
    return q, k, v, mask, AttentionMask(dense=jnp.asarray(dense)), suf > 0


@pytest.mark.parametrize("impl, chunk", [("xla", 0), ("xla", 4), ("splash", 0)])
def test_causal_offset_equals_the_explicit_mask(impl, chunk):
    q, k, v, mask, dense, real = _offset_case(0)
    want = attention(q, k, v, dense, scale=0.3, impl="xla")
    got = attention(q, k, v, mask, scale=0.3, impl=impl, chunk=chunk)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-6, rtol=2e-6)


def test_query_blocks_are_balanced_and_equal_the_unchunked_path():
    # at most `chunk` queries a block, as few blocks as that allows, padding under 8 queries a block (the main job's
    # 192 completion tokens with chunk 128: two blocks of 96, not 2 x 128 with a third of the work on padding)
    for T in (1, 7, 9, 40, 192, 224, 416, 1000):
        for chunk in (1, 4, 32, 128, 1024):
            n, size = query_blocks(T, chunk)
            assert size <= chunk and n == -(-T // chunk) and n * size >= T and n * size - T < 8 * n
    assert query_blocks(192, 128) == (2, 96)
    q, k, v, mask, dense, real = _offset_case(2, T=40)  # chunk 32: two blocks of 24
    want = attention(q, k, v, dense, scale=0.3, impl="xla")
    got = attention(q, k, v, mask, scale=0.3, impl="xla", chunk=32)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-6, rtol=2e-6)


def test_causal_offset_is_checked():
    q, k, v, mask, _, _ = _offset_case(1)
    with pytest.raises(ValueError, match="T \\+ causal_offset keys"):
        attention(q, k[:, 1:], v[:, 1:], mask.replace(kv_segment_ids=mask.kv_segment_ids[:, 1:]), scale=0.3)
    with pytest.raises(ValueError, match="causal mask only"):
        attention(q, k, v, AttentionMask(segment_ids=mask.segment_ids, kv_segment_ids=mask.kv_segment_ids,
                                         causal_offset=6), scale=0.3)
    with pytest.raises(ValueError, match="needs a CUDA GPU|takes no causal_offset"):
        attention(q, k, v, mask, scale=0.3, impl="cudnn")


def test_rows_that_do_not_share_their_prompt_are_refused():
    cfg = config()
    data = rows(cfg)
    with pytest.raises(ValueError, match="whole groups of 3"):
        st.make_seq_batch(cfg, **data, group=3)
    bad = dict(data, prompt_ids=data["prompt_ids"].copy())
    bad["prompt_ids"][G + 1, -1] = 3
    with pytest.raises(ValueError, match=f"rows {G}..{2 * G - 1} differ in their prompt ids"):
        st.make_seq_batch(cfg, **bad, group=G)
    tool = dict(data, targets=data["targets"].copy())
    tool["targets"][2, 1] = cfg.image_token_id
    with pytest.raises(ValueError, match="image token"):
        st.make_seq_batch(cfg, **tool, group=G)
