"""`spatial-jax sft`: the supervised cold start alone (the train job with its RL stage switched off)."""

from __future__ import annotations

import dataclasses

from spatial_jax.cli.train import add_arguments, load_config  # noqa: F401 (the dispatcher calls add_arguments)


def run(args) -> int:
    from spatial_jax import distributed
    from spatial_jax.config import ConfigError
    from spatial_jax.rl.train import train

    cfg = load_config(args)
    if cfg.sft.steps < 1:
        raise ConfigError("sft.steps must be >= 1 for `spatial-jax sft`")
    distributed.initialize()
    train(dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, steps=0)))
    return 0
