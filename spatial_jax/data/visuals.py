"""A sample's pictures: decoded (its images, or its video's sampled frames) and preprocessed into the patches and
grids the vision tower reads, with the video processor's settings derived from the image processor's."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from spatial_jax.data.image_processing import num_image_tokens, preprocess
from spatial_jax.data.sample import Sample
from spatial_jax.data.video_processing import (
    VideoProcessingConfig,
    frame_grids,
    listed_second_per_grid,
    pick_frames,
    preprocess_video,
    read_video_file,
    second_per_grid,
    timestamps,
    video_placeholder,
    whole_video_placeholder,
)

PreprocessFn = Callable[[Sequence[np.ndarray], Any], tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Visuals:
    """A sample's pictures before preprocessing: its images, or its video's sampled frames, their source indices,
    the clip's frame rate (for the timestamps) and, when the frames were sampled here, the clip's length."""

    images: list[np.ndarray]
    frames: np.ndarray | None = None  # uint8 [T, H, W, 3]
    frame_indices: np.ndarray | None = None
    fps: float | None = None
    total_frames: int | None = None

    def second_per_grid(self, temporal_patch_size: int) -> float:
        """Seconds per temporal patch of the video: transformers' rule on a clip sampled here, on the clip up to the
        last listed frame otherwise (video_processing.listed_second_per_grid)."""
        if self.total_frames is not None:
            return second_per_grid(len(self.frame_indices), self.total_frames, self.fps, temporal_patch_size)
        return listed_second_per_grid(self.frame_indices, self.fps, temporal_patch_size)

    @property
    def any(self) -> bool:
        """Whether there is a picture at all (a text-only row has none)."""
        return bool(self.images) or self.frames is not None

    @property
    def first(self) -> np.ndarray:
        return self.images[0] if self.frames is None else self.frames[0]


def video_config(image_cfg: Any, video_cfg: VideoProcessingConfig | None) -> VideoProcessingConfig:
    """The video processor's config: as given, or the video defaults of the image processor's video_timing with
    its patch layout (the vision tower's patch, temporal patch and merge sizes, and its normalisation): Qwen3-VL's
    released video config, or for "second_per_grid" transformers' Qwen2VLVideoProcessor defaults (128 to 768
    merged tokens per frame, as qwen-vl-utils; 2 frames a second, 4 to 768 frames)."""
    if video_cfg is not None:
        return video_cfg
    timing = getattr(image_cfg, "video_timing", "timestamps")
    layout = dict(patch_size=image_cfg.patch_size, temporal_patch_size=image_cfg.temporal_patch_size,
                  merge_size=image_cfg.merge_size, image_mean=tuple(image_cfg.image_mean),
                  image_std=tuple(image_cfg.image_std))
    if timing == "second_per_grid":
        tokens = (image_cfg.patch_size * image_cfg.merge_size) ** 2
        return VideoProcessingConfig(**layout, timing=timing, min_pixels=128 * tokens, max_pixels=768 * tokens)
    return VideoProcessingConfig(**layout)


def load_visuals(sample: Sample, video_cfg: VideoProcessingConfig = VideoProcessingConfig(),
                 max_image_pixels: int | None = None) -> Visuals:
    """Decodes the sample's images, or its video's frames (sampled by video_cfg unless the row lists its own frame
    indices). What cannot be read is a DatasetError naming the row and the file."""
    if sample.video is None:
        return Visuals(sample.load_images(max_image_pixels))
    v = sample.video
    if v.path is not None:
        clip = {}

        def wanted(total, rate):
            clip["total"] = total
            return pick_frames(total, v.fps or rate, video_cfg)

        try:
            frames, idx, fps = read_video_file(v.path, wanted, max_image_pixels)
        except ValueError as e:
            raise sample.error(f"video {v.path}: {e}") from None
        return Visuals([], frames, idx, v.fps or fps, clip["total"])
    total = None
    if v.frame_indices is not None:
        keep, idx = list(range(len(v.frames))), np.asarray(v.frame_indices)
    else:
        try:
            keep = pick_frames(len(v.frames), v.fps, video_cfg).tolist()
        except ValueError as e:
            raise sample.error(f"video of {len(v.frames)} frames: {e}") from None
        idx, total = np.asarray(keep), len(v.frames)
    frames = [sample.load_ref(v.frames[k], max_image_pixels, "video frame") for k in keep]
    if len({f.shape for f in frames}) != 1:
        raise sample.error(f"video frames differ in size: {sorted({f.shape[:2] for f in frames})}")
    return Visuals([], np.stack(frames), idx, float(v.fps), total)


def encode_visuals(sample: Sample, vis: Visuals, image_cfg: Any, video_cfg: VideoProcessingConfig,
                   preprocess_fn: PreprocessFn = preprocess
                   ) -> tuple[np.ndarray, np.ndarray, list[int], list[str], np.ndarray]:
    """(pixel_values, item grids [items, 3], tokens per image, the video's placeholder text ([] without one),
    each item's second_per_grid [items] float32)."""
    if not vis.any:  # a text-only row: no patches, no vision tokens
        width = 3 * image_cfg.temporal_patch_size * image_cfg.patch_size ** 2  # RGB
        return np.zeros((0, width), np.float32), np.zeros((0, 3), np.int64), [], [], np.zeros(0, np.float32)
    try:
        if vis.frames is None:
            pixel_values, grid = preprocess_fn(vis.images, image_cfg)
            grid = np.asarray(grid, np.int64).reshape(-1, 3)
            return (pixel_values, grid, [int(n) for n in num_image_tokens(grid, image_cfg.merge_size)], [],
                    np.zeros(len(grid), np.float32))
        pixel_values, grid = preprocess_video(vis.frames, video_cfg)
    except ValueError as e:
        raise sample.error(f"{_visual_name(sample, vis)}: {e}") from None
    if video_cfg.timing == "second_per_grid":
        seconds = np.asarray([vis.second_per_grid(video_cfg.temporal_patch_size)], np.float32)
        return (pixel_values, np.asarray([grid], np.int64), [], [whole_video_placeholder(grid, video_cfg.merge_size)],
                seconds)
    times = timestamps(vis.frame_indices, vis.fps, video_cfg.temporal_patch_size)
    items = frame_grids(grid)
    return (pixel_values, items, [], [video_placeholder(grid, times, video_cfg.merge_size)],
            np.zeros(len(items), np.float32))


def _visual_name(sample: Sample, vis: Visuals) -> str:
    if sample.video is not None:
        return f"video {sample.video.path or 'of ' + str(len(sample.video.frames)) + ' frames'}"
    if sample.image is not None and isinstance(sample.image, str):
        return f"image {sample.image}"
    if len(vis.images) == 1:
        return f"image of {vis.images[0].shape[1]}x{vis.images[0].shape[0]} pixels"
    return f"images {[r if isinstance(r, str) else 'array' for r in sample.images]}"
