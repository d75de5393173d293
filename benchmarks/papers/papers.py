"""A paper's headline tables in miniature, from one command:

    python benchmarks/papers/papers.py --paper {allospatial,prosr,spatialthinker} [--config F] [--seeds 0 1 2]
                                [--out benchmarks/out/papers] [--results benchmarks/RESULTS.md] [key=value ...]

Per seed: the paper's SFT starts (the job's SFT stage, its held-out evaluation, exported as a Hugging Face checkpoint;
one start, or one per pipeline the paper compares), then one RL run per arm of the paper from its start, every arm
with the same steps and seed; the arms differ only in their settings. A start whose training and evaluation draw
nothing from the seed (no LoRA dropout, greedy evaluation without ProSR's sampled diagnostics: the data order is
data.seed's) is trained once and shared by every seed. --config defaults to the paper's job; key=value overrides
apply to every run. Runs are resumable: the command run again finishes what is not done. The tables are printed and,
with --results, written into that file between the paper's markers.

Papers: allospatial (benchmarks/papers/paper_allospatial.py: harness RL with tools against question-answer-only RL,
and GSPO against GRPO, Table 4); prosr (benchmarks/papers/paper_prosr.py: vanilla GRPO against ProSR on a world with a
language prior, Tables 2 and 4); spatialthinker (benchmarks/papers/paper_spatialthinker.py: the dense reward against
the sparse answer
+ format one, §1, and the box over-generation without the count term and the correctness gate, App. C.1).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import ModuleType

import driver_args
import jax
import learning
import paper_allospatial
import paper_prosr
import paper_spatialthinker

from spatial_jax import config as C
from spatial_jax.cli import one_line_errors
from spatial_jax.cli.script_guard import claim_folder
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.train import train

# each module gives CONFIG, STARTS {name: (directory, overrides)}, ARMS {name: (directory, overrides, start name)},
# check(cfg), figures(cfg, run_dir, stage, summary), tables(per_seed, seeds, note), BEGIN and END
PAPERS: dict[str, ModuleType] = {"allospatial": paper_allospatial, "prosr": paper_prosr,
                                 "spatialthinker": paper_spatialthinker}
QUIET = ["progress=false", "tensorboard=false"]
# what every run's settings take from the driver: an override of one would send every run to one place or start
OWNED = {"run_dir": "--out", "seed": "--seeds", "policy.checkpoint": "each arm starts from its SFT start's export"}


def seed_free(cfg: TrainConfig) -> bool:
    """Whether the SFT stage and its evaluation draw nothing from cfg.seed: the SFT update draws only LoRA dropout,
    and the evaluation decodes greedily except for ProSR's sampled diagnostics (the data order is data.seed's)."""
    lora = cfg.policy.lora
    return not (lora.dropout > 0 and (lora.rank > 0 or lora.vision_rank > 0)) and not cfg.plugin.needs_blank


def run_seed(paper: ModuleType, config: str, out: Path, seed: int, overrides: list[str]) -> dict[str, dict]:
    """{start name: figures, arm name: figures} for one seed."""
    rows, checkpoints = {}, {}
    for name, (directory, extra) in paper.STARTS.items():
        shared = seed_free(C.load(TrainConfig, config, [f"seed={seed}", *overrides, *extra, "rl.steps=0"]))
        sft_dir = out / directory if shared else out / f"seed{seed}" / directory
        cfg = C.load(TrainConfig, config, [f"run_dir={sft_dir}", f"seed={0 if shared else seed}", *QUIET, *overrides,
                                           *extra, "rl.steps=0"])
        rows[name] = paper.figures(cfg, sft_dir, "sft", train(cfg)["after_sft"])
        checkpoints[name] = sft_dir / "hf"
    for name, (directory, extra, start) in paper.ARMS.items():
        run_dir = out / f"seed{seed}" / directory
        cfg = C.load(TrainConfig, config, [f"run_dir={run_dir}", f"seed={seed}", *QUIET, *overrides,
                                           f"policy.checkpoint={checkpoints[start]}", "sft.steps=0", *extra])
        rows[name] = paper.figures(cfg, run_dir, "rl", train(cfg)["after_rl"])
    return rows


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--paper", required=True, choices=sorted(PAPERS))
    p.add_argument("--config", default=None, help="the job (default: the paper's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default=None, help="run directories (default: benchmarks/out/papers/<paper>)")
    p.add_argument("--results", default=None, help="RESULTS.md to write the tables into")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    paper = PAPERS[args.paper]
    args.config = args.config or paper.CONFIG
    args.out = f"benchmarks/out/papers/{args.paper}" if args.out is None else args.out
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    return one_line_errors("papers.py", lambda: measure(args))


def validate(args: argparse.Namespace) -> None:
    """Every run's settings, before the first run starts."""
    driver_args.check(args, OWNED)
    paper = PAPERS[args.paper]
    for seed in args.seeds:
        for _, extra in paper.STARTS.values():
            paper.check(C.load(TrainConfig, args.config, [f"seed={seed}", *args.overrides, *extra, "rl.steps=0"]))
        for _, extra, _ in paper.ARMS.values():
            paper.check(C.load(TrainConfig, args.config, [f"seed={seed}", *args.overrides, "sft.steps=0", *extra]))


def measure(args: argparse.Namespace) -> int:
    validate(args)
    paper, out = PAPERS[args.paper], claim_folder(args.out, "--out", "papers.py")
    # every run compiles the same programs: XLA's persistent cache compiles each once
    jax.config.update("jax_compilation_cache_dir", str(out / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    t0 = time.perf_counter()
    per_seed = [run_seed(paper, args.config, out, s, list(args.overrides)) for s in args.seeds]
    minutes = (time.perf_counter() - t0) / 60
    note = (f"Config {args.config}" + (f" with {' '.join(args.overrides)}" if args.overrides else "") +
            f"; {minutes:.0f} min wall.")
    text = paper.tables(per_seed, args.seeds, note)
    print(text)
    if args.results:
        learning.write_results(Path(args.results), text, paper.BEGIN, paper.END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
