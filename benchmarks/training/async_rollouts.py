"""RL step time with rollouts sampled one step off the update (rl.rollout_mode = "one_step_off") against "sync",
side by side in one process, on the main job's policy and shapes over 8 virtual CPU devices.

    python benchmarks/training/async_rollouts.py [--steps 6] [--warmup 2] [--out benchmarks/out/async_rollouts]
        [key=value ...]

Arms, each a fresh RL stage of the main job (configs/tiny_cpu.toml: 8 prompts x 8 rollouts of up to 192 tokens,
shared-prefix update) from the shipped base, no SFT and no evaluation, same seed:
- sync on 8 devices (mesh.data=8; the decoding copy on the same 8),
- sync on 4 devices (mesh.data=4),
- one_step_off on the same 8 devices (decode.devices=0: overlap of the host's work only),
- one_step_off on 4 + 4 (mesh.data=4, decode.devices=4: the rollout mesh of its own).
Per arm: median seconds per RL step over the steps after `warmup` (compiles fall in those) but the last (which
one_step_off does not sample ahead of), its rollout seconds
(sampling and scoring, in the thread for one_step_off), update seconds, and how long the update's step waited for
the rollouts ahead; then the ratio of each arm's step time to sync on 8 devices, and the process's peak RSS after
the arm. Each arm's own figures are the mean reward and rollout lag it logged, so a fast arm that learns nothing
would show.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import datetime
import json
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import jax

from spatial_jax.cli.job_config import load_job
from spatial_jax.cli.script_guard import check_counts, claim_folder, write_own
from spatial_jax.config import ConfigError
from spatial_jax.platforms import cpu_name
from spatial_jax.rl import train as train_module

OWNER = Path(__file__).name
ARMS = {
    "sync, 8 devices": ["mesh.data=8"],
    "sync, 4 devices": ["mesh.data=4"],
    "one_step_off, the same 8 devices": ["mesh.data=8", "rl.rollout_mode=one_step_off"],
    "one_step_off, 4 + 4 devices": ["mesh.data=4", "decode.devices=4", "rl.rollout_mode=one_step_off"],
}


def run_arm(name: str, overrides: list[str], out: Path, steps: int) -> dict:
    """One RL stage of `steps` steps; the wall time of each step as the stage loop sees it."""
    run = out / name.replace(",", "").replace(" ", "_").replace("+", "plus")
    shutil.rmtree(run, ignore_errors=True)
    cfg = load_job(None, [f"run_dir={run}", "sft.steps=0", f"rl.steps={steps}", "eval.after_sft=false",
                          "eval.after_rl=false", "export_hf=false", "tensorboard=false", "progress=false",
                          *overrides])
    times: list[float] = []
    step_fn = train_module.Trainer.rl_step

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        result = step_fn(self, *args, **kwargs)
        times.append(time.perf_counter() - t0)
        return result

    train_module.Trainer.rl_step = timed
    try:
        train_module.train(cfg)
    finally:
        train_module.Trainer.rl_step = step_fn
    rows = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    for row, seconds in zip(rows, times):
        row["step_s"] = seconds
    return {"rows": rows, "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def summarise(arm: dict, warmup: int) -> dict:
    # the last step is left out too: one_step_off has no next batch to sample there
    rows = arm["rows"][warmup:-1]
    tokens = [r["rollout_tokens_per_s"] for r in rows]
    return {"step_s": statistics.median(r["step_s"] for r in rows),
            "update_tokens_per_s": statistics.median(r["train_tokens_per_s"] for r in rows),
            "rollout_tokens_per_s": statistics.median(tokens),
            "wait_s": statistics.median(r.get("rollout/wait_s", 0.0) for r in rows),
            "lag": max(r["rollout/lag"] for r in rows), "reward": statistics.mean(r["reward_mean"] for r in rows),
            "steps": len(rows), "peak_rss_gib": arm["peak_rss_gib"]}


def table(results: dict[str, dict], steps: int, warmup: int, overrides: list[str]) -> str:
    base = results["sync, 8 devices"]["step_s"]
    job = " ".join(["configs/tiny_cpu.toml", *overrides])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [f"RL steps of the main job ({job}), 8 prompts x 8 rollouts, median of steps {warmup + 1}-{steps - 1}; "
             f"{jax.device_count()} virtual CPU devices on {os.cpu_count()} cores ({cpu_name()}), load average at the "
             f"end {load}; {datetime.date.today()}", "",
             "| arm | s per step | vs sync on 8 | waited for rollouts, s | rollout tokens/s | update tokens/s | "
             "lag | mean reward | peak RSS after, GiB |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['step_s']:.2f} | {base / r['step_s']:.2f}x | {r['wait_s']:.2f} | "
                     f"{r['rollout_tokens_per_s']:.0f} | {r['update_tokens_per_s']:.0f} | {r['lag']:.0f} | "
                     f"{r['reward']:.3f} | {r['peak_rss_gib']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out (they compile)")
    p.add_argument("--out", default="benchmarks/out/async_rollouts")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    if not 0 <= args.warmup < args.steps - 1:
        p.error("--warmup must leave at least one of --steps measured (the last is not)")
    if "sync, 8 devices" not in args.arms:
        p.error("the ratios are against 'sync, 8 devices': keep that arm")
    try:
        check_counts({"--steps": (args.steps, 2, 1000)})
        out = claim_folder(args.out, "--out", OWNER)  # each arm's run folder in it is cleared first
    except ConfigError as e:
        p.error(str(e))
    results = {}
    for name in args.arms:
        print(f"== {name}", file=sys.stderr, flush=True)
        results[name] = summarise(run_arm(name, [*ARMS[name], *args.overrides], out, args.steps), args.warmup)
    text = table(results, args.steps, args.warmup, args.overrides)
    print(text)
    write_own(out / "table.md", text, OWNER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
