"""Qwen3-VL video preprocessing: frames -> temporal patches + video_grid_thw, and the timestamped prompt text.

Reproduces transformers' Qwen3VLVideoProcessor with Qwen3-VL's released video_preprocessor_config.json: sample
frames at `fps` per second (at least min_frames, at most max_frames, never more than the clip has), resize every
frame to one `smart_resize` size (the video form: the pixel budget covers all frames), bicubic with antialiasing as
torchvision resizes uint8 frames (torch's interpolate on uint8, the same call, so frames match bit for bit), scale
and normalise fused as (x - 255 mean) / (255 std) in float32, repeat the last frame up to a multiple of the
temporal patch (2), and lay out (t, h/m, w/m, m, m) patches of (C, temporal, ps, ps) values: two consecutive frames
share a patch. The processor's prompt gives each temporal group `<{t:.1f} seconds>` (the mean time of its first and
last frame) and its own vision block.

The language model sees a video of grid [t, h, w] as t frames of grid [1, h, w] (per-frame vision attention and
M-RoPE positions, as transformers' get_rope_index splits it), so `frame_grids` turns a video into t items that the
image path packs and encodes like images.

timing = "second_per_grid" is Qwen2.5-VL's video processing instead (transformers' Qwen2VLVideoProcessor and
Qwen2_5_VLProcessor): frames sampled in whole temporal patches (`sample_indices_patched`), every frame resized to
the image form of `smart_resize` within a per-frame pixel budget, no timestamps in the prompt (one vision block of
t * h * w / merge^2 pads), and the video stays one [t, h, w] item whose temporal positions the language model
spaces by tokens_per_second * `second_per_grid` seconds (models.rope.get_rope_index).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

import numpy as np

from spatial_jax.data import image_processing
from spatial_jax.data.image_processing import MAX_ASPECT_RATIO, VIDEO_TIMINGS

VISION_START, VISION_END, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"


@dataclasses.dataclass(frozen=True)
class VideoProcessingConfig:
    """Defaults are Qwen3-VL's video_preprocessor_config.json (size.shortest_edge / longest_edge = min / max pixels,
    summed over the frames). cap_pixels_per_frame: transformers' optional per-frame budget (qwen-vl-utils' rule,
    off in the released config): each frame gets min(max_video_tokens * factor^2, max_pixels / frames) pixels, at
    least 1.05 * min_pixels.
    timing: "timestamps" (Qwen3-VL, the defaults above) or "second_per_grid" (Qwen2.5-VL; see the module docstring:
    min / max pixels are then per frame, and the cap is transformers' Qwen2VLVideoProcessor one: each frame gets at
    most 90% of max_video_tokens * factor^2 pixels times temporal_patch_size / frames, at least 1.05 * min_pixels)."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 4096
    max_pixels: int = 25165824
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    timing: str = "timestamps"

    def __post_init__(self):
        if self.timing not in VIDEO_TIMINGS:
            raise ValueError(f"VideoProcessingConfig.timing must be one of {VIDEO_TIMINGS}, got {self.timing!r}")
        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels", "min_frames",
                     "max_frames", "max_video_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"VideoProcessingConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise ValueError(f"VideoProcessingConfig.fps must be positive, got {self.fps}")
        if self.min_frames > self.max_frames:
            raise ValueError(f"VideoProcessingConfig.min_frames ({self.min_frames}) exceeds max_frames "
                             f"({self.max_frames})")
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"VideoProcessingConfig.min_pixels ({self.min_pixels}) exceeds max_pixels "
                             f"({self.max_pixels})")
        if any(s <= 0 for s in self.image_std):
            raise ValueError(f"VideoProcessingConfig.image_std must be positive, got {self.image_std}")

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def sample_indices(total_frames: int, video_fps: float, cfg: VideoProcessingConfig) -> np.ndarray:
    """Which frames of a clip of `total_frames` at `video_fps` are kept: cfg.fps per second of the clip, clamped to
    [min_frames, max_frames] and to the clip's length, evenly spread from the first frame to the last."""
    if total_frames < 1:
        raise ValueError("the video has no frames")
    n = int(total_frames / video_fps * cfg.fps)
    n = min(max(n, cfg.min_frames), cfg.max_frames, total_frames)
    return np.linspace(0, total_frames - 1, n).round().astype(int)


def sample_indices_patched(total_frames: int, video_fps: float, cfg: VideoProcessingConfig) -> np.ndarray:
    """Qwen2.5-VL's rule (transformers' Qwen2VLVideoProcessor.sample_frames at cfg.fps): cfg.fps per second of the
    clip, clamped to [min_frames, max_frames] and to the clip, rounded down to whole temporal patches (at least
    one), taken at a constant float stride from frame 0 (so the last frame is usually not kept)."""
    tp = cfg.temporal_patch_size
    if total_frames < tp:
        raise ValueError(f"a video needs at least {tp} frames (one temporal patch), got {total_frames}")
    if not (math.isfinite(video_fps) and video_fps > 0):
        raise ValueError(f"the video's frame rate must be positive, got {video_fps}")
    most = math.floor(min(cfg.max_frames, total_frames) / tp) * tp
    n = min(max(total_frames / video_fps * cfg.fps, cfg.min_frames), most, total_frames)
    # at least one temporal patch (the clip has one): under min_frames < tp transformers' count rounds to 0 frames
    # and its stride divides by zero
    n = max(math.floor(n / tp), 1) * tp
    # as torch.arange(0, total, total / n).int(): ceil(total / stride) values (n + 1 where the double division
    # lands just above n, as transformers then keeps), i * stride in float32, truncated
    stride = total_frames / n
    count = math.ceil(total_frames / stride)
    return (np.arange(count, dtype=np.float64) * stride).astype(np.float32).astype(int)


def second_per_grid(n_sampled: int, total_frames: int, video_fps: float, temporal_patch_size: int = 2) -> float:
    """Seconds one temporal patch spans (Qwen2.5-VL's second_per_grid_ts): temporal_patch_size / the sampled
    frame rate, n_sampled / total_frames * video_fps, as transformers' processor states it."""
    return temporal_patch_size / (n_sampled / total_frames * video_fps)


def pick_frames(total_frames: int, video_fps: float, cfg: VideoProcessingConfig) -> np.ndarray:
    """The frames cfg's processor keeps of a clip: `sample_indices_patched` for timing "second_per_grid", else
    `sample_indices`."""
    if cfg.timing == "second_per_grid":
        return sample_indices_patched(total_frames, video_fps, cfg)
    return sample_indices(total_frames, video_fps, cfg)


def listed_second_per_grid(frame_indices, video_fps: float, temporal_patch_size: int = 2) -> float:
    """second_per_grid of frames a row lists with their source indices (already sampled, so the clip's length is
    not known): `second_per_grid` of a clip taken to end at the last listed frame. Frames sampled uniformly over a
    whole clip (lmms-eval's and qwen-vl-utils' `nframes`, benchmarks.convert.sampled_video) list its last frame, so
    this is what those give."""
    return second_per_grid(len(frame_indices), int(frame_indices[-1]) + 1, video_fps, temporal_patch_size)


def smart_resize(num_frames: int, height: int, width: int, cfg: VideoProcessingConfig) -> tuple[int, int]:
    """The frame size: sides multiples of cfg.factor, frames x pixels within [min_pixels, max_pixels] (timing
    "second_per_grid": each frame's pixels)."""
    factor, tf = cfg.factor, cfg.temporal_patch_size
    if num_frames < tf:
        raise ValueError(f"a video needs at least {tf} frames (one temporal patch), got {num_frames}")
    if height < 1 or width < 1:
        raise ValueError(f"video frames have an empty side: height={height}, width={width}")
    if cfg.timing == "second_per_grid":
        max_pixels = cfg.max_pixels
        if cfg.cap_pixels_per_frame:
            total = int(cfg.max_video_tokens * factor * factor * 0.9)
            max_pixels = max(min(max_pixels, total * tf // num_frames), int(cfg.min_pixels * 1.05))
        return image_processing.smart_resize(height, width, factor, cfg.min_pixels, max_pixels)
    max_pixels = cfg.max_pixels
    if cfg.cap_pixels_per_frame:
        per_frame = max(min(cfg.max_video_tokens * factor * factor, cfg.max_pixels // num_frames),
                        int(cfg.min_pixels * 1.05))
        max_pixels = per_frame * num_frames
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got "
                         f"{max(height, width) / min(height, width)} for {height}x{width} frames")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / tf) * tf
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < cfg.min_pixels:
        beta = math.sqrt(cfg.min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _resize(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [T, H, W, 3] -> uint8 [T, 3, height, width], as torchvision's resize (antialiased bicubic on uint8)."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).contiguous()
    if x.shape[-2:] != (height, width):
        x = torch.nn.functional.interpolate(x, size=[height, width], mode="bicubic", align_corners=False,
                                            antialias=True)
    return x.numpy()


def preprocess_video(frames: np.ndarray | Sequence[np.ndarray], cfg: VideoProcessingConfig = VideoProcessingConfig()
                     ) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Sampled RGB uint8 frames [T, H, W, 3] (one size) -> (patches [t * h * w, C*tp*ps*ps] float32, (t, h, w))."""
    frames = np.stack(frames) if not isinstance(frames, np.ndarray) else frames
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"video frames must be uint8 [T, H, W, 3], got {frames.dtype} {frames.shape}")
    t, h, w = frames.shape[:3]
    new_h, new_w = smart_resize(t, h, w, cfg)
    x = _resize(frames, new_h, new_w).astype(np.float32)
    # transformers fuses the 1/255 rescale into the normalisation: (x - mean / (1/255)) / (std / (1/255))
    scale = 1.0 / (1 / 255)
    mean = (np.asarray(cfg.image_mean, np.float32) * np.float32(scale)).astype(np.float32)[:, None, None]
    std = (np.asarray(cfg.image_std, np.float32) * np.float32(scale)).astype(np.float32)[:, None, None]
    x = (x - mean) / std
    tp, ps, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if pad := -t % tp:
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)], axis=0)
    gt, gh, gw = x.shape[0] // tp, new_h // ps, new_w // ps
    c = x.shape[1]
    x = x.reshape(gt, tp, c, gh // m, m, ps, gw // m, m, ps)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # (t, h/m, w/m, m, m, C, tp, ps, ps)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * ps * ps)), (gt, gh, gw)


def timestamps(frame_indices: Sequence[int], video_fps: float, temporal_patch_size: int = 2) -> list[float]:
    """Seconds of each temporal group: the mean time of its first and last frame (the last frame repeated to fill
    the final group), as the processor states them."""
    idx = [int(i) for i in frame_indices]
    if not idx:
        raise ValueError("a video needs at least one frame")
    if rem := len(idx) % temporal_patch_size:
        idx.extend([idx[-1]] * (temporal_patch_size - rem))
    secs = [i / video_fps for i in idx]
    return [(secs[k] + secs[k + temporal_patch_size - 1]) / 2 for k in range(0, len(secs), temporal_patch_size)]


def video_placeholder(grid_thw: Sequence[int], times: Sequence[float], merge_size: int = 2) -> str:
    """What the processor puts in place of one `<|video_pad|>`: per temporal group its time and its own block of
    h * w / merge^2 pads (it replaces the chat template's whole `<|vision_start|><|video_pad|><|vision_end|>`)."""
    t, h, w = (int(g) for g in grid_thw)
    if len(times) != t:
        raise ValueError(f"{len(times)} timestamps for a video of {t} temporal groups")
    per_frame = VISION_START + VIDEO_PAD * (h * w // (merge_size * merge_size)) + VISION_END
    return "".join(f"<{s:.1f} seconds>" + per_frame for s in times)


def whole_video_placeholder(grid_thw: Sequence[int], merge_size: int = 2) -> str:
    """Qwen2.5-VL's placeholder of one video: a single vision block of t * h * w / merge^2 pads, no timestamps."""
    t, h, w = (int(g) for g in grid_thw)
    return VISION_START + VIDEO_PAD * (t * h * w // (merge_size * merge_size)) + VISION_END


def frame_grids(grid_thw: Sequence[int]) -> np.ndarray:
    """A video's grid [t, h, w] as t frame items [1, h, w]: the vision tower attends within each and the language
    model positions each as an image of one frame, so the items pack with images."""
    t, h, w = (int(g) for g in grid_thw)
    return np.tile(np.asarray([[1, h, w]], np.int64), (t, 1))


def read_video_file(path: str, wanted, max_pixels: int | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Decodes a video file with PyAV: (frames uint8 [n, H, W, 3] at the indices `wanted(total, fps)` picks, those
    indices, the file's fps). Frames are decoded in order and only the wanted ones kept."""
    try:
        import av
    except ImportError:
        raise ValueError("reading a video file needs PyAV (pip install av); or give the frames as images") from None
    if os.path.exists(path) and not os.path.isfile(path):  # a pipe would block the decoder until killed
        raise ValueError(f"{path} is a folder, a device or a pipe, not a video file")
    try:
        with av.open(path) as container:
            stream = container.streams.video[0]
            fps = float(stream.average_rate or stream.guessed_rate or 0)
            total = stream.frames
            if fps <= 0:
                raise ValueError("the file states no frame rate")
            if max_pixels is not None and stream.width * stream.height > max_pixels:
                raise ValueError(f"{stream.width}x{stream.height} frames are over data.max_image_pixels = "
                                 f"{max_pixels}")
            if not total:  # some containers do not store a frame count: decode once to count
                total = sum(1 for _ in container.decode(stream))
                container.seek(0)
            indices = np.asarray(wanted(total, fps), dtype=int)
            keep = set(indices.tolist())
            frames = {}
            for k, frame in enumerate(container.decode(stream)):
                if k in keep:
                    frames[k] = frame.to_ndarray(format="rgb24")
                if k >= indices[-1]:
                    break
    except av.error.FFmpegError as e:
        raise ValueError(str(e)) from None
    missing = [int(i) for i in indices if int(i) not in frames]
    if missing:
        raise ValueError(f"the file has fewer frames than it states ({total}); frame {missing[0]} is missing")
    return np.stack([frames[int(i)] for i in indices]), indices, fps
