"""SpatialCORE's Table 3 in miniature: the main job's RL stage with the reward as specified and with one part of it
switched off, over several seeds, from the same SFT start per seed.

    python benchmarks/papers/learning.py [--config configs/tiny_cpu.toml] [--seeds 0 1 2] [--out
        benchmarks/out/learning]
                                  [--results benchmarks/RESULTS.md] [key=value ...]

Per seed: one SFT run (the main job's SFT stage and its held-out evaluation), then one GRPO run per variant starting
from a copy of that SFT checkpoint (the SFT stage's weights do not depend on the reward, so the copy is what each
variant's own SFT would be). Variants: SpatialCORE as specified; beta = 1 (no confidence weighting); gamma = 1 (no
answer gate); no validity weighting; answer + format reward only (lambda_s = 0). Reported per variant after RL on
the held-out split: accuracy, matched IoU, mean box uncertainty H, Spearman rho(H, IoU), each as mean and standard
error over seeds, with the SFT start as the first row; then matched IoU by H quartile (SpatialCORE §4.3) over seeds,
and per seed each run's accuracy and matched IoU and the questions it turned right and wrong against the SFT start
(read from the evaluation rows). key=value overrides apply to every run (e.g. a shorter rl.steps or
eval.max_samples for a reduced run). The tables are printed and, with --results, written into that file between
this benchmark's markers.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from pathlib import Path

import driver_args
import numpy as np

from spatial_jax import config as C
from spatial_jax.cli import one_line_errors
from spatial_jax.cli.script_guard import claim_folder
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.report import correct_by_id, read_json
from spatial_jax.rl.train import train

# row name -> (run directory name, reward overrides)
VARIANTS = {
    "SpatialCORE (as specified)": ("spatialcore", []),
    "beta = 1 (no confidence weighting)": ("beta1", ["rewards.spatialcore.beta=1.0"]),
    "gamma = 1 (no answer gate)": ("gamma1", ["rewards.spatialcore.gamma=1.0"]),
    "no validity weighting": ("no_validity", ["rewards.spatialcore.validity_weighting=false"]),
    "answer + format only": ("answer_format", ["rewards.spatialcore.lambda_s=0.0"]),
}
# what every run's settings take from the driver (papers.py's OWNED)
OWNED = {"run_dir": "--out", "seed": "--seeds", "eval.after_sft": "the SFT start evaluates, the variants do not"}
COLUMNS = ("accuracy", "matched IoU", "mean H", "rho(H, IoU)")
BEGIN, END = "<!-- learning.py: begin -->", "<!-- learning.py: end -->"


def figures(summary: dict, rows: list[dict] | None = None) -> dict:
    """One evaluation's Table 3 columns (None where there was nothing to measure), its matched IoU by H quartile
    (lowest H first) and, from its rows, each question's correctness by id."""
    return {"accuracy": summary["accuracy"]["mean"], "matched IoU": summary["mean_matched_iou"]["mean"],
            "mean H": summary["mean_H"]["mean"], "rho(H, IoU)": summary["boxes"]["rho_H_iou"],
            "quartiles": [q["mean"] for q in summary["boxes"]["iou_by_H_quartile"]],
            "correct": correct_by_id(rows or [])}


def evaluated(run_dir: Path, stage: str, summary: dict) -> dict:
    """`figures` of the evaluation `stage` ("sft" or "rl") that `train` wrote into `run_dir`."""
    return figures(summary, eval_rows(run_dir, stage))


def eval_rows(run_dir: Path, stage: str) -> list[dict] | None:
    """The per-question rows of the evaluation `stage` that `train` wrote into `run_dir` (None if it wrote none)."""
    written = read_json(run_dir / f"eval_{stage}.json")
    return written["rows"] if isinstance(written, dict) else None


def over_seeds(values: list[float | None]) -> str:
    x = np.array([v for v in values if v is not None], np.float64)
    if x.size == 0:
        return "n/a"
    sem = x.std(ddof=1) / math.sqrt(x.size) if x.size > 1 else float("nan")
    return f"{x.mean():.3f} ± {sem:.3f}" if x.size > 1 else f"{x.mean():.3f}"


def run_seed(config: str, out: Path, seed: int, overrides: list[str]) -> dict[str, dict]:
    """The SFT start and every variant's RL run for one seed; returns {row name: figures}."""
    sft_dir = out / f"seed{seed}" / "sft_start"
    quiet = ["progress=false", "tensorboard=false"]
    cfg = C.load(TrainConfig, config, [f"run_dir={sft_dir}", f"seed={seed}", *quiet, *overrides, "rl.steps=0"])
    rows = {"SFT start": evaluated(sft_dir, "sft", train(cfg)["after_sft"])}
    for name, (directory, extra) in VARIANTS.items():
        run_dir = out / f"seed{seed}" / directory
        if not (run_dir / "sft").exists():
            shutil.copytree(sft_dir / "sft", run_dir / "sft")
        cfg = C.load(TrainConfig, config, [f"run_dir={run_dir}", f"seed={seed}", "eval.after_sft=false", *quiet,
                                           *overrides, *extra])
        rows[name] = evaluated(run_dir, "rl", train(cfg)["after_rl"])
    return rows


def direction(per_seed: list[dict[str, dict]], name: str) -> str:
    """Table 3's direction for an ablation row: SpatialCORE's accuracy above this row's, seed by seed."""
    full = next(iter(VARIANTS))
    if name == full:
        return ""
    d = [s[full]["accuracy"] - s[name]["accuracy"] for s in per_seed]
    return f"{over_seeds(d)}: {verdict(d)}"


TIE = 1e-9  # a mean difference this small is a tie: figures are shares of at most ~10^3 questions


def verdict(d: list[float]) -> str:
    """holds (mean beyond 2 standard errors above 0), direction only (above 0), or does not hold."""
    if not d:
        return "n/a"
    m = float(np.mean(d))
    if abs(m) < TIE:  # float rounding of paired differences that sum to 0 (0.28 - 0.04 - 0.24): a tie, not a gain
        m = 0.0
    se = float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("inf")
    return "holds" if m > 2 * se else "direction only" if m > 0 else "does not hold"


def table(per_seed: list[dict[str, dict]], seeds: list[int], note: str) -> str:
    names = list(per_seed[0])
    lines = [f"Seeds {', '.join(map(str, seeds))}: mean ± standard error over seeds. {note} The last column is "
             "SpatialCORE's accuracy minus the row's, per seed (Table 3: every ablation loses accuracy).", "",
             "| run | " + " | ".join(COLUMNS) + " | SpatialCORE - row |", "|---|" + "---|" * (len(COLUMNS) + 1)]
    for name in names:
        cells = [over_seeds([s[name][c] for s in per_seed]) for c in COLUMNS]
        cells.append(direction(per_seed, name) if name in VARIANTS else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", *quartile_table(per_seed), "", *per_seed_table(per_seed, seeds)])


def falls(quartiles: list[float | None]) -> tuple[bool, bool]:
    """(lowest-H quartile above the highest, a fall at every step) for one run's matched IoU by H quartile."""
    if len(quartiles) != 4 or any(q is None for q in quartiles):
        return False, False
    return quartiles[0] > quartiles[3], all(a > b for a, b in zip(quartiles, quartiles[1:]))


def quartile_table(per_seed: list[dict[str, dict]]) -> list[str]:
    """Matched IoU by H quartile, mean ± standard error over seeds, and in how many seeds it falls."""
    lines = ["Matched IoU by box-uncertainty quartile (Q1 lowest H), mean ± standard error over seeds; the last two "
             "columns count the seeds in which Q1 is above Q4, and in which IoU falls at every step.", "",
             "| run | Q1 | Q2 | Q3 | Q4 | Q1 > Q4 | falls at every step |", "|---|---|---|---|---|---|---|"]
    for name in per_seed[0]:
        qs = [s[name]["quartiles"] for s in per_seed]
        cells = [over_seeds([q[k] if len(q) == 4 else None for q in qs]) for k in range(4)]
        verdicts = [falls(q) for q in qs]
        counts = [f"{sum(v[k] for v in verdicts)} of {len(qs)}" for k in range(2)]
        lines.append(f"| {name} | " + " | ".join(cells + counts) + " |")
    return lines


def turned(before: dict, after: dict) -> str:
    """Questions wrong before and right after, and right before and wrong after, over the ids both scored."""
    ids = before.keys() & after.keys()
    right = sum(1 for i in ids if after[i] > before[i])
    wrong = sum(1 for i in ids if after[i] < before[i])
    return f"+{right} / -{wrong}"


def per_seed_table(per_seed: list[dict[str, dict]], seeds: list[int]) -> list[str]:
    """Per seed and run: accuracy / matched IoU, and the questions turned right / wrong against the SFT start."""
    names = [n for n in per_seed[0] if n in VARIANTS]
    lines = ["Per seed: accuracy / matched IoU after RL, and the held-out questions turned right / wrong against "
             "the SFT start (from the evaluation rows).", "",
             "| seed | SFT start | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]

    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}"

    for seed, s in zip(seeds, per_seed):
        start = s["SFT start"]
        cells = [f"{fmt(start['accuracy'])} / {fmt(start['matched IoU'])}"]
        cells += [f"{fmt(s[n]['accuracy'])} / {fmt(s[n]['matched IoU'])}, {turned(start['correct'], s[n]['correct'])}"
                  for n in names]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return lines


def write_results(path: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """Replaces a benchmark's section of RESULTS.md (between its markers: this one's unless given), or appends it."""
    body = path.read_text(encoding="utf-8")
    section = f"{begin}\n{text}\n{end}"
    if begin in body and end in body:
        body = body[: body.index(begin)] + section + body[body.index(end) + len(end):]
    else:
        body = body.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(body, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny_cpu.toml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="benchmarks/out/learning")
    p.add_argument("--results", default=None, help="RESULTS.md to write the table into")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    return one_line_errors("learning.py", lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    driver_args.check(args, OWNED)
    for seed in args.seeds:  # a bad setting, of any run, fails before the first
        for extra in [["rl.steps=0"], *(extra for _, extra in VARIANTS.values())]:
            C.load(TrainConfig, args.config, [f"seed={seed}", *args.overrides, *extra])
    out = claim_folder(args.out, "--out", "learning.py")
    t0 = time.perf_counter()
    per_seed = [run_seed(args.config, out, s, list(args.overrides)) for s in args.seeds]
    minutes = (time.perf_counter() - t0) / 60
    note = (f"Config {args.config}" + (f" with {' '.join(args.overrides)}" if args.overrides else "") +
            f"; {minutes:.0f} min wall.")
    text = table(per_seed, args.seeds, note)
    print(text)
    if args.results:
        write_results(Path(args.results), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
