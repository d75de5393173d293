"""video_processing's edges held to transformers: the config's refusals; Qwen3-VL's frame sampling
(Qwen3VLVideoProcessor.sample_frames) and Qwen2.5-VL's (Qwen2VLVideoProcessor.sample_frames) over clip lengths,
frame rates and bounds that bind, with 1- and 3-frame temporal patches; second_per_grid and listed_second_per_grid
as transformers' sampled_fps states them; Qwen2.5-VL's frame size (Qwen2VLVideoProcessor.resize, per-frame budget
and cap) and its patches bit for bit; Qwen3-VL's patches at a 3-frame temporal patch; the timestamps
(Qwen3VLProcessor._calculate_timestamps) and the placeholders in full; and read_video_file on the files users hold:
an mp4, a Matroska file that stores no frame count, an MPEG-TS file that states no average rate, an AVI whose header
states more frames than it has, and each way reading one fails, in full."""

import os
import struct
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch
from test_video import _qwen2_video_processor_class, _torch_resize, clip, hf_video_processor, qwen2_videos_class
from transformers.image_utils import SizeDict
from transformers.video_utils import VideoMetadata, read_video_pyav

from spatial_jax.data import video_processing as V
from spatial_jax.data.video_processing import VideoProcessingConfig

# Qwen2.5-VL's normalisation (OpenAI CLIP's), as models.registry.QWEN2_5_IMAGES gives it
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


# ---------------------------------------------------------------- the config


def test_config_refusals_and_bounds():
    """Each bad field is named with its value; the bounds themselves (1, min == max, a tiny positive std) pass."""
    names = ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels", "min_frames",
             "max_frames", "max_video_tokens")
    cases = [(dict(timing="seconds"), "VideoProcessingConfig.timing must be one of ('timestamps', "
                                      "'second_per_grid'), got 'seconds'")]
    cases += [({name: 0}, f"VideoProcessingConfig.{name} must be >= 1, got 0") for name in names]
    cases += [(dict(fps=fps), f"VideoProcessingConfig.fps must be positive, got {text}")
              for fps, text in ((0.0, "0.0"), (-2.0, "-2.0"), (float("nan"), "nan"), (float("inf"), "inf"))]
    cases += [(dict(min_frames=9, max_frames=8), "VideoProcessingConfig.min_frames (9) exceeds max_frames (8)"),
              (dict(min_pixels=4097, max_pixels=4096),
               "VideoProcessingConfig.min_pixels (4097) exceeds max_pixels (4096)"),
              (dict(image_std=(0.5, 0.0, 0.5)),
               "VideoProcessingConfig.image_std must be positive, got (0.5, 0.0, 0.5)"),
              (dict(image_std=(-0.5, 0.5, 0.5)),
               "VideoProcessingConfig.image_std must be positive, got (-0.5, 0.5, 0.5)")]
    for kwargs, message in cases:
        with pytest.raises(ValueError) as e:
            VideoProcessingConfig(**kwargs)
        assert str(e.value) == message, kwargs
    for name in names:  # 1 is allowed (min_frames 1 needs max_frames >= 1, min_pixels 1 needs max_pixels >= 1)
        VideoProcessingConfig(**{name: 1}, **({"min_frames": 1} if name == "max_frames" else {}),
                              **({"min_pixels": 1} if name == "max_pixels" else {}))
    VideoProcessingConfig(timing="second_per_grid", fps=1e-3, min_frames=8, max_frames=8, min_pixels=4096,
                          max_pixels=4096, image_std=(1e-6, 1e-6, 1e-6))
    assert VideoProcessingConfig().factor == 32
    assert VideoProcessingConfig(patch_size=14, merge_size=2).factor == 28


# ---------------------------------------------------------------- frame sampling

SAMPLING = [VideoProcessingConfig(),  # Qwen3-VL's released config: 2 fps, 4 to 768 frames
            VideoProcessingConfig(fps=1.3, min_frames=3, max_frames=31),
            VideoProcessingConfig(fps=0.5, min_frames=1, max_frames=5, temporal_patch_size=3),
            VideoProcessingConfig(fps=24.0, min_frames=6, max_frames=20, temporal_patch_size=1)]
# (462, 24.0): 38 frames at a stride of 12.157... where i * stride lands within float32 rounding below an integer
CLIPS = [(1, 1.0), (2, 30.0), (3, 1.0), (5, 2.0), (7, 29.97), (9, 4.0), (44, 30.0), (65, 23.976), (191, 1.0),
         (300, 12.5), (462, 24.0), (4321, 30.0)]


def test_timestamps_sampling_equals_qwen3_vl():
    """sample_indices (and pick_frames at timing "timestamps") keeps transformers' Qwen3-VL frames: cfg.fps per
    second truncated, raised to min_frames, cut to max_frames and to the clip, spread from the first to the last."""
    for cfg in SAMPLING:
        hf = hf_video_processor(cfg)
        for total, fps in CLIPS:
            want = hf.sample_frames(VideoMetadata(total_num_frames=total, fps=fps), fps=cfg.fps)
            np.testing.assert_array_equal(V.sample_indices(total, fps, cfg), want, err_msg=f"{cfg} {total} {fps}")
            np.testing.assert_array_equal(V.pick_frames(total, fps, cfg), want)
    # pinned: 13 frames at 6 fps give 4 at 2 fps (min_frames binds), 100 at 10 fps give 20 of them
    assert V.sample_indices(13, 6.0, VideoProcessingConfig()).tolist() == [0, 4, 8, 12]
    assert V.sample_indices(100, 10.0, VideoProcessingConfig()).tolist() == [
        0, 5, 10, 16, 21, 26, 31, 36, 42, 47, 52, 57, 63, 68, 73, 78, 83, 89, 94, 99]
    with pytest.raises(ValueError) as e:
        V.sample_indices(0, 30.0, VideoProcessingConfig())
    assert str(e.value) == "the video has no frames"


def test_patched_sampling_equals_qwen2_5_vl():
    """sample_indices_patched (and pick_frames at timing "second_per_grid") keeps transformers' Qwen2.5-VL frames
    over clips and bounds, temporal patches of 1, 2 and 3 frames included; its refusals in full."""
    hf = _qwen2_video_processor_class()(do_sample_frames=True)
    for cfg in SAMPLING:
        cfg25 = VideoProcessingConfig(**{**cfg.__dict__, "timing": "second_per_grid"})
        tp = cfg.temporal_patch_size
        for total, fps in CLIPS:
            if total < tp:
                continue
            try:
                want = hf.sample_frames(VideoMetadata(total_num_frames=total, fps=fps), fps=cfg.fps,
                                        min_frames=cfg.min_frames, max_frames=cfg.max_frames,
                                        temporal_patch_size=tp).numpy()
            except ZeroDivisionError:  # its count rounds to 0 frames (min_frames < tp): see the test below
                assert cfg.min_frames < tp, (cfg, total, fps)
                continue
            np.testing.assert_array_equal(V.sample_indices_patched(total, fps, cfg), want, err_msg=f"{total} {fps}")
            np.testing.assert_array_equal(V.pick_frames(total, fps, cfg25), want)
    # pinned: 44 frames at 30 fps give 4 frames a stride of 11 apart (the last frame not kept)
    cfg25 = VideoProcessingConfig(timing="second_per_grid")
    assert V.pick_frames(44, 30.0, cfg25).tolist() == [0, 11, 22, 33]
    assert V.pick_frames(44, 30.0, VideoProcessingConfig()).tolist() == [0, 14, 29, 43]
    for args, message in [((2, 30.0, VideoProcessingConfig(temporal_patch_size=3)),
                           "a video needs at least 3 frames (one temporal patch), got 2"),
                          ((1, 30.0, cfg25), "a video needs at least 2 frames (one temporal patch), got 1"),
                          ((8, 0.0, cfg25), "the video's frame rate must be positive, got 0.0"),
                          ((8, -25.0, cfg25), "the video's frame rate must be positive, got -25.0"),
                          ((8, float("nan"), cfg25), "the video's frame rate must be positive, got nan"),
                          ((8, float("inf"), cfg25), "the video's frame rate must be positive, got inf")]:
        with pytest.raises(ValueError) as e:
            V.sample_indices_patched(*args)
        assert str(e.value) == message
    # exactly one temporal patch is enough
    assert V.sample_indices_patched(3, 30.0, VideoProcessingConfig(temporal_patch_size=3)).tolist() == [0, 1, 2]


def test_patched_sampling_keeps_one_temporal_patch():
    """A clip shorter than one temporal patch at cfg.fps under min_frames < temporal_patch_size keeps one temporal
    patch (its frames at a stride of total / tp), where transformers' count rounds to 0 frames and its stride divides
    by zero (a ZeroDivisionError, which the data layer would not name as the row's error)."""
    cfg = VideoProcessingConfig(fps=0.5, min_frames=1, max_frames=5, temporal_patch_size=3, timing="second_per_grid")
    assert V.pick_frames(3, 1.0, cfg).tolist() == [0, 1, 2]  # 3 s at 0.5 fps: 1.5 frames, under one patch of 3
    assert V.pick_frames(5, 2.0, cfg).tolist() == [0, 1, 3]  # 2.5 s: 1.25 frames; a stride of 5 / 3
    one = VideoProcessingConfig(min_frames=1, timing="second_per_grid")  # 2 fps, patches of 2
    assert V.pick_frames(12, 30.0, one).tolist() == [0, 6]  # 0.4 s: 0.8 frames
    hf = _qwen2_video_processor_class()(do_sample_frames=True)
    with pytest.raises(ZeroDivisionError):
        hf.sample_frames(VideoMetadata(total_num_frames=12, fps=30.0), fps=2.0, min_frames=1, max_frames=768,
                         temporal_patch_size=2)


def test_second_per_grid_equals_transformers_sampled_fps():
    """second_per_grid is temporal_patch_size / transformers' sampled_fps (the processor's second_per_grid_ts);
    listed_second_per_grid takes the clip to end at the last listed frame."""
    for total, fps in ((44, 30.0), (9, 4.0), (100, 24.0), (37, 2.0)):
        for tp in (1, 2, 3):
            idx = np.linspace(0, total - 1, 7).astype(int)
            meta = VideoMetadata(total_num_frames=total, fps=fps, frames_indices=idx.tolist())
            assert V.second_per_grid(7, total, fps, tp) == pytest.approx(tp / meta.sampled_fps, rel=1e-12)
            assert V.listed_second_per_grid(idx, fps, tp) == pytest.approx(tp / meta.sampled_fps, rel=1e-12)
            assert V.listed_second_per_grid(tuple(idx.tolist()), fps, tp) == V.listed_second_per_grid(idx, fps, tp)
    # pinned: 4 of 44 frames at 30 fps are 2.727... frames a second, 0.7333 s a patch of 2
    assert V.second_per_grid(4, 44, 30.0) == pytest.approx(2 / (4 / 44 * 30), rel=1e-15)
    assert V.second_per_grid(4, 44, 30.0) == pytest.approx(0.73333333333, rel=1e-10)
    # frames 0, 4, 8, 12 of a clip at 2 fps: a 13-frame clip sampled at 4 / 13 * 2 fps, 3.25 s a patch of 2
    assert V.listed_second_per_grid([0, 4, 8, 12], 2.0) == pytest.approx(3.25, rel=1e-15)
    assert V.listed_second_per_grid(np.asarray([0, 4, 8, 12]), 2.0, 3) == pytest.approx(4.875, rel=1e-15)


# ---------------------------------------------------------------- Qwen2.5-VL's frame size and patches


def qwen2_video_processor(cfg: VideoProcessingConfig, torch_resize=_torch_resize):
    """transformers' Qwen2VLVideoProcessor at cfg (no sampling), torchvision's ops done by the torch calls it makes
    (as tests/test_qwen2_5_video.py builds it); torch_resize stands in for torchvision's resize."""
    Videos = qwen2_videos_class(torch_resize)

    return Videos(size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels}, patch_size=cfg.patch_size,
                  merge_size=cfg.merge_size, temporal_patch_size=cfg.temporal_patch_size,
                  image_mean=list(cfg.image_mean), image_std=list(cfg.image_std), do_sample_frames=False,
                  cap_pixels_per_frame=cfg.cap_pixels_per_frame, max_video_tokens=cfg.max_video_tokens)


SIZES25 = [
    # Qwen2.5-VL's processor defaults (visuals.video_config): 128 to 768 merged tokens of 28 x 28 pixels a frame
    VideoProcessingConfig(patch_size=14, merge_size=2, min_pixels=128 * 784, max_pixels=768 * 784,
                          timing="second_per_grid"),
    VideoProcessingConfig(patch_size=14, merge_size=2, min_pixels=128 * 784, max_pixels=768 * 784,
                          timing="second_per_grid", cap_pixels_per_frame=True, max_video_tokens=2048),
    VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=24 * 24, timing="second_per_grid",
                          cap_pixels_per_frame=True, max_video_tokens=10),
    VideoProcessingConfig(patch_size=8, merge_size=2, min_pixels=4096, max_pixels=400_000, temporal_patch_size=3,
                          timing="second_per_grid", cap_pixels_per_frame=True, max_video_tokens=300),
]


@pytest.mark.parametrize("k", range(len(SIZES25)))
def test_second_per_grid_frame_size_equals_qwen2_vl_resize(k):
    """Timing "second_per_grid": each frame within the per-frame budget, and under the cap within 90% of
    max_video_tokens' pixels times the temporal patch over the frames (at least 1.05 min_pixels), as transformers'
    Qwen2VLVideoProcessor.resize gives it (its output read on a zero clip)."""
    cfg = SIZES25[k]
    # only the size transformers picks is read: its resize of the frames is skipped
    hf = qwen2_video_processor(cfg, lambda self, image, size, **kwargs: torch.empty(
        (*image.shape[:-2], size.height, size.width), dtype=image.dtype))
    rng = np.random.default_rng(k)
    # (22, 353, 474): under the cap the per-frame budget's floor division moves the size
    cases = [(2, 1, 1), (3, 7, 900), (64, 1100, 600), (7, cfg.factor, cfg.factor), (4, 360, 640), (33, 360, 640),
             (22, 353, 474)]
    cases += [(int(rng.integers(2, 70)), int(rng.integers(1, 1201)), int(rng.integers(1, 1201))) for _ in range(10)]
    for frames, height, width in cases:
        if max(height, width) / min(height, width) > V.MAX_ASPECT_RATIO or frames < cfg.temporal_patch_size:
            continue
        video = torch.zeros((1, 1, 1, 1, 1), dtype=torch.uint8).expand(1, frames, 3, height, width)
        want = hf.resize(video, SizeDict(shortest_edge=cfg.min_pixels, longest_edge=cfg.max_pixels), None,
                         cfg.factor, cfg.temporal_patch_size, cfg.cap_pixels_per_frame, cfg.max_video_tokens)
        assert V.smart_resize(frames, height, width, cfg) == tuple(want.shape[-2:]), (frames, height, width)


def test_timestamps_frame_size_edges_equal_qwen3_vl_resize():
    """Timing "timestamps" at its edges, as transformers' Qwen3VLVideoProcessor.resize: a budget or a floor the
    frames fill exactly (kept), frames of aspect ratio exactly 200 (allowed), and a per-frame cap whose budget does
    not divide by the frame count (floored)."""
    from test_video_resize import _theirs

    exact = VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=6 * 24 * 24)
    capped = VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=100_003,
                                   cap_pixels_per_frame=True, max_video_tokens=100_000)
    floor = VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=6 * 24 * 24, max_pixels=100_000)
    for cfg, (frames, height, width), want in [(exact, (6, 23, 25), (24, 24)), (floor, (6, 23, 25), (24, 24)),
                                               (VideoProcessingConfig(), (4, 32, 6400), (32, 6400)),
                                               (capped, (21, 738, 858), (56, 72)), (capped, (72, 17, 906), None),
                                               (capped, (43, 321, 144), None)]:
        got = V.smart_resize(frames, height, width, cfg)
        assert got == _theirs(cfg, frames, height, width), (frames, height, width)
        assert want is None or got == want


def test_second_per_grid_frame_size_pinned_and_refused():
    """A 360p clip of 4 and of 40 frames at Qwen2.5-VL's sizes, with and without the cap; the refusals."""
    cfg = SIZES25[0]
    assert V.smart_resize(4, 360, 640, cfg) == (364, 644)  # within 768 tokens a frame: kept near its size
    assert V.smart_resize(40, 360, 640, cfg) == (364, 644)  # the budget is per frame
    capped = SIZES25[1]  # 0.9 * 2048 * 784 * 2 / 40 = 72253 pixels a frame < 1.05 * 128 * 784 = 105369
    assert V.smart_resize(40, 360, 640, capped) == (224, 420)
    assert V.smart_resize(4, 360, 640, capped) == (364, 644)
    for args, message in [((1, 360, 640), "a video needs at least 2 frames (one temporal patch), got 1"),
                          ((4, 0, 640), "video frames have an empty side: height=0, width=640"),
                          ((4, 360, 0), "video frames have an empty side: height=360, width=0")]:
        with pytest.raises(ValueError) as e:
            V.smart_resize(*args, cfg)
        assert str(e.value) == message


def test_second_per_grid_patches_equal_qwen2_vl_processor():
    """preprocess_video at timing "second_per_grid" with CLIP's normalisation, frames given as a list, an odd count
    (the last frame repeated), a 3-frame temporal patch: pixel values bit for bit and the grid."""
    for cfg, n, h, w in [(VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=24 * 24,
                                                image_mean=CLIP_MEAN, image_std=CLIP_STD, timing="second_per_grid"),
                          7, 20, 28),
                         (VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=32 * 32,
                                                temporal_patch_size=3, image_mean=CLIP_MEAN, image_std=CLIP_STD,
                                                timing="second_per_grid", cap_pixels_per_frame=True,
                                                max_video_tokens=12), 7, 30, 22)]:
        v = clip(n, h, w, seed=n)
        out = qwen2_video_processor(cfg)(videos=[v], return_tensors="np")
        pixels, grid = V.preprocess_video(list(v), cfg)
        np.testing.assert_array_equal(grid, out["video_grid_thw"][0])
        np.testing.assert_array_equal(pixels, out["pixel_values_videos"])


def test_timestamps_patches_at_three_frame_patches_equal_qwen3_vl_processor():
    """Timing "timestamps" at a 3-frame temporal patch: 7 frames padded to 9 (two repeats of the last), pixel values
    bit for bit and the grid as transformers' Qwen3VLVideoProcessor; frames already at their size are kept."""
    for cfg, (n, h, w) in [(VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=7 * 24 * 24,
                                                  temporal_patch_size=3), (7, 20, 28)),
                           (VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=6 * 24 * 24),
                            (6, 16, 24))]:
        v = clip(n, h, w, seed=n)
        out = hf_video_processor(cfg)(videos=[v], do_sample_frames=False, return_tensors="np")
        pixels, grid = V.preprocess_video(v, cfg)
        np.testing.assert_array_equal(grid, out["video_grid_thw"][0])
        np.testing.assert_array_equal(pixels, out["pixel_values_videos"])
    assert grid == (3, 4, 6)


def test_frames_flipped_from_bgr_equal_transformers():
    """Frames decoded by OpenCV (BGR) and flipped to RGB by a view (negative strides, which torch.from_numpy refuses)
    give transformers' patches of the same frames."""
    cfg = VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=6 * 24 * 24)
    rgb = clip(5, 20, 28, seed=5)
    bgr = np.ascontiguousarray(rgb[..., ::-1])
    out = hf_video_processor(cfg)(videos=[rgb], do_sample_frames=False, return_tensors="np")
    pixels, grid = V.preprocess_video(bgr[..., ::-1], cfg)
    np.testing.assert_array_equal(grid, out["video_grid_thw"][0])
    np.testing.assert_array_equal(pixels, out["pixel_values_videos"])


def test_preprocess_refusals():
    """Frames that are not uint8 RGB [T, H, W, 3] are refused with their dtype and shape; no frames, as too few."""
    cfg = VideoProcessingConfig()
    for frames, message in [(clip(4).astype(np.float32), "float32 (4, 20, 28, 3)"),
                            (clip(4)[0], "uint8 (20, 28, 3)"),
                            (np.zeros((4, 20, 28, 4), np.uint8), "uint8 (4, 20, 28, 4)")]:
        with pytest.raises(ValueError) as e:
            V.preprocess_video(frames, cfg)
        assert str(e.value) == f"video frames must be uint8 [T, H, W, 3], got {message}"
    with pytest.raises(ValueError) as e:  # a decode that kept no frame: the array is well formed, the video empty
        V.preprocess_video(np.zeros((0, 20, 28, 3), np.uint8), cfg)
    assert str(e.value) == "a video needs at least 2 frames (one temporal patch), got 0"


# ---------------------------------------------------------------- the prompt text


def test_timestamps_equal_qwen3_vl_processor():
    """Each temporal group's time, the last frame repeated to fill the last group, at temporal patches of 1 to 3."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    for idx, fps in (([0, 3, 6], 3.0), ([0, 5, 10, 16, 21], 10.0), ([0, 14, 29, 43], 29.97), ([7], 2.0)):
        for tp in (1, 2, 3):
            want = Qwen3VLProcessor._calculate_timestamps(None, list(idx), fps, tp)
            assert V.timestamps(idx, fps, tp) == want
            assert V.timestamps(np.asarray(idx), fps, tp) == want
    assert V.timestamps([0, 3, 6], 3.0) == [0.5, 2.0]
    assert V.timestamps([0, 2, 4, 6], 2.0, 3) == [1.0, 3.0]
    with pytest.raises(ValueError) as e:
        V.timestamps([], 2.0)
    assert str(e.value) == "a video needs at least one frame"


def test_placeholders_and_frame_grids():
    """The prompt text of a video, in full: Qwen3-VL's per-group blocks with times, Qwen2.5-VL's single block."""
    block = "<|vision_start|>" + "<|video_pad|>" * 6 + "<|vision_end|>"  # 4 x 6 patches merged 2 x 2
    assert V.video_placeholder((2, 4, 6), [0.25, 1.75]) == "<0.2 seconds>" + block + "<1.8 seconds>" + block
    assert V.video_placeholder([1, 2, 3], [12.0], merge_size=1) == (
        "<12.0 seconds><|vision_start|>" + "<|video_pad|>" * 6 + "<|vision_end|>")
    with pytest.raises(ValueError) as e:
        V.video_placeholder((2, 4, 6), [0.5, 1.5, 2.5])
    assert str(e.value) == "3 timestamps for a video of 2 temporal groups"
    assert V.whole_video_placeholder((3, 4, 6)) == "<|vision_start|>" + "<|video_pad|>" * 18 + "<|vision_end|>"
    assert V.whole_video_placeholder(np.asarray([2, 2, 4]), merge_size=1) == (
        "<|vision_start|>" + "<|video_pad|>" * 16 + "<|vision_end|>")
    grids = V.frame_grids(np.asarray([3, 4, 6]))
    assert grids.dtype == np.int64
    assert grids.tolist() == [[1, 4, 6], [1, 4, 6], [1, 4, 6]]


# ---------------------------------------------------------------- video files

VIDEO_CFG = VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=6 * 24 * 24)


def write_clip(path, n: int = 13, rate: int = 6, audio: bool = False) -> str:
    """An MPEG-4 part 2 clip of clip(n, 24, 32) at `rate` frames a second, in the container path's suffix names;
    with `audio`, an AAC sound track beside it (as most recorded videos have)."""
    av = pytest.importorskip("av")
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        if audio:
            sound = out.add_stream("aac", rate=8000)
            sound.layout = "mono"
        for f in clip(n, 24, 32):
            out.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        out.mux(stream.encode())
        if audio:
            wave = (np.sin(np.arange(8000 * n // rate) / 5) * 3000).astype(np.int16)[None]
            for k in range(0, wave.shape[1], 1024):
                frame = av.AudioFrame.from_ndarray(wave[:, k:k + 1024], format="s16", layout="mono")
                frame.sample_rate = 8000
                out.mux(sound.encode(frame))
            out.mux(sound.encode())
    return str(path)


def sampled(total, fps):
    return V.sample_indices(total, fps, VIDEO_CFG)


def test_video_files_decode_as_transformers(tmp_path):
    """An mp4 (frame count stored), a Matroska file (none stored: counted by decoding) and an MPEG-TS file (no
    average rate: the guessed one), with and without a sound track, give transformers' PyAV reader's frames of the
    mp4, the sampled indices and the rate as a float; `wanted` is asked once with the clip's length and rate."""
    mp4 = write_clip(tmp_path / "clip.mp4")
    ref, meta = read_video_pyav(mp4, hf_video_processor(VIDEO_CFG).sample_frames)
    assert (meta.total_num_frames, meta.fps) == (13, 6.0)
    for name, audio in (("clip.mp4", False), ("clip.mkv", False), ("clip.ts", False), ("sound.mp4", True),
                        ("sound.mkv", True)):
        asked = []
        frames, idx, fps = V.read_video_file(write_clip(tmp_path / name, audio=audio),
                                             lambda total, rate: asked.append((total, rate)) or sampled(total, rate))
        assert asked == [(13, 6.0)], name
        assert type(fps) is float and fps == 6.0
        assert idx.tolist() == [0, 4, 8, 12]
        np.testing.assert_array_equal(frames, ref, err_msg=name)
    # frames may be asked for in any order and more than once
    frames, idx, _ = V.read_video_file(mp4, lambda total, rate: [5, 2, 5])
    np.testing.assert_array_equal(frames, V.read_video_file(mp4, lambda total, rate: list(range(13)))[0][[5, 2, 5]])
    assert idx.tolist() == [5, 2, 5]
    # indices a sampler gives as floats (a linspace not rounded) are truncated, as transformers' .int() does
    frames, idx, _ = V.read_video_file(mp4, lambda total, rate: np.linspace(0, total - 1, 6))
    assert idx.dtype.kind == "i" and idx.tolist() == [0, 2, 4, 7, 9, 12]
    np.testing.assert_array_equal(frames, V.read_video_file(mp4, lambda total, rate: list(range(13)))[0][idx])
    # a time-lapse at 1 frame a second (and one at 1 frame in 2 s) is read at its rate, every frame kept
    for rate, fps_read in ((1, 1.0), (Fraction(1, 2), 0.5)):
        frames, idx, fps = V.read_video_file(write_clip(tmp_path / "slow.mp4", n=5, rate=rate), sampled)
        assert (fps, idx.tolist(), frames.shape) == (fps_read, [0, 1, 2, 3, 4], (5, 24, 32, 3))


def test_decoding_stops_at_the_last_wanted_frame(tmp_path, monkeypatch):
    """Frames after the last wanted one are not decoded; a file without a frame count is decoded once to count,
    then from its start."""
    import av

    opened = av.open
    decoded = []

    class Spy:
        def __init__(self, container):
            self.container = container

        def __enter__(self):
            self.container.__enter__()
            return self

        def __exit__(self, *exc):
            return self.container.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self.container, name)

        def decode(self, *args):
            decoded.append([])  # one list of the frames' times per pass
            for frame in self.container.decode(*args):
                decoded[-1].append(round(frame.time * 6))  # the frame's number
                yield frame

    monkeypatch.setattr(av, "open", lambda *a, **k: Spy(opened(*a, **k)))
    _, idx, _ = V.read_video_file(write_clip(tmp_path / "clip.mp4"), lambda total, rate: [1, 3, 6])
    assert idx.tolist() == [1, 3, 6] and decoded == [list(range(7))]
    decoded.clear()
    _, idx, _ = V.read_video_file(write_clip(tmp_path / "clip.mkv"), lambda total, rate: [0, 6, 10])
    assert idx.tolist() == [0, 6, 10] and decoded == [list(range(13)), list(range(11))]


def test_video_file_refusals(tmp_path, monkeypatch):
    """Each way a video file cannot be read is one ValueError naming why, in full."""
    mp4 = write_clip(tmp_path / "clip.mp4")
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video")
    os.mkfifo(tmp_path / "pipe.mp4")
    # an AVI whose stream header states 20 frames of the 13 it holds (a damaged or cut file)
    avi = bytearray(open(write_clip(tmp_path / "clip.avi"), "rb").read())
    struct.pack_into("<I", avi, avi.find(b"strh") + 8 + 32, 20)
    (tmp_path / "long.avi").write_bytes(bytes(avi))
    for path, max_pixels, message in [
        (tmp_path, None, f"{tmp_path} is a folder, a device or a pipe, not a video file"),
        (tmp_path / "pipe.mp4", None, f"{tmp_path / 'pipe.mp4'} is a folder, a device or a pipe, not a video file"),
        (tmp_path / "gone.mp4", None, f"[Errno 2] No such file or directory: '{tmp_path / 'gone.mp4'}'"),
        (junk, None, f"[Errno 1094995529] Invalid data found when processing input: '{junk}'"),
        (mp4, 767, "32x24 frames are over data.max_image_pixels = 767"),
        (tmp_path / "long.avi", None, "the file has fewer frames than it states (20); frame 15 is missing"),
    ]:
        with pytest.raises(ValueError) as e:
            V.read_video_file(str(path), sampled, max_pixels)
        assert str(e.value) == message
    assert V.read_video_file(mp4, sampled, 768)[1].tolist() == [0, 4, 8, 12]  # exactly at the budget
    monkeypatch.setitem(sys.modules, "av", None)  # PyAV not installed
    with pytest.raises(ValueError) as e:
        V.read_video_file(mp4, sampled)
    assert str(e.value) == "reading a video file needs PyAV (pip install av); or give the frames as images"


def test_video_file_without_a_frame_rate(monkeypatch):
    """A stream that states neither an average nor a guessed rate is refused before any frame is picked (PyAV
    reports such a stream as rates of None, which no file written here reproduces: the container is a stand-in)."""
    import av

    class Stream:
        average_rate = guessed_rate = None
        frames, width, height = 13, 32, 24

    class Container:
        streams = type("Streams", (), {"video": [Stream()]})

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(av, "open", lambda path: Container())
    with pytest.raises(ValueError) as e:
        V.read_video_file("clip.mp4", sampled)
    assert str(e.value) == "the file states no frame rate"
