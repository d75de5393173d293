"""The pipeline's image and video settings written as transformers reads them beside a checkpoint
(preprocessor_config.json, video_preprocessor_config.json): AutoImageProcessor, and AutoProcessor (its video
processor needs torchvision), on an export preprocess as the policy was trained, pixel budgets included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.data.video_processing import VideoProcessingConfig

PROCESSOR_CLASS = "Qwen3VLProcessor"


def _shared(cfg: ImageProcessingConfig | VideoProcessingConfig) -> dict[str, Any]:
    return {"processor_class": PROCESSOR_CLASS,
            "size": {"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
            "patch_size": cfg.patch_size, "temporal_patch_size": cfg.temporal_patch_size,
            "merge_size": cfg.merge_size, "image_mean": list(cfg.image_mean), "image_std": list(cfg.image_std),
            "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "do_convert_rgb": True}


def image_processor_config(cfg: ImageProcessingConfig) -> dict[str, Any]:
    """preprocessor_config.json: Qwen2VLImageProcessor, the class (PIL backend) data/image_processing.py follows."""
    return {"image_processor_type": "Qwen2VLImageProcessor", **_shared(cfg)}


def video_processor_config(cfg: VideoProcessingConfig) -> dict[str, Any]:
    """video_preprocessor_config.json: Qwen3VLVideoProcessor, frames sampled as data/video_processing.py does."""
    return {"video_processor_type": "Qwen3VLVideoProcessor", **_shared(cfg), "do_sample_frames": True, "fps": cfg.fps,
            "min_frames": cfg.min_frames, "max_frames": cfg.max_frames}


def write_processor_configs(folder: str | Path, image_cfg: ImageProcessingConfig,
                            video_cfg: VideoProcessingConfig) -> None:
    folder = Path(folder)
    for name, config in (("preprocessor_config.json", image_processor_config(image_cfg)),
                         ("video_preprocessor_config.json", video_processor_config(video_cfg))):
        (folder / name).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
