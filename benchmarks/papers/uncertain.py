"""SpatialCORE's Table 3 and Table 5 in miniature on the uncertain world (configs/uncertain_cpu.toml), from one
command:

    python benchmarks/papers/uncertain.py [--config configs/uncertain_cpu.toml] [--seeds 0 1 2] [--levels 0 0.2 0.4 0.6]
                                   [--train-rows 1000] [--eval-rows 256] [--out benchmarks/out/uncertain]
                                   [--results benchmarks/RESULTS.md] [key=value ...]

Data, written once under --out: the world's first --train-rows training questions as JSONL, then that file corrupted
by `spatial-jax corrupt` at each level (A.3's kinds: removed, relabelled, displaced to IoU < 0.6; corruption seed 0, so
every training seed sees the same corrupted boxes); and the first --eval-rows held-out questions with their pseudo-GT
replaced by the exact boxes (validity 1), so every run is scored against where the objects are.

Per seed: one SFT start (the job's SFT stage on the world's reference completions, which corruption does not touch,
and its held-out evaluation), exported as a Hugging Face checkpoint; then one GRPO run per (level, arm) from that
checkpoint, its RL stage reading the level's training file, every run with the same steps, seed and start. Level 0
runs the five Table 3 arms (benchmarks/papers/learning.py's VARIANTS), the other levels TABLE5_ARMS. Runs are resumable:
the command run again skips what is done. The tables are printed and, with --results, written into that file between
this benchmark's markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import driver_args
import jax
import learning

from spatial_jax import config as C
from spatial_jax.cli import main as cli_main
from spatial_jax.cli import one_line_errors
from spatial_jax.cli.script_guard import claim_folder
from spatial_jax.data.jsonl import write_jsonl
from spatial_jax.data.sample import Sample
from spatial_jax.data.synthetic import ROW_BYTES, SyntheticSource, to_norm, written_bytes
from spatial_jax.records import GTBox
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.report import read_json
from spatial_jax.rl.train import train

FULL, BETA1, NO_VALIDITY, ANSWER = (learning.VARIANTS[n][0] for n in (
    "SpatialCORE (as specified)", "beta = 1 (no confidence weighting)", "no validity weighting",
    "answer + format only"))
NAMES = {directory: name for name, (directory, _) in learning.VARIANTS.items()}
EXTRA = {directory: extra for directory, extra in learning.VARIANTS.values()}
# Table 5: SpatialCORE against beta = 1 (where does confidence weighting stop protecting?), against no validity
# weighting (does validity guard against the same noise as H?) and against answer + format (no pseudo-GT at all)
TABLE5_ARMS = (FULL, BETA1, NO_VALIDITY, ANSWER)
# what every run's settings take from the driver (papers.py's OWNED)
OWNED = {"run_dir": "--out", "seed": "--seeds", "data.train": "--train-rows and --levels", "data.eval": "--eval-rows",
         "policy.checkpoint": "every run starts from its seed's SFT start"}
BEGIN, END = "<!-- uncertain.py: begin -->", "<!-- uncertain.py: end -->"


def exact_boxes(sample: Sample) -> Sample:
    """The sample with its pseudo-GT replaced by the exact boxes of the objects it names (validity 1)."""
    objects = {o["label"]: o["bbox"] for o in sample.meta["objects"]}
    w, h = sample.image_size
    boxes = tuple(GTBox(bbox=tuple(float(c) for c in to_norm(objects[label], w, h)), label=label, validity=1.0)
                  for label in sample.meta["relevant"])
    return dataclasses.replace(sample, gt_boxes=boxes)


def level_name(level: float) -> str:
    return f"{round(100 * level)}%"


def write_data(cfg: TrainConfig, out: Path, levels: list[float], train_rows: int, eval_rows: int) -> dict:
    """Writes (once) the training file, its corrupted copies and the exact-box held-out file; returns
    {"eval": path, "train": {level: path}, "reports": {level: corrupt's report}}."""
    data = out / "data"
    clean, heldout = data / "train_0.jsonl", data / "heldout_exact.jsonl"
    if not clean.is_file():
        write_jsonl(SyntheticSource(cfg.data.synthetic, "train", train_rows), clean, data / "images")
    if not heldout.is_file():  # streamed: a sample at a time in memory
        write_jsonl(map(exact_boxes, SyntheticSource(cfg.data.synthetic, "heldout", eval_rows)), heldout,
                    data / "images")
    files, reports = {}, {}
    for level in levels:
        path = data / f"train_{round(100 * level)}.jsonl"
        report = data / f"corrupt_{round(100 * level)}.json"
        if level > 0 and not (path.is_file() and report.is_file()):
            status = cli_main(["corrupt", "--input", str(clean), "--output", str(path), "--fraction", str(level),
                               "--seed", "0", "--report", str(report)])
            if status:
                raise C.ConfigError(f"spatial-jax corrupt at {level_name(level)} failed with status {status}")
        files[level] = path
        reports[level] = read_json(report) if level > 0 else None
    return {"eval": heldout, "train": files, "reports": reports}


def arms(level: float) -> tuple[str, ...]:
    return tuple(d for _, (d, _) in learning.VARIANTS.items()) if level == 0 else TABLE5_ARMS


def run_seed(config: str, out: Path, seed: int, data: dict, overrides: list[str]) -> dict:
    """{"SFT start": figures, (level, arm directory): figures} for one seed."""
    quiet = ["progress=false", "tensorboard=false", f"data.eval={data['eval']}"]
    sft_dir = out / f"seed{seed}" / "sft_start"
    cfg = C.load(TrainConfig, config, [f"run_dir={sft_dir}", f"seed={seed}", *quiet, *overrides, "rl.steps=0"])
    rows = {"SFT start": learning.evaluated(sft_dir, "sft", train(cfg)["after_sft"])}
    for level, path in data["train"].items():
        for arm in arms(level):
            run_dir = out / f"seed{seed}" / f"{round(100 * level)}" / arm
            cfg = C.load(TrainConfig, config, [
                f"run_dir={run_dir}", f"seed={seed}", *quiet, *overrides, f"policy.checkpoint={sft_dir / 'hf'}",
                "sft.steps=0", f"data.train={path}", *EXTRA[arm]])
            rows[(level, arm)] = learning.evaluated(run_dir, "rl", train(cfg)["after_rl"])
    return rows


def paired(per_seed: list[dict], a, b, column: str) -> list[float]:
    """Per seed, run a's `column` minus run b's (where both were measured)."""
    return [s[a][column] - s[b][column] for s in per_seed if s[a][column] is not None and s[b][column] is not None]


def diff_cell(d: list[float]) -> str:
    return f"{learning.over_seeds(d)} ({learning.verdict(d)})" if d else "n/a"


def table3(per_seed: list[dict], seeds: list[int], note: str) -> str:
    """benchmarks/papers/learning.py's tables over the level-0 runs."""
    rows = [{"SFT start": s["SFT start"], **{NAMES[arm]: s[(0.0, arm)] for arm in arms(0.0)}} for s in per_seed]
    return learning.table(rows, seeds, note)


def table5(per_seed: list[dict], levels: list[float], reports: dict) -> str:
    """Matched IoU (against the exact held-out boxes) and accuracy per arm and corruption level, the paired
    differences that say what each weighting protects, and what corruption realised."""
    cols = [level_name(x) for x in levels]
    head = ["| run | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines = []
    for column in ("matched IoU", "accuracy", "mean H", "rho(H, IoU)"):
        lines += [f"{column} after RL, mean ± standard error over seeds (SFT start: "
                  f"{learning.over_seeds([s['SFT start'][column] for s in per_seed])}).", "", *head]
        for arm in TABLE5_ARMS:
            cells = [learning.over_seeds([s[(x, arm)][column] for s in per_seed]) for x in levels]
            lines.append(f"| {NAMES[arm]} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["Paired differences in matched IoU, seed by seed (mean ± standard error; holds = beyond 2 standard "
              "errors above 0): what each part of the reward adds at each level, and what corruption costs each "
              "arm against its own clean run.", "", *head]
    for arm, label in ((BETA1, "SpatialCORE - beta = 1 (confidence weighting)"),
                       (NO_VALIDITY, "SpatialCORE - no validity weighting"),
                       (ANSWER, "SpatialCORE - answer + format (the spatial term)")):
        cells = [diff_cell(paired(per_seed, (x, FULL), (x, arm), "matched IoU")) for x in levels]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for arm in TABLE5_ARMS:
        cells = [diff_cell(paired(per_seed, (0.0, arm), (x, arm), "matched IoU")) if x else "" for x in levels]
        lines.append(f"| {NAMES[arm]}: clean - corrupted | " + " | ".join(cells) + " |")
    lines += ["", "Each weighting protects grounding (SpatialCORE's matched IoU beyond 2 standard errors above the arm "
              f"without it) at every level up to: confidence {protected_up_to(per_seed, levels, BETA1)}, validity "
              f"{protected_up_to(per_seed, levels, NO_VALIDITY)}.", "",
              "Corruption realised by `spatial-jax corrupt` (whole training file): " + "; ".join(
                  f"{level_name(x)}: {r['corrupted']} of {r['boxes']} boxes ({r['by_kind']['removed']} removed, "
                  f"{r['by_kind']['relabelled']} relabelled, {r['by_kind']['displaced']} displaced)"
                  for x, r in reports.items() if r)]
    return "\n".join(lines)


def protected_up_to(per_seed: list[dict], levels: list[float], without: str) -> str:
    """The highest level up to which, at every level, SpatialCORE's matched-IoU gain over the arm `without` the
    weighting holds."""
    last = None
    for x in levels:
        if learning.verdict(paired(per_seed, (x, FULL), (x, without), "matched IoU")) != "holds":
            break
        last = x
    return "no level (it does not hold on clean pseudo-GT)" if last is None else level_name(last)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/uncertain_cpu.toml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--levels", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.6])
    p.add_argument("--train-rows", type=int, default=1000)
    p.add_argument("--eval-rows", type=int, default=256)
    p.add_argument("--out", default="benchmarks/out/uncertain")
    p.add_argument("--results", default=None, help="RESULTS.md to write the tables into")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    return one_line_errors("uncertain.py", lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    if not args.levels or args.levels[0] != 0 or sorted(set(args.levels)) != args.levels or args.levels[-1] >= 1:
        raise C.ConfigError(f"--levels must start at 0 and increase below 1, got {args.levels}")
    cfg = C.load(TrainConfig, args.config, list(args.overrides))  # a bad setting fails before anything is written
    # the training file and the held-out one with their images, and a JSONL copy of the first per corruption level
    room = written_bytes(cfg.data.synthetic, max(args.train_rows, 0) + max(args.eval_rows, 0)) + \
        (len(args.levels) - 1) * max(args.train_rows, 0) * ROW_BYTES
    counts = {"--train-rows": (args.train_rows, 1, 10**9), "--eval-rows": (args.eval_rows, 1, 10**9)}
    driver_args.check(args, OWNED, counts=counts, room=room)
    out = claim_folder(args.out, "--out", "uncertain.py")
    # every run compiles the same programs (the reward is scored on the host): XLA's persistent cache compiles each once
    jax.config.update("jax_compilation_cache_dir", str(out / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    t0 = time.perf_counter()
    data = write_data(cfg, out, list(args.levels), args.train_rows, args.eval_rows)
    per_seed = [run_seed(args.config, out, s, data, list(args.overrides)) for s in args.seeds]
    minutes = (time.perf_counter() - t0) / 60
    note = (f"Config {args.config}" + (f" with {' '.join(args.overrides)}" if args.overrides else "") +
            f", clean training file; matched IoU against the exact held-out boxes ({args.eval_rows} questions); "
            f"{minutes:.0f} min wall for both tables.")
    text = ("### Table 3 in miniature (uncorrupted pseudo-GT)\n\n" + table3(per_seed, args.seeds, note) +
            "\n\n### Table 5 in miniature (pseudo-GT corrupted by `spatial-jax corrupt`)\n\n" +
            table5(per_seed, list(args.levels), data["reports"]))
    print(text)
    if args.results:
        learning.write_results(Path(args.results), text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
