"""`spatial-jax pretrain`: train the tiny Qwen3-VL-shaped base from scratch on the synthetic world and write it as a
Hugging Face checkpoint (configs/pretrain_tiny.toml writes checkpoints/tiny_base, the main job's starting point).

--out is a folder output (cli/outputs.new_files): a folder that already holds files, the shipped base included, is
refused before training starts, and the checkpoint is written beside and moved in once complete."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="configs/pretrain_tiny.toml", help="the pre-training job's TOML file")
    p.add_argument("--out", default="checkpoints/tiny_base", help="the checkpoint directory to write")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. sft.steps=100")


def run(args) -> int:
    import os

    from spatial_jax.cli.outputs import check_folder, new_files, refuse_overwriting
    from spatial_jax.config import ConfigError, config_files, load
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.pretrain import pretrain

    cfg = load(TrainConfig, args.config, args.overrides)
    refuse_overwriting({"--out": args.out}, [*config_files(args.config), cfg.run_dir])
    check_folder(args.out, "--out")
    if os.path.isdir(args.out) and os.listdir(args.out):  # known now, not after the training
        raise ConfigError(f"--out {args.out} already holds files: a base is written into a new or empty folder")
    with new_files(args.out, "--out") as beside:
        manifest = pretrain(cfg, beside)
    print(f"wrote {args.out}: " + ", ".join(f"{name} {digest[:12]}" for name, digest in manifest["files"].items()))
    return 0
