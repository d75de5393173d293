"""`spatial-jax eval`: score a run's latest checkpoint (or the configured policy) on a dataset with greedy decoding.

Prints accuracy overall and per category (sample-weighted) with standard errors, and the method's grounding
figures; writes the summary and per-sample rows as JSON.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="the run's TOML config (default: the embedded tiny CPU job)")
    p.add_argument("--data", default=None, help="JSONL dataset or synthetic:<split>:<n> (default: data.eval)")
    p.add_argument("--output", default=None, help="where to write the JSON report (default: <run_dir>/eval_cli.json)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


def run(args) -> int:
    import dataclasses
    from pathlib import Path

    import jax

    from spatial_jax import distributed
    from spatial_jax.config import load
    from spatial_jax.data.pipeline import eval_iterator
    from spatial_jax.eval.evaluate import evaluate
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.workspace import Workspace
    from spatial_jax.rollout.collect import ToolSettings

    cfg = load(TrainConfig, args.config, args.overrides)  # config errors surface before the cluster is joined
    distributed.initialize()
    if args.data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval=args.data))
    ws = Workspace(cfg)
    stage = ws.load_latest()
    if ws.primary:
        print(f"evaluating {'the ' + stage + ' checkpoint' if stage else 'the initial policy'} of {cfg.run_dir} "
              f"on {cfg.data.eval}", flush=True)
    with jax.set_mesh(ws.mesh):
        it = eval_iterator(cfg.data, ws.tok, ws.method.prompt, cfg.eval.batch_size, image_cfg=ws.policy.image_cfg)
        summary, rows = evaluate(ws.model, ws.tok, it, ws.method, ws.reward_cfg, cfg.eval.max_new_tokens,
                                 cfg.eval.max_samples, tools=ToolSettings(cfg.rl.max_tool_turns, cfg.rl.max_tool_tokens),
                                 blank_fill=cfg.rl.blank_fill, image_cfg=ws.policy.image_cfg)
    if not ws.primary:  # multi-host: the first process writes the report
        return 0
    out = Path(args.output or Path(cfg.run_dir) / "eval_cli.json")
    out.write_text(json.dumps({"checkpoint": stage, "data": cfg.data.eval, "summary": summary, "rows": rows},
                              indent=1))
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")
    return 0
