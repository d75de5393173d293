"""The pipeline's image and video settings written as transformers reads them beside a checkpoint
(preprocessor_config.json, video_preprocessor_config.json): AutoImageProcessor, and AutoProcessor (its video
processor needs torchvision), on an export preprocess as the policy was trained, pixel budgets included.

Which transformers classes the files name is the architecture's (the model registry's `processor_files`, handed in
by the caller: the data layer names no architecture): Qwen3-VL and Qwen3-VL-MoE read them with Qwen3VLProcessor
and Qwen3VLVideoProcessor, Qwen2.5-VL with Qwen2_5_VLProcessor and Qwen2VLVideoProcessor. What the files hold is
the configs' own: the patch layout, normalisation, pixel budgets (the video's per frame where its timing is
"second_per_grid", as Qwen2VLVideoProcessor reads `size`), frame sampling and the per-frame cap."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.data.video_processing import VideoProcessingConfig

CLASS_KEYS = ("processor_class", "image_processor_type", "video_processor_type")


def _check(classes: Mapping[str, str]) -> None:
    if sorted(classes) != sorted(CLASS_KEYS) or not all(isinstance(v, str) and v for v in classes.values()):
        raise ValueError(f"processor classes need exactly {CLASS_KEYS} as names, got {dict(classes)!r}")


def _shared(cfg: ImageProcessingConfig | VideoProcessingConfig, processor_class: str) -> dict[str, Any]:
    return {"processor_class": processor_class,
            "size": {"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
            "patch_size": cfg.patch_size, "temporal_patch_size": cfg.temporal_patch_size,
            "merge_size": cfg.merge_size, "image_mean": list(cfg.image_mean), "image_std": list(cfg.image_std),
            "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "do_convert_rgb": True}


def image_processor_config(cfg: ImageProcessingConfig, classes: Mapping[str, str]) -> dict[str, Any]:
    """preprocessor_config.json: the image processor of `classes` (Qwen2VLImageProcessor for every registered
    architecture, the class whose PIL backend data/image_processing.py follows)."""
    _check(classes)
    return {"image_processor_type": classes["image_processor_type"], **_shared(cfg, classes["processor_class"])}


def video_processor_config(cfg: VideoProcessingConfig, classes: Mapping[str, str]) -> dict[str, Any]:
    """video_preprocessor_config.json: the video processor of `classes`, sampling frames as
    data/video_processing.py does (do_sample_frames at cfg.fps within [min_frames, max_frames]). The per-frame cap
    is written out, on or off: transformers warns that its unset default will turn it on."""
    _check(classes)
    return {"video_processor_type": classes["video_processor_type"], **_shared(cfg, classes["processor_class"]),
            "do_sample_frames": True, "fps": cfg.fps, "min_frames": cfg.min_frames, "max_frames": cfg.max_frames,
            "cap_pixels_per_frame": cfg.cap_pixels_per_frame, "max_video_tokens": cfg.max_video_tokens}


def write_processor_configs(folder: str | Path, image_cfg: ImageProcessingConfig, video_cfg: VideoProcessingConfig,
                            classes: Mapping[str, str]) -> None:
    """Both files in `folder`; `classes`: the architecture's processor_files (models.registry)."""
    folder = Path(folder)
    configs = (("preprocessor_config.json", image_processor_config(image_cfg, classes)),
               ("video_preprocessor_config.json", video_processor_config(video_cfg, classes)))
    for name, config in configs:
        (folder / name).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
