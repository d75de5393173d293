"""The grounding-pretrained base: the tiny Qwen3-VL-shaped policy trained from random initialisation on the synthetic
world, written as a Hugging Face checkpoint (config.json, model.safetensors, the tokenizer) that `from_pretrained`
and transformers both load.

Pre-training is the train job's supervised stage (completion-only cross-entropy on the world's reference
completions) with the vision tower trained too, run to its end in its own run directory (so an interrupted
pre-training resumes), then exported. Everything is a function of the config and its seeds, so the same command on
the same machine writes the same bytes; `manifest.json` records the config, the code revision that wrote it and each
file's SHA-256.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

from spatial_jax.config import ConfigError, to_dict
from spatial_jax.digests import file_hashes
from spatial_jax.models.hf_io import save_pretrained
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.train import train
from spatial_jax.rl.workspace import Workspace

MANIFEST = "manifest.json"


def pretrain_config(cfg: TrainConfig) -> TrainConfig:
    """`cfg` as a pre-training job: its SFT stage alone, no evaluation; refuses what would not be from scratch."""
    if cfg.sft.steps < 1:
        raise ConfigError("sft.steps must be >= 1 for `spatial-jax pretrain`")
    if cfg.policy.checkpoint:
        raise ConfigError("policy.checkpoint must be empty: pre-training starts from random initialisation")
    if not cfg.policy.train_vision:
        raise ConfigError("policy.train_vision must be true: the base's vision tower learns the world too")
    if cfg.policy.lora.rank or cfg.policy.lora.vision_rank:
        raise ConfigError("policy.lora ranks must be 0: pre-training trains every weight")
    return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, steps=0),
                               eval=dataclasses.replace(cfg.eval, after_sft=False, after_rl=False))


def code_revision() -> str:
    """The git commit of the code that runs (suffixed "-dirty" when tracked files differ from it), or "unknown"
    outside a git checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def export(cfg: TrainConfig, out: str | Path) -> dict[str, Any]:
    """Writes the run's final weights as a Hugging Face checkpoint with its tokenizer and manifest; returns the
    manifest."""
    job = Workspace(cfg)
    if job.load_latest() != "sft":
        raise ConfigError(f"{cfg.run_dir} holds no finished pre-training checkpoint")
    out = Path(out)
    save_pretrained(job.model, out)
    job.tok.save(out)
    manifest = {"config": to_dict(cfg), "code_revision": code_revision(), "files": file_hashes(out, skip=MANIFEST)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return manifest


def pretrain(cfg: TrainConfig, out: str | Path) -> dict[str, Any]:
    """Pre-trains (resuming a run directory's unfinished pre-training) and exports to `out`."""
    cfg = pretrain_config(cfg)
    train(cfg)
    return export(cfg, out)
