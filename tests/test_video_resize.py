"""video_processing.smart_resize (Qwen3-VL's timing) held to transformers' own Qwen3VLVideoProcessor.resize over
random clips and settings: frame counts from one temporal patch to 64, sides from 1 pixel (upscaled to the factor)
to 1200, pixel budgets that shrink or grow the frames, the per-frame cap on and off with a token budget that binds.
The resized size is read off transformers' output tensor (its resize run on a zero clip through test_video.py's
stand-in for torchvision). Exact: both sides are integer arithmetic on the same rules. Its refusals are checked in
full."""

import numpy as np
import pytest
import torch
from test_video import hf_video_processor
from transformers.image_utils import SizeDict

from spatial_jax.data import video_processing as V

CONFIGS = [
    V.VideoProcessingConfig(),  # Qwen3-VL's released video config
    V.VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=6 * 24 * 24),
    V.VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=20_000, max_pixels=400_000),
    V.VideoProcessingConfig(patch_size=8, merge_size=2, min_pixels=256, max_pixels=3_000_000,
                            cap_pixels_per_frame=True, max_video_tokens=40),
    V.VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=4096, max_pixels=200_000,
                            cap_pixels_per_frame=True, max_video_tokens=300),
]


def _theirs(cfg: V.VideoProcessingConfig, frames: int, height: int, width: int) -> tuple[int, int]:
    processor = hf_video_processor(cfg)
    processor.max_video_tokens = cfg.max_video_tokens  # the cap's token budget, read by transformers' resize
    video = torch.zeros((1, frames, 3, height, width), dtype=torch.uint8)
    out = processor.resize(video, SizeDict(shortest_edge=cfg.min_pixels, longest_edge=cfg.max_pixels), None,
                           cfg.factor, cfg.temporal_patch_size, cfg.cap_pixels_per_frame)
    return tuple(out.shape[-2:])


@pytest.mark.parametrize("k", range(len(CONFIGS)))
def test_frame_size_equals_transformers(k):
    cfg = CONFIGS[k]
    rng = np.random.default_rng(k)
    cases = [(2, 1, 1), (3, 7, 900), (64, 1100, 600), (5, cfg.factor, cfg.factor)]
    cases += [(int(rng.integers(2, 25)), int(rng.integers(1, 1201)), int(rng.integers(1, 1201))) for _ in range(12)]
    for frames, height, width in cases:
        if max(height, width) / min(height, width) > V.MAX_ASPECT_RATIO:
            continue
        assert V.smart_resize(frames, height, width, cfg) == _theirs(cfg, frames, height, width), (frames, height,
                                                                                                    width)


def test_refusals():
    cfg = V.VideoProcessingConfig()
    for args, message in [((1, 64, 64), "a video needs at least 2 frames (one temporal patch), got 1"),
                          ((4, 0, 64), "video frames have an empty side: height=0, width=64"),
                          ((4, 64, -1), "video frames have an empty side: height=64, width=-1"),
                          ((4, 32, 6433), "absolute aspect ratio must be smaller than 200, got 201.03125 for "
                                          "32x6433 frames")]:
        with pytest.raises(ValueError) as e:
            V.smart_resize(*args, cfg)
        assert str(e.value) == message
