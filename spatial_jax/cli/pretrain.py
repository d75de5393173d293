"""`spatial-jax pretrain`: train the tiny Qwen3-VL-shaped base from scratch on the synthetic world and write it as a
Hugging Face checkpoint (configs/pretrain_tiny.toml writes checkpoints/tiny_base, the main job's starting point)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="configs/pretrain_tiny.toml", help="the pre-training job's TOML file")
    p.add_argument("--out", default="checkpoints/tiny_base", help="the checkpoint directory to write")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. sft.steps=100")


def run(args) -> int:
    from spatial_jax.cli.outputs import refuse_overwriting
    from spatial_jax.config import load
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.pretrain import pretrain

    cfg = load(TrainConfig, args.config, args.overrides)
    refuse_overwriting({"--out": args.out}, [args.config, cfg.run_dir])
    manifest = pretrain(cfg, args.out)
    print(f"wrote {args.out}: " + ", ".join(f"{name} {digest[:12]}" for name, digest in manifest["files"].items()))
    return 0
