"""The rollout-trainer gap in bfloat16 (issue 45): the gap per step, and learning with the sampler's old log-probs,
the trainer's, and the trainer's with truncated importance sampling, side by side over paired seeds.

    python benchmarks/papers/rollout_gap.py [--config configs/tiny_cpu.toml] [--seeds 0 1 2] [--out
        benchmarks/out/rollout_gap]
                                     [--gap-config configs/allospatial_cpu.toml ...] [--results benchmarks/RESULTS.md]
                                     [key=value ...]

Every run computes in bfloat16 over float32 master weights (policy.dtype = bfloat16) and decodes from a bfloat16
copy (decode.dtype = bfloat16): the recipes' setting. Per seed: the job's SFT stage gives the start (trained once and
shared by every seed where it draws nothing from the seed, as benchmarks/papers/papers.py does; with sft.steps = 0 the
arms start from the job's policy), then one RL run per arm from it, with the same steps, seed and start; the arms differ
only in rl.old_logp and rl.correction. Reported per arm: the held-out accuracy and matched IoU after RL, the gap
(gap/*: the sampler's log-probs against the trainer's first forward, mean over steps; abs max the max over steps),
the first call's largest ratio and clipped share (the arms' updates differ only where these do), TIS's truncated
share and the time of the trainer's extra forward; each as mean ± standard error over seeds, with the paired
differences against the sampler arm and their verdicts. --gap-config adds, per seed, one sampler-arm run of another
job (a multi-turn method) for its gap alone. key=value overrides apply to every run. Runs are resumable.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import driver_args
import jax
import learning
import numpy as np
import paper_tables
import papers

from spatial_jax import config as C
from spatial_jax.cli import one_line_errors
from spatial_jax.cli.script_guard import claim_folder
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.metrics import read_metrics
from spatial_jax.rl.train import train

BF16 = ["policy.dtype=bfloat16", "decode.dtype=bfloat16"]
# arm -> (run directory, overrides)
ARMS = {
    "sampler pi_old": ("sampler", ["rl.old_logp=sampler"]),
    "trainer pi_old": ("trainer", ["rl.old_logp=trainer"]),
    "trainer pi_old + TIS": ("trainer_tis", ["rl.old_logp=trainer", "rl.correction.tis=token"]),
}
SHORT = {"sampler pi_old": "sampler", "trainer pi_old": "trainer", "trainer pi_old + TIS": "trainer + TIS"}
LEARNING = ("accuracy", "matched IoU")
GAP = ("gap mean abs(d)", "gap max abs(d)", "gap KL (k3)", "seq log-ratio std", "first-call ratio max", "clip frac",
       "TIS truncated", "old_logp forward s", "update s")
# figure -> (metric, reduction over steps); times by their median, which leaves out the first step's compile
STEP_FIGURES = {"gap mean abs(d)": ("gap/abs_mean", np.mean), "gap max abs(d)": ("gap/abs_max", np.max),
                "gap KL (k3)": ("gap/kl", np.mean), "seq log-ratio std": ("gap/seq_log_ratio_std", np.mean),
                "first-call ratio max": ("loss/ratio_max", np.mean), "clip frac": ("loss/clip_frac", np.mean),
                "TIS truncated": ("correction/tis_truncated_frac", np.mean),
                "old_logp forward s": ("time/old_logp_s", np.median), "update s": ("time/update_s", np.median)}
BEGIN, END = "<!-- rollout_gap.py: begin -->", "<!-- rollout_gap.py: end -->"


def step_figures(run_dir: Path) -> dict[str, float | None]:
    """The gap, ratio, correction and time figures of an RL run, reduced over its steps (None where not logged)."""
    rows = read_metrics(run_dir / "rl" / "metrics.jsonl")
    out = {}
    for name, (key, reduce) in STEP_FIGURES.items():
        values = [r[key] for r in rows if r.get(key) is not None]
        out[name] = float(reduce(values)) if values else None
    return out


def run_seed(config: str, out: Path, seed: int, overrides: list[str], gap_configs: list[str]) -> dict[str, dict]:
    """{arm: figures} for one seed, and {gap config: step figures} for each --gap-config."""
    quiet = [*papers.QUIET, *BF16]
    start_cfg = C.load(TrainConfig, config, [f"seed={seed}", *quiet, *overrides, "rl.steps=0"])
    start: list[str] = []
    if start_cfg.sft.steps > 0:
        shared = papers.seed_free(start_cfg)
        sft_dir = out / "sft_start" if shared else out / f"seed{seed}" / "sft_start"
        cfg = C.load(TrainConfig, config, [f"run_dir={sft_dir}", f"seed={0 if shared else seed}", *quiet,
                                           *overrides, "rl.steps=0", "eval.after_sft=false", "export_hf=true"])
        train(cfg)
        start = [f"policy.checkpoint={sft_dir / 'hf'}", "sft.steps=0"]
    rows: dict[str, dict] = {}
    for name, (directory, extra) in ARMS.items():
        run_dir = out / f"seed{seed}" / directory
        cfg = C.load(TrainConfig, config, [f"run_dir={run_dir}", f"seed={seed}", *quiet, *overrides, *start, *extra])
        summary = train(cfg).get("after_rl")
        figures = learning.figures(summary) if summary else dict.fromkeys(LEARNING)
        rows[name] = {**{c: figures[c] for c in LEARNING}, **step_figures(run_dir)}
    for gap_config in gap_configs:
        run_dir = out / f"seed{seed}" / f"gap_{Path(gap_config).stem}"
        cfg = C.load(TrainConfig, gap_config, [f"run_dir={run_dir}", f"seed={seed}", *quiet, *overrides,
                                               "eval.after_sft=false", "eval.after_rl=false"])
        train(cfg)
        rows[gap_config] = step_figures(run_dir)
    return rows


def small(values: list[float | None]) -> str:
    """Mean ± standard error over seeds to three significant digits (the gap's figures run from 1e-6 to 1)."""
    x = np.array([v for v in values if v is not None], np.float64)
    if x.size == 0:
        return "n/a"
    if x.size == 1:
        return f"{x[0]:.3g}"
    return f"{x.mean():.3g} ± {x.std(ddof=1) / np.sqrt(x.size):.2g}"


def tables(per_seed: list[dict], seeds: list[int], note: str, gap_configs: list[str]) -> str:
    arms = tuple(ARMS)
    base = arms[0]
    pairs = [(a, base) for a in arms[1:]]
    lines = [f"Seeds {', '.join(map(str, seeds))}: mean ± standard error over seeds, bfloat16 compute and decoding "
             f"copy; the last columns are paired differences against the sampler arm, seed by seed. {note}", ""]
    lines += paper_tables.figures_table(per_seed, LEARNING, arms, pairs, SHORT)
    lines += ["", "The gap and the updates, mean ± standard error over seeds (three significant digits).", "",
              "| figure | " + " | ".join(SHORT[a] for a in arms) + " |", "|---|" + "---|" * len(arms)]
    for column in GAP:
        lines.append(f"| {column} | " + " | ".join(small([s[a][column] for s in per_seed]) for a in arms) + " |")
    claims = tuple((f"{SHORT[a]} learns more than {SHORT[base]} (accuracy)", "accuracy", a, base) for a in arms[1:])
    lines += ["", *paper_tables.claims_table(per_seed, claims)]
    if gap_configs:
        lines += ["", "The gap of other jobs (sampler arm), mean ± standard error over seeds.", "",
                  "| job | " + " | ".join(GAP[:4]) + " |", "|---|" + "---|" * 4]
        for g in gap_configs:
            lines.append(f"| {g} | " + " | ".join(small([s[g][c] for s in per_seed]) for c in GAP[:4]) + " |")
    return "\n".join(lines)


# what every run's settings take from the driver (papers.py's OWNED)
# (policy.checkpoint is the job's to set: with sft.steps = 0 the arms start from it)
OWNED = {"run_dir": "--out", "seed": "--seeds"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny_cpu.toml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="benchmarks/out/rollout_gap")
    p.add_argument("--gap-config", action="append", default=[], dest="gap_configs",
                   help="another job whose gap alone is measured (repeatable)")
    p.add_argument("--results", default=None, help="RESULTS.md to write the tables into")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    return p.parse_args(argv)


def validate(args: argparse.Namespace) -> None:
    """Every run's settings, before the first run starts."""
    driver_args.check(args, OWNED, inputs=args.gap_configs)
    for seed in args.seeds:
        for _, extra in ARMS.values():
            cfg = C.load(TrainConfig, args.config, [f"seed={seed}", *BF16, *args.overrides, *extra])
            if cfg.rl.steps == 0:
                raise C.ConfigError("rl.steps=0: the arms differ only in their RL stage")
        for g in args.gap_configs:
            C.load(TrainConfig, g, [f"seed={seed}", *BF16, *args.overrides])


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    return one_line_errors("rollout_gap.py", lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    validate(args)
    out = claim_folder(args.out, "--out", "rollout_gap.py")
    # every run compiles the same programs: XLA's persistent cache compiles each once (the settings are put back
    # after, so a caller's process keeps its own)
    cache = {"jax_compilation_cache_dir": str(out / "jax_cache"), "jax_persistent_cache_min_compile_time_secs": 1.0}
    saved = {k: getattr(jax.config, k) for k in cache}
    for k, v in cache.items():
        jax.config.update(k, v)
    t0 = time.perf_counter()
    try:
        per_seed = [run_seed(args.config, out, s, list(args.overrides), args.gap_configs) for s in args.seeds]
    finally:
        for k, v in saved.items():
            jax.config.update(k, v)
    minutes = (time.perf_counter() - t0) / 60
    note = (f"Config {args.config}" + (f" with {' '.join(args.overrides)}" if args.overrides else "") +
            f"; {minutes:.0f} min wall.")
    text = tables(per_seed, args.seeds, note, args.gap_configs)
    print(text)
    if args.results:
        learning.write_results(Path(args.results), text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
