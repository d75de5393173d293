"""`spatial-jax eval`: score a run's latest checkpoint (or, with --initial, the untrained policy) on a dataset with
greedy decoding.

Prints accuracy overall and per category (sample-weighted) with standard errors, and the method's grounding
figures; writes the summary and per-sample rows as JSON. A run directory without a checkpoint (a typo?) is refused
and left as it was; the output's folder is checked before the work.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="the run's TOML config (default: the embedded tiny CPU job)")
    p.add_argument("--data", default=None, help="JSONL dataset or synthetic:<split>:<n> (default: data.eval)")
    p.add_argument("--output", default=None, help="where to write the JSON report (default: <run_dir>/eval_cli.json)")
    p.add_argument("--initial", action="store_true",
                   help="evaluate the configured policy as built (untrained), not a checkpoint of run_dir")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


def check_writable(path) -> None:
    """ConfigError now, before the work, when `path` cannot be written: its folder must exist and take new files
    (the report is written whole, through a temp file renamed over it)."""
    import tempfile

    from spatial_jax.config import ConfigError

    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(f"--output {path}: the folder {folder} does not exist")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise ConfigError(f"--output {path}: cannot write in {folder} ({e.strerror})") from None


def run(args) -> int:
    import dataclasses
    from pathlib import Path

    import jax

    from spatial_jax import distributed
    from spatial_jax.config import ConfigError, load
    from spatial_jax.data.pipeline import eval_iterator
    from spatial_jax.eval.evaluate import evaluate
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.report import write_json
    from spatial_jax.rl.workspace import Workspace, has_checkpoint
    from spatial_jax.rollout.collect import ToolSettings

    cfg = load(TrainConfig, args.config, args.overrides)  # config errors surface before the cluster is joined
    if not args.initial and not has_checkpoint(cfg.run_dir):
        raise ConfigError(f"run_dir {cfg.run_dir} holds no checkpoint (sft/ or rl/) to evaluate; pass --initial to "
                          "evaluate the untrained policy on purpose")
    out = Path(args.output or Path(cfg.run_dir) / "eval_cli.json")
    check_writable(out)
    distributed.initialize()
    if args.data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval=args.data))
    ws = Workspace(cfg)
    stage = None if args.initial else ws.load_latest()
    if ws.primary:
        print(f"evaluating {'the ' + stage + ' checkpoint' if stage else 'the initial policy'} of {cfg.run_dir} "
              f"on {cfg.data.eval}", flush=True)
    with jax.set_mesh(ws.mesh):
        it = eval_iterator(cfg.data, ws.tok, ws.method.prompt, cfg.eval.batch_size, image_cfg=ws.policy.image_cfg)
        summary, rows = evaluate(ws.model, ws.tok, it, ws.method, ws.reward_cfg, cfg.eval.max_new_tokens,
                                 cfg.eval.max_samples,
                                 tools=ToolSettings(cfg.rl.max_tool_turns, cfg.rl.max_tool_tokens),
                                 blank_fill=cfg.rl.blank_fill, image_cfg=ws.policy.image_cfg)
    if not ws.primary:  # multi-host: the first process writes the report
        return 0
    write_json(out, {"checkpoint": stage, "data": cfg.data.eval, "summary": summary, "rows": rows}, indent=1)
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")
    return 0
