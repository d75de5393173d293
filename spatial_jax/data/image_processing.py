"""Qwen3-VL image preprocessing in numpy + PIL: images -> flattened patches + image_grid_thw.

Reproduces Hugging Face's Qwen2VLImageProcessor (PIL backend, the class Qwen3-VL's processor uses) with Qwen3-VL's
released preprocessor_config.json: convert to RGB (alpha composited onto white), resize with PIL bicubic to the
`smart_resize` size, rescale by 1/255 (float64, then float32), normalise with mean = std = 0.5, then lay out each
image as (grid_h/m, grid_w/m, m, m) patches of (C, temporal, ps, ps) values, the single frame repeated over the
temporal patch. No torch at run time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

ImageLike = Image.Image | np.ndarray

MAX_ASPECT_RATIO = 200
VIDEO_TIMINGS = ("timestamps", "second_per_grid")  # see video_processing.VideoProcessingConfig.timing


@dataclasses.dataclass(frozen=True)
class ImageProcessingConfig:
    """Defaults are Qwen3-VL's preprocessor_config.json (size.shortest_edge / longest_edge = min / max pixels).

    video_timing: how the model places a video in time, which picks the video processor the pipeline derives from
    this one (data.visuals.video_config): "timestamps" (Qwen3-VL) or "second_per_grid" (Qwen2.5-VL, whose vision
    config has tokens_per_second; rl.policy.image_config sets it from the model)."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65536
    max_pixels: int = 16777216
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    video_timing: str = "timestamps"

    def __post_init__(self):
        if self.video_timing not in VIDEO_TIMINGS:
            raise ValueError(f"ImageProcessingConfig.video_timing must be one of {VIDEO_TIMINGS}, got "
                             f"{self.video_timing!r}")
        for name in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"ImageProcessingConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.min_pixels > self.max_pixels:
            raise ValueError(
                f"ImageProcessingConfig.min_pixels ({self.min_pixels}) exceeds max_pixels ({self.max_pixels})"
            )
        if len(self.image_mean) != 3 or len(self.image_std) != 3:
            raise ValueError("ImageProcessingConfig.image_mean and image_std need 3 values (RGB)")
        if any(s <= 0 for s in self.image_std):
            raise ValueError(f"ImageProcessingConfig.image_std must be positive, got {self.image_std}")

    @property
    def factor(self) -> int:
        """Both resized sides are multiples of this: one merged token covers factor x factor pixels."""
        return self.patch_size * self.merge_size


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(h, w) rounded to multiples of `factor` with h * w in [min_pixels, max_pixels], aspect ratio kept closely."""
    if height < 1 or width < 1:
        raise ValueError(f"image has an empty side: height={height}, width={width}")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, "
            f"got {max(height, width) / min(height, width)} for a {height}x{width} image"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _to_rgb(image: ImageLike) -> Image.Image:
    """A PIL RGB image; transparency is composited onto white, grey is repeated over the 3 channels."""
    if isinstance(image, Image.Image):
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, rgba).convert("RGB")
        return image.convert("RGB")
    if not isinstance(image, np.ndarray):
        raise TypeError(f"expected a PIL image or a numpy array, got {type(image).__name__}")
    if image.dtype != np.uint8:
        raise TypeError(f"numpy images must be uint8 (H, W[, C]), got dtype {image.dtype}")
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[-1] not in (1, 3, 4):
        raise ValueError(f"numpy images must be (H, W), (H, W, 1), (H, W, 3) or (H, W, 4); got {image.shape}")
    if image.shape[-1] == 1:
        image = np.repeat(image, 3, axis=-1)
    elif image.shape[-1] == 4:
        alpha = image[..., 3:4] / 255
        image = np.round(alpha * image[..., :3] + (1 - alpha) * 255).astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(image), mode="RGB")


def _patchify(image: np.ndarray, cfg: ImageProcessingConfig) -> tuple[np.ndarray, int, int]:
    """(C, H, W) -> ([grid_h * grid_w, C * tp * ps * ps], grid_h, grid_w), patches of one merge window adjacent."""
    c, h, w = image.shape
    ps, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = h // ps, w // ps
    x = image.reshape(c, gh // m, m, ps, gw // m, m, ps)
    x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, ps, ps)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], tp, ps, ps))  # one frame fills the temporal patch
    return x.reshape(gh * gw, c * tp * ps * ps), gh, gw


def preprocess_one(image: ImageLike, cfg: ImageProcessingConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """One image -> (patches [grid_h * grid_w, C*tp*ps*ps] float32, (1, grid_h, grid_w))."""
    rgb = _to_rgb(image)
    height, width = rgb.height, rgb.width
    new_h, new_w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    resized = np.asarray(rgb.resize((new_w, new_h), resample=Image.Resampling.BICUBIC))
    x = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)
    std = np.asarray(cfg.image_std, dtype=np.float32)
    x = ((x - mean) / std).transpose(2, 0, 1)
    patches, gh, gw = _patchify(x, cfg)
    return patches, (1, gh, gw)


def preprocess(images: Sequence[ImageLike], cfg: ImageProcessingConfig = ImageProcessingConfig()):
    """Images -> (pixel_values [sum of patches, C*tp*ps*ps] float32, image_grid_thw [n, 3] int64), in input order."""
    if isinstance(images, (Image.Image, np.ndarray)):
        images = [images]
    if len(images) == 0:
        raise ValueError("preprocess needs at least one image")
    outs = [preprocess_one(im, cfg) for im in images]
    pixel_values = np.concatenate([p for p, _ in outs], axis=0)
    grid_thw = np.asarray([g for _, g in outs], dtype=np.int64)
    return pixel_values, grid_thw


def num_image_tokens(grid_thw, merge_size: int = 2) -> np.ndarray:
    """Language-model placeholder tokens per image: t * h * w / merge_size^2 (one per merged window)."""
    g = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    return g.prod(axis=-1) // (merge_size * merge_size)
