"""`spatial-jax train`: the whole job (optional SFT, evaluation, GRPO/GSPO, evaluation) for one run directory."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None,
                   help="a TOML file in configs/ (default: the README main job, configs/tiny_cpu.toml)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. rl.steps=10")


def load_config(args):
    from spatial_jax.cli.job_config import load_job

    return load_job(args.config, args.overrides)


def run(args) -> int:
    from spatial_jax import distributed
    from spatial_jax.rl.train import train

    cfg = load_config(args)  # config errors surface before the cluster is joined
    distributed.initialize()
    train(cfg)
    return 0
