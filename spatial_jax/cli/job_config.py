"""Which TOML file a job command reads when `--config` is not given: the README main job, `configs/tiny_cpu.toml` of
this checkout (the grounding-pretrained tiny base on the learnable synthetic world). SPATIAL_JAX_DEFAULT_CONFIG names
another file, or, empty, none: the job is then TrainConfig's own defaults (the tiny random policy on the default
world, which the tests run)."""

from __future__ import annotations

import os
from pathlib import Path

from spatial_jax.config import config_files, load

ENV = "SPATIAL_JAX_DEFAULT_CONFIG"
MAIN_JOB = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.toml"


def default_config() -> Path | None:
    value = os.environ.get(ENV)
    if value is None:
        return MAIN_JOB
    return Path(value) if value else None


def job_path(config: str | None) -> str | Path | None:
    """The TOML file a job command reads: `config`, or the default above when none is given."""
    return config if config is not None else default_config()


def load_job(config: str | None, overrides):
    """The TrainConfig of a job command: its file (job_path), then the key=value overrides."""
    from spatial_jax.rl.config import TrainConfig

    return load(TrainConfig, job_path(config), overrides)


def job_files(config: str | None) -> list[Path]:
    """The files a job command reads its settings from: its file (job_path) and the bases it names; the output
    guards count them among the command's inputs."""
    path = job_path(config)
    return [] if path is None else config_files(path)
