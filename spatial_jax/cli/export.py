"""`spatial-jax export`: a run's newest checkpoint (RL over SFT) as a Hugging Face checkpoint, adapters merged.

The policy is rebuilt from the run's own settings (its config.json); overrides may lay it out for the machine at
hand (mesh.*). The output holds config.json, the safetensors weights and the tokenizer: transformers'
Qwen3VLForConditionalGeneration loads it, and `policy.checkpoint=<out>` starts a new run from it. In a multi-host job
every process runs the command (the weights are gathered tensor by tensor); the first one writes.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", required=True, help="the run directory (holds config.json and sft/ or rl/)")
    p.add_argument("--out", required=True, help="the folder to write the Hugging Face checkpoint in")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                   help="the saved dtype (default: the policy's parameter dtype)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of the run's config, e.g. mesh.fsdp=1")


def load_run_config(run_dir, overrides):
    """The run's recorded TrainConfig with `overrides` on top (run_dir always the one given)."""
    import json
    from pathlib import Path

    from spatial_jax.config import ConfigError, from_dict, merge, parse_overrides
    from spatial_jax.rl.config import TrainConfig

    recorded = Path(run_dir) / "config.json"
    try:
        data = json.loads(recorded.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--run-dir {run_dir} holds no config.json: not a training run's directory") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{recorded} does not read: {e}") from None
    return from_dict(TrainConfig, merge(data, parse_overrides([*overrides, f"run_dir={run_dir}"])))


def run(args) -> int:
    from pathlib import Path

    import jax

    from spatial_jax import distributed
    from spatial_jax.cli.outputs import check_folder, new_files, refuse_inside, refuse_overwriting
    from spatial_jax.config import ConfigError
    from spatial_jax.rl.workspace import Workspace, has_checkpoint

    cfg = load_run_config(args.run_dir, args.overrides)  # config errors surface before the cluster is joined
    # neither the run nor the base weights it started from may be written over
    refuse_overwriting({"--out": args.out}, [cfg.run_dir, cfg.policy.checkpoint])
    check_folder(args.out, "--out")
    refuse_inside({"--out": args.out}, {"the run directory": cfg.run_dir, "the base checkpoint": cfg.policy.checkpoint})
    if not has_checkpoint(cfg.run_dir):
        raise ConfigError(f"--run-dir {cfg.run_dir} holds no checkpoint (sft/ or rl/) to export")
    out = Path(args.out)
    distributed.initialize()
    ws = Workspace(cfg)
    stage = ws.load_latest()
    # the files are written beside and moved in only where their names are free (cli/outputs.new_files)
    with new_files(out, "--out") as beside, jax.set_mesh(ws.mesh):
        ws.export(beside, dtype=args.dtype)
    if ws.primary:
        print(f"exported the {stage} checkpoint of {cfg.run_dir} to {out}", flush=True)
    return 0
