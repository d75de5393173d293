"""Samples with several images or a video through the whole job: multi-image prompts' ids, patches and logits equal
transformers' Qwen3-VL; a batch mixing one image, several images and a video keeps each row's items in order
through rollout repetition; ProSR's blank counterfactual blanks every image and every frame; one SFT step and one
GRPO step run on such a batch and move the weights; every method's reward scores such rollouts as its torch
reference does."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch
from test_model_utils import forward, max_err_real
from test_video import IMG_CFG, THINK_BOXES, build_messages, hf_processor, models, multi_image_sample, video_sample

from spatial_jax.data import pipeline as P
from spatial_jax.data.tokenizer import build_tokenizer
from spatial_jax.rollout.completions import repeat_batch

__all__ = ["models"]  # the shared tiny transformers model, as a fixture
TOL = 1e-4
# the tiny job, no evaluation, short completions
TINY = ["rl.steps=1", "rl.sampling.max_new_tokens=4", "eval.after_rl=false", "eval.after_sft=false",
        "data.train=synthetic:train:8", "data.eval=synthetic:heldout:4", "tensorboard=false", "progress=false",
        "data.bucket_lengths=[512,1024]"]


def tiny(tmp_path, *extra):
    from spatial_jax import config as C
    from spatial_jax.rl.config import TrainConfig

    return C.load(TrainConfig, None, [f"run_dir={tmp_path}", *TINY, *extra])


def test_multi_image_prompt_ids_and_logits_equal_transformers(models):
    """Three images of three sizes in one prompt: ids (one block per image, in order), patches and logits equal
    transformers' processor and model (max abs error < 1e-4)."""
    tok, hf, ours = models
    sample = multi_image_sample()
    ex = P.encode_sample(sample, tok, THINK_BOXES, "rl", IMG_CFG)
    text = tok.hf.apply_chat_template(build_messages(sample, THINK_BOXES), tokenize=False,
                                      add_generation_prompt=True, enable_thinking=True)
    ref = hf_processor(tok, P.video_config(IMG_CFG, None), IMG_CFG)(text=[text], images=list(sample.images),
                                                                      return_tensors="pt")
    np.testing.assert_array_equal(ex.input_ids, ref["input_ids"][0].numpy())
    np.testing.assert_array_equal(ex.image_grid_thw, ref["image_grid_thw"].numpy())
    np.testing.assert_allclose(ex.pixel_values, ref["pixel_values"].numpy(), atol=1e-6)
    assert len(ex.image_grid_thw) == 3 and ex.sample.image_size == (32, 24)  # the first image's (W, H)
    with torch.no_grad():
        want = hf(**ref).logits.numpy()
    ids, mask = ex.input_ids[None], np.ones((1, len(ex.input_ids)), np.int32)
    got = forward(ours, ids, mask, ex.pixel_values, ex.image_grid_thw)
    assert max_err_real(got, want, mask) < TOL


def _mixed_batch(tok, image_cfg, mode="rl"):
    rng = np.random.default_rng(3)
    single = dataclasses.replace(multi_image_sample("s0"), images=(), image=rng.integers(0, 256, (30, 20, 3),
                                                                                      dtype=np.uint8))
    source = [multi_image_sample("m0"), video_sample("v0"), single]
    return P.make_dataset(source, tok, P.DataConfig(bucket_lengths=(512, 1024)), THINK_BOXES, 3, mode=mode,
                          shuffle=False, image_cfg=image_cfg)[0]


def test_mixed_batch_keeps_each_rows_items():
    """Rows of 3 images, a 7-frame video (2 frame groups) and 1 image: items and patches stay with their row when
    the rollouts repeat each prompt."""
    tok = build_tokenizer()
    batch = _mixed_batch(tok, IMG_CFG)
    np.testing.assert_array_equal(batch.image_counts, [3, 2, 1])
    assert batch.pixel_values.shape[0] == int(np.prod(batch.image_grid_thw, axis=-1).sum())
    ids, _, pixels, grids, counts, _ = repeat_batch(batch, 2)
    np.testing.assert_array_equal(counts, [3, 3, 2, 2, 1, 1])
    items = np.concatenate([[0], np.cumsum(batch.image_counts)])
    patches = np.concatenate([[0], np.cumsum(np.prod(batch.image_grid_thw, axis=-1))])
    row_pixels = [batch.pixel_values[patches[items[i]]:patches[items[i + 1]]] for i in range(3)]
    np.testing.assert_array_equal(pixels, np.concatenate([p for p in row_pixels for _ in range(2)]))
    np.testing.assert_array_equal(grids, np.concatenate([batch.image_grid_thw[items[i]:items[i + 1]]
                                                         for i in range(3) for _ in range(2)]))
    assert (ids == tok.video_pad_id).sum() == 2 * (batch.input_ids == tok.video_pad_id).sum() > 0


def test_blank_batch_blanks_every_image_and_frame():
    """ProSR's counterfactual: every image and every sampled frame becomes its own mean colour (so each item's
    patches are constant per channel and temporal slot), with the same grids and prompts."""
    batch = _mixed_batch(build_tokenizer(), IMG_CFG)
    blank = P.blank_batch(batch, "mean", IMG_CFG)
    np.testing.assert_array_equal(blank.image_grid_thw, batch.image_grid_thw)
    np.testing.assert_array_equal(blank.input_ids, batch.input_ids)
    starts = np.concatenate([[0], np.cumsum(np.prod(batch.image_grid_thw, axis=-1))])
    ps, tp = IMG_CFG.patch_size, IMG_CFG.temporal_patch_size
    for k in range(len(batch.image_grid_thw)):
        item = blank.pixel_values[starts[k]:starts[k + 1]].reshape(-1, 3, tp, ps * ps)
        assert np.ptp(item, axis=(0, 3)).max() == 0  # one value per channel and frame
        assert not np.array_equal(item, batch.pixel_values[starts[k]:starts[k + 1]].reshape(item.shape))
    # the video's two frames of a temporal patch are blanked separately: their mean colours differ
    video_item = blank.pixel_values[starts[3]:starts[4]].reshape(-1, 3, tp, ps * ps)
    assert not np.array_equal(video_item[0, :, 0, 0], video_item[0, :, 1, 0])


def _params(job):
    return jax.tree.map(np.asarray, job.trainable)


@pytest.mark.slow
def test_sft_and_grpo_steps_on_multi_image_and_video(tmp_path):
    """The tiny job: one SFT step on the mixed batch's reference completions and one GRPO update on its rollouts
    (rows of 3, 3, 2, 2, 1, 1 items), each finite and moving the weights. (One micro-batch: each micro-batch of
    differently sized images compiles its own update; ProSR's blank rollouts are blank_batch's, tested above.)"""
    from spatial_jax.rl.optim import make_optimizer
    from spatial_jax.rl.train import Trainer

    job = Trainer(tiny(tmp_path, "method=spatialcore", "sft.steps=1", "rl.optim.warmup_ratio=0.0",
                       "sft.optim.warmup_ratio=0.0", "rl.prompts_per_step=3", "rl.group_size=2"))
    start = _params(job)
    sft = _mixed_batch(job.tok, job.policy.image_cfg, mode="sft")
    assert sft.loss_mask.sum() > 0
    tx = make_optimizer(job.optim_config("sft"))
    metrics, _ = job.learner.sft_step(0, sft, tx, tx.init(job.trainable))
    assert np.isfinite(float(metrics["loss"]))
    after_sft = _params(job)
    assert max(jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), start, after_sft))) > 0

    batch = _mixed_batch(job.tok, job.policy.image_cfg)
    sampling = dataclasses.replace(job.cfg.rl.sampling, stop_token_ids=(job.tok.im_end_id,),
                                   pad_token_id=job.tok.pad_id, max_new_tokens=4)
    got = job.experience.collect(0, batch, sampling)
    assert len(got.rollouts) == 6
    assert all(np.isfinite(v) for s in got.scores for v in s.values())
    np.testing.assert_array_equal(got.completions.image_counts, [3, 3, 2, 2, 1, 1])
    tx = make_optimizer(job.optim_config("rl"))
    adv = np.linspace(-1.0, 1.0, 6).astype(np.float32)
    _, out = job.learner.update(0, got.completions, adv, tx, 1, tx.init(job.trainable), 1.0)
    assert np.isfinite(out["loss"])
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), after_sft, _params(job)))
    assert max(moved) > 0


@pytest.mark.parametrize("name", ["multi", "video"])
def test_every_methods_reward_scores_multi_image_and_video_rollouts(name):
    """Each method's reward on a rollout of a multi-image / video sample (its reference completion; ProSR with a
    blank rollout): finite, and equal to its torch reference scorer. Boxes and the stated image size refer to the
    first image (first sampled frame)."""
    from spatial_jax.methods import METHODS
    from spatial_jax.records import BlankRollout

    sample = multi_image_sample() if name == "multi" else video_sample()
    sample = P.encode_sample(sample, build_tokenizer(), THINK_BOXES, "rl", IMG_CFG).sample  # fills image_size
    assert sample.image_size == ((32, 24) if name == "multi" else (28, 20))
    for method in (m for m in METHODS.values() if not m.name.startswith("dense_")):
        rollouts = [sample.to_rollout(sample.reference[method.prompt.reference_key], rollout_id=f"r{k}")
                    for k in range(2)]
        if method.needs_blank:
            rollouts = [dataclasses.replace(r, blank=BlankRollout("left</think>B")) for r in rollouts]
        cfg = method.config()
        got, want = method.score_batch(rollouts, cfg), method.reference_score_batch(rollouts, cfg)
        for g, w in zip(got, want):
            assert all(np.isfinite(v) for v in g.values()), (method.name, g)
            for key in g:
                assert g[key] == pytest.approx(w[key], abs=1e-5), (method.name, key)
