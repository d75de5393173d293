"""Qwen2.5-VL videos through the data layer, rollouts and the update: a video is one [t, h, w] item whose temporal
patches sit tokens_per_second * second_per_grid apart, second_per_grid being the clip's seconds per temporal patch.
The pipeline's patches, grid and second_per_grid_ts equal transformers' Qwen2_5_VLProcessor; the M-RoPE positions
every path computes from a data-layer batch (prompt index, paged engine, static sampler, RL update, SFT) equal
transformers' get_rope_index; our logits on that batch equal transformers' (float32, 1e-5); a GRPO update on a
tiny Qwen2.5-VL checkpoint with rollouts of a video prompt runs with the value reaching its position index.

The clips are chosen so that second_per_grid moves the positions: 8 frames at 1 fps are all kept (2 s a temporal
patch: times 0, 4, 8, 12 at 2 tokens a second, where 1 s would give 0, 2, 4, 6), 6 frames at 0.5 fps give 4 s."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_model_archs import hf_model
from test_model_utils import forward, max_err_real
from test_video import choice_sample, clip, qwen2_videos_class

from spatial_jax.data import pipeline as P
from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.data.prompts import THINK_BOXES, build_messages
from spatial_jax.data.sample import Video
from spatial_jax.data.tokenizer import build_tokenizer
from spatial_jax.models import rope_index
from spatial_jax.models.registry import QWEN2_5_IMAGES

TOL = 1e-5
NORM = dict(image_mean=QWEN2_5_IMAGES["image_mean"], image_std=QWEN2_5_IMAGES["image_std"])
IMG25 = ImageProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=32 * 32, **NORM,
                              video_timing="second_per_grid")
# the video processor the image config implies, with a tiny per-frame budget: 20 x 28 frames -> 16 x 32
VID25 = dataclasses.replace(P.video_config(IMG25, None), min_pixels=64, max_pixels=24 * 24)


def video_sample(sid: str, n: int, fps: float, seed: int = 0):
    return choice_sample(sid, video=Video(frames=tuple(clip(n, seed=seed)), fps=fps))


def hf_processor(tok, cfg):
    """transformers' Qwen2_5_VLProcessor over the project tokenizer, the PIL image processor and its video
    processor (Qwen2VLVideoProcessor, sampling frames itself), torchvision's ops done by the torch calls it makes."""
    from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    Videos = qwen2_videos_class()

    class Processor(Qwen2_5_VLProcessor):
        def check_argument_for_proper_class(self, name, arg):  # looks the video class up in torchvision's registry
            return None

    size = {"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels}
    layout = dict(patch_size=cfg.patch_size, merge_size=cfg.merge_size, temporal_patch_size=cfg.temporal_patch_size,
                  image_mean=list(cfg.image_mean), image_std=list(cfg.image_std))
    videos = Videos(size=size, **layout, fps=cfg.fps, min_frames=cfg.min_frames, max_frames=cfg.max_frames,
                    do_sample_frames=True, cap_pixels_per_frame=cfg.cap_pixels_per_frame,
                    max_video_tokens=cfg.max_video_tokens)
    images = Qwen2VLImageProcessorPil(size={"shortest_edge": IMG25.min_pixels, "longest_edge": IMG25.max_pixels},
                                      **layout)
    return Processor(image_processor=images, tokenizer=tok.hf, video_processor=videos)


SECONDS = {(8, 1.0): 2.0, (6, 0.5): 4.0, (9, 4.0): 1.125, (45, 30.0): 0.75}  # second_per_grid of (frames, fps)


@pytest.mark.parametrize("n, fps, cap", [(8, 1.0, False), (6, 0.5, False), (9, 4.0, False), (45, 30.0, True)])
def test_video_processing_equals_qwen2_5_vl_processor(n, fps, cap):
    """Prompt ids (one vision block of t * h * w / 4 pads, no timestamps), pixel values (bit for bit), the grid as
    one item and second_per_grid_ts equal transformers' processor sampling the clip itself (SECONDS): every frame
    kept, a 2.25-frame stride, and 4 frames of a 1.5 s clip under the per-frame cap."""
    tok = build_tokenizer()
    cfg = dataclasses.replace(VID25, cap_pixels_per_frame=cap, max_video_tokens=10)
    sample = video_sample("v", n, fps, seed=n)
    ex = P.encode_sample(sample, tok, THINK_BOXES, "rl", IMG25, video_cfg=cfg)
    text = tok.hf.apply_chat_template(build_messages(sample, THINK_BOXES), tokenize=False,
                                      add_generation_prompt=True, enable_thinking=True)
    ref = hf_processor(tok, cfg)(text=[text], videos=[clip(n, seed=n)], return_tensors="pt", videos_kwargs=dict(
        video_metadata=[{"fps": fps, "total_num_frames": n}], return_metadata=True))
    np.testing.assert_array_equal(ex.input_ids, ref["input_ids"][0].numpy())
    np.testing.assert_array_equal(ex.pixel_values, ref["pixel_values_videos"].numpy())
    np.testing.assert_array_equal(ex.image_grid_thw, ref["video_grid_thw"].numpy())
    np.testing.assert_array_equal(ex.second_per_grid, np.asarray(ref["second_per_grid_ts"], np.float32))
    assert ex.second_per_grid.tolist() == [SECONDS[n, fps]]


def test_listed_frames_take_the_clip_up_to_the_last():
    """A row's own frames (frame_indices) are kept as listed, padded to whole temporal patches, and timed as
    transformers times the same frames sampled from a clip ending at the last of them: what uniform sampling over a
    whole clip (an evaluation protocol's 7 frames, benchmarks.convert.sampled_video) lists."""
    from transformers.video_utils import VideoMetadata

    for total, fps in ((100, 24.0), (37, 2.0)):
        idx = np.linspace(0, total - 1, 7, dtype=int)
        meta = VideoMetadata(total_num_frames=total, fps=fps, frames_indices=idx.tolist())
        frames = tuple(clip(7, seed=total))
        sample = choice_sample("v", video=Video(frames=frames, fps=fps, frame_indices=tuple(idx.tolist())))
        ex = P.encode_sample(sample, build_tokenizer(), THINK_BOXES, "rl", IMG25, video_cfg=VID25)
        assert ex.image_grid_thw.tolist() == [[4, 4, 8]]  # 7 frames, the last repeated: 4 temporal patches
        assert ex.second_per_grid.tolist() == [np.float32(2 / meta.sampled_fps)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(tokenizer, transformers' tiny Qwen2.5-VL with the tokenizer's ids, ours loaded from it, a data-layer batch
    of an image row and two video rows, the same prompts with their SFT completions, the checkpoint's folder)."""
    from spatial_jax.models.hf_io import from_pretrained

    tok = build_tokenizer()
    hf = hf_model("qwen2_5_vl", vocab_size=tok.vocab_size, ids=tok.model_token_ids())
    path = tmp_path_factory.mktemp("qwen2_5_vl")
    hf.save_pretrained(path)
    tok.save(path)
    rng = np.random.default_rng(3)
    source = [choice_sample("i", image=rng.integers(0, 256, (30, 20, 3), dtype=np.uint8)),
              video_sample("v8", 8, 1.0), video_sample("v6", 6, 0.5, seed=1)]
    data = P.DataConfig(bucket_lengths=(256, 512))
    batches = [P.make_dataset(source, tok, data, THINK_BOXES, 3, mode=mode, shuffle=False, image_cfg=IMG25,
                              video_cfg=VID25)[0] for mode in ("rl", "sft")]
    return tok, hf, from_pretrained(path), *batches, path


def hf_inputs(ours, batch):
    """transformers' inputs of a data-layer batch: the image rows' items as images, the video rows' as videos with
    the second_per_grid_ts transformers' processor gives their clips (SECONDS)."""
    cfg = ours.cfg
    ids, mask = batch.input_ids.astype(np.int64), batch.attention_mask.astype(np.int64)
    types = np.where(ids == cfg.image_token_id, 1, np.where(ids == cfg.video_token_id, 2, 0)) * mask
    is_video = np.repeat([r.video is not None for r in batch.records], batch.image_counts)
    seconds = [SECONDS[len(r.video.frames), r.video.fps] for r in batch.records if r.video is not None]
    starts = np.concatenate([[0], np.cumsum(np.prod(batch.image_grid_thw, axis=-1))])
    pix = [batch.pixel_values[starts[k]:starts[k + 1]] for k in range(len(is_video))]
    t = lambda x: torch.from_numpy(np.asarray(x))
    return dict(
        input_ids=t(ids), attention_mask=t(mask), mm_token_type_ids=t(types),
        pixel_values=t(np.concatenate([p for p, v in zip(pix, is_video) if not v])),
        image_grid_thw=t(batch.image_grid_thw[~is_video].astype(np.int64)),
        pixel_values_videos=t(np.concatenate([p for p, v in zip(pix, is_video) if v])),
        video_grid_thw=t(batch.image_grid_thw[is_video].astype(np.int64)),
        second_per_grid_ts=t(np.asarray(seconds, np.float32)))


def hf_positions(hf, inputs) -> np.ndarray:
    keys = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts", "attention_mask")
    with torch.no_grad():
        pos, _ = hf.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                         **{k: inputs[k] for k in keys})
    return pos.numpy()


def test_video_positions_of_every_path_equal_transformers(setup, monkeypatch):
    """The positions of the batch's prompts from the prompt index, the paged engine's prefill and the static
    sampler's, of prompt + completion rows in the RL update (make_seq_batch) and of the SFT rows equal transformers'
    get_rope_index given second_per_grid_ts."""
    from spatial_jax.rl import step as st
    from spatial_jax.rl.learner import full_seq_batch
    from spatial_jax.rollout import SamplingConfig, sampler
    from spatial_jax.rollout.engine import Engine, split_rows

    tok, hf, ours, batch, sft, _ = setup
    np.testing.assert_array_equal(batch.image_counts, [1, 1, 1])
    assert batch.second_per_grid.tolist() == [0.0, 2.0, 4.0]
    mask = batch.attention_mask > 0
    want = hf_positions(hf, hf_inputs(ours, batch))
    got, _ = rope_index(ours.cfg, batch.input_ids, batch.image_grid_thw, batch.attention_mask, batch.second_per_grid)
    np.testing.assert_array_equal(got[:, mask], want[:, mask])
    one_second, _ = rope_index(ours.cfg, batch.input_ids, batch.image_grid_thw, batch.attention_mask)
    assert not np.array_equal(one_second[:, mask], want[:, mask])  # the clips' second_per_grid moves positions

    requests = split_rows(batch.input_ids, batch.attention_mask, batch.pixel_values, batch.image_grid_thw,
                          batch.image_counts, second_per_grid=batch.second_per_grid)
    engine = Engine(ours, SamplingConfig(max_new_tokens=2), slots=1, max_len=batch.input_ids.shape[1] + 2)
    for r, req in enumerate(requests):
        pos = engine.widest_prefill_inputs(req)[4][:, 0, : len(req.tokens)]
        np.testing.assert_array_equal(pos, want[:, r, mask[r]])

    seen = {}
    monkeypatch.setattr(sampler, "_extend_jit", lambda *a: seen.setdefault("positions", np.asarray(a[5])))
    sampler.prefill(ours, batch.input_ids, batch.attention_mask, pixel_values=batch.pixel_values,
                    image_grid_thw=batch.image_grid_thw, max_len=batch.input_ids.shape[1] + 2,
                    second_per_grid=batch.second_per_grid)
    np.testing.assert_array_equal(seen["positions"][:, mask], want[:, mask])

    targets = np.full((3, 4), tok.pad_id, np.int32)
    targets[:, :2] = 11
    seq = st.make_seq_batch(ours.cfg, batch.input_ids, batch.attention_mask, targets, (targets != tok.pad_id),
                            batch.pixel_values, batch.image_grid_thw, second_per_grid=batch.second_per_grid)
    P_ = batch.input_ids.shape[1]
    np.testing.assert_array_equal(np.asarray(seq.positions)[:, :, :P_][:, mask], want[:, mask])
    np.testing.assert_array_equal(np.asarray(seq.positions)[:, :, P_:P_ + 2],
                                  want[:, :, -1:] + 1 + np.arange(2))

    sft_mask = sft.attention_mask > 0
    sft_want = hf_positions(hf, hf_inputs(ours, sft))
    sft_pos = np.asarray(full_seq_batch(ours.cfg, sft).positions)
    np.testing.assert_array_equal(sft_pos[:, sft_mask], sft_want[:, sft_mask])


def test_video_logits_equal_transformers(setup):
    """Our Flax Qwen2.5-VL on the data-layer batch (an image row and two video rows, left-padded) gives
    transformers' logits over the real tokens (float32, < 1e-5)."""
    _, hf, ours, batch, _, _ = setup
    inputs = hf_inputs(ours, batch)
    pos = hf_positions(hf, inputs)
    with torch.no_grad():
        want = hf(**inputs, position_ids=torch.from_numpy(pos)).logits.numpy()
    positions, _ = rope_index(ours.cfg, batch.input_ids, batch.image_grid_thw, batch.attention_mask,
                              batch.second_per_grid)
    got = forward(ours, batch.input_ids, batch.attention_mask, batch.pixel_values, batch.image_grid_thw,
                  positions=positions)
    assert max_err_real(got, want, batch.attention_mask) < TOL


def test_grpo_update_on_a_qwen2_5_vl_video(setup, tmp_path, monkeypatch):
    """The tiny Qwen2.5-VL checkpoint: the policy's image config times videos by second_per_grid (the registry's
    tokens_per_second), and a GRPO update on two rollouts of a video prompt (repeated and regrouped as the rollout
    glue does) runs, finite, moving the weights, with the video's second_per_grid reaching the update's position
    index. (The rollouts' and SFT's positions are the test above's; the update is one compile.)"""
    import jax
    from test_multi_image import tiny

    from spatial_jax.rl import step as st
    from spatial_jax.rl.optim import make_optimizer
    from spatial_jax.rl.train import Trainer
    from spatial_jax.rollout.completions import Completions, repeat_batch, take_rows

    tok, path = setup[0], setup[-1]
    job = Trainer(tiny(tmp_path, f"policy.checkpoint={path}", "method=spatialcore",
                       "rl.prompts_per_step=1", "rl.group_size=2", "rl.optim.warmup_ratio=0.0"))
    assert job.policy.image_cfg.video_timing == "second_per_grid"
    video_cfg = dataclasses.replace(P.video_config(job.policy.image_cfg, None), min_pixels=64, max_pixels=24 * 24)
    batch = P.make_dataset([video_sample("v8", 8, 1.0)], job.tok, P.DataConfig(bucket_lengths=(256,)),
                           job.method.prompt, 1, shuffle=False, image_cfg=job.policy.image_cfg,
                           video_cfg=video_cfg)[0]
    assert batch.image_grid_thw.tolist() == [[4, 4, 8]] and batch.second_per_grid.tolist() == [2.0]
    ids, mask, pixels, grid, counts, seconds = repeat_batch(batch, 2)
    tokens = np.full((2, 4), tok.pad_id, np.int32)
    tokens[0, :3], tokens[1, :2] = [11, 12, tok.im_end_id], [13, tok.im_end_id]
    zeros = np.zeros(tokens.shape, np.float32)
    comps = Completions(ids, mask, pixels, grid, tokens, zeros - 1.0, zeros, (tokens != tok.pad_id).astype(np.int32),
                        (), (), counts, second_per_grid=seconds)
    comps = take_rows([(comps, [1, 0])], tok.pad_id)
    assert comps.second_per_grid.tolist() == [2.0, 2.0]
    seen = []

    def spy(cfg, ids, grid=None, mask=None, second_per_grid=None, _index=st.rope_index):
        seen.append(None if second_per_grid is None else np.asarray(second_per_grid).tolist())
        return _index(cfg, ids, grid, mask, second_per_grid)

    monkeypatch.setattr(st, "rope_index", spy)
    start = jax.tree.map(np.asarray, job.trainable)
    tx = make_optimizer(job.optim_config("rl"))
    _, out = job.learner.update(0, comps, np.asarray([1.0, -1.0], np.float32), tx, 1, tx.init(job.trainable), 1.0)
    assert np.isfinite(out["loss"])
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), start,
                                         jax.tree.map(np.asarray, job.trainable)))
    assert max(moved) > 0
    assert seen == [[2.0, 2.0]]


def test_export_carries_qwen2_5_vl_processors(setup, tmp_path, monkeypatch):
    """The export of a Qwen2.5-VL policy names Qwen2.5-VL's processors (the registry's processor_files): AutoProcessor
    loads a Qwen2_5_VLProcessor whose image processor (28-pixel multiples at patch 14; here the checkpoint's 8) and
    video processor (2-frame temporal patches sampled at fps, no timestamps) give an image and a video prompt the
    data layer's ids, pixel values, grids and second_per_grid, with the run's min / max pixels."""
    from test_export import check_export_processors
    from test_multi_image import tiny

    from spatial_jax.rl.workspace import Workspace

    ws = Workspace(tiny(tmp_path / "run", f"policy.checkpoint={setup[-1]}", "policy.min_pixels=1024",
                        "policy.max_pixels=5000"), record_config=False)
    check_export_processors(ws, tmp_path / "hf", monkeypatch,
                            ["Qwen2_5_VLProcessor", "Qwen2VLImageProcessorPil", "Qwen2VLVideoProcessor"])
