"""Rewards benchmark: default (JAX/numpy) vs torch float64 reference scorers on synthetic rollouts, one process.

    python benchmarks/kernels/rewards.py [--n 10000] [--methods spatialcore,prosr] [--repeats 3]

Rollouts come in groups of 4 with up to 3 predicted boxes each and digit-aware token entropies/offsets
(spatial_jax.testing.rollouts). Each backend scores the whole set and computes group advantages; the default
backend is timed once cold (includes jit compilation) and then warm (best of --repeats); the reference once.
Writes benchmarks/out/rewards.json and prints a table.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from spatial_jax.cli import one_line_errors
from spatial_jax.cli.script_guard import check_counts, check_own_output, write_own

OUT = Path(__file__).resolve().parents[1] / "out" / "rewards.json"
OWNER = Path(__file__).name


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def bench_method(name: str, n: int, repeats: int, seed: int) -> dict:
    import numpy as np

    from spatial_jax.methods import get_method
    from spatial_jax.reference import advantages_torch
    from spatial_jax.rewards.advantages import advantages_by_group
    from spatial_jax.testing import rollouts as synthetic

    method = get_method(name)
    cfg = method.config()
    rollouts = synthetic.rollouts(n, seed=seed, group_size=4, with_blank=(name == "prosr"))
    groups = [ro.group for ro in rollouts]

    def default():
        scores = method.score_batch(rollouts, cfg)
        return scores, advantages_by_group([s["reward"] for s in scores], groups, cfg.advantage.eps, cfg.advantage.std)

    def reference():
        scores = method.reference_score_batch(rollouts, cfg)
        return scores, advantages_torch.advantages_by_group([s["reward"] for s in scores], groups, cfg.advantage.eps,
                                                            cfg.advantage.std)

    cold, _ = _timed(default)
    warm = min(_timed(default)[0] for _ in range(repeats))
    _, (main_scores, main_adv) = _timed(default)
    ref_time, (ref_scores, ref_adv) = _timed(reference)
    diff = max(abs(a[k] - b[k]) for a, b in zip(main_scores, ref_scores) for k in a)
    adv_diff = max(abs(a - b) for a, b in zip(main_adv, ref_adv) if a is not None)
    return {
        "method": name,
        "rollouts": n,
        "default_cold_s": cold,
        "default_warm_s": warm,
        "torch_s": ref_time,
        "default_rollouts_per_s": n / warm,
        "default_cold_rollouts_per_s": n / cold,
        "torch_rollouts_per_s": n / ref_time,
        "speedup_warm": ref_time / warm,
        "speedup_cold": ref_time / cold,
        "max_abs_diff_scores": diff,
        "max_abs_diff_advantages": adv_diff,
        "mean_reward": float(np.mean([s["reward"] for s in main_scores])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--methods", default="spatialcore,prosr")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    return one_line_errors("rewards.py", lambda: run(args))


def run(args: argparse.Namespace) -> int:
    check_counts({"--n": (args.n, 1, 10**7), "--repeats": (args.repeats, 1, 1000), "--seed": (args.seed, 0, 2**31)})
    check_own_output(args.out, "--out", OWNER)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import torch

    rows = [bench_method(m.strip(), args.n, args.repeats, args.seed) for m in args.methods.split(",") if m.strip()]
    report = {
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "results": rows,
    }
    write_own(args.out, report, OWNER)
    head = f"{'method':<12}{'n':>7}{'default/s (warm)':>18}{'default/s (cold)':>18}{'torch/s':>10}" \
           f"{'ratio warm':>12}{'ratio cold':>12}{'max |diff|':>12}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['method']:<12}{r['rollouts']:>7}{r['default_rollouts_per_s']:>18.0f}"
              f"{r['default_cold_rollouts_per_s']:>18.0f}{r['torch_rollouts_per_s']:>10.0f}"
              f"{r['speedup_warm']:>12.2f}{r['speedup_cold']:>12.2f}{r['max_abs_diff_scores']:>12.1e}")
    print(f"load average {report['load_average']}; written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
