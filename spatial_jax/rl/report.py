"""What a run reports: per-step rollout metrics, the training curves and the end-of-job summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from spatial_jax.methods import Method
from spatial_jax.rl.metrics import plot_curves, write_atomic
from spatial_jax.rollout.completions import Completions


def rollout_metrics(method: Method, scores: list[dict[str, float]], rewards: np.ndarray, adv: np.ndarray,
                    comps: Completions) -> dict[str, Any]:
    """One RL step's rollouts: reward and its components, accuracy, grounding figures, advantages, lengths."""
    out: dict[str, Any] = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std())}
    for k in scores[0]:
        out[f"reward/{k}"] = float(np.mean([s[k] for s in scores]))
    out["accuracy"] = out[f"reward/{method.accuracy_key}"]
    with_h = [s["mean_H"] for s in scores if s.get("n_with_H", 0) > 0]
    out["mean_H"] = float(np.mean(with_h)) if with_h else None
    matched = [s["mean_matched_iou"] for s in scores if s.get("n_matched", 0) > 0]
    out["mean_matched_iou"] = float(np.mean(matched)) if matched else None
    out["adv_mean"], out["adv_std"] = float(adv.mean()), float(adv.std())
    out["adv_abs_max"] = float(np.abs(adv).max())
    out["completion_len"] = float(comps.mask.sum(1).mean())
    out["entropy_mean"] = float((comps.entropies * comps.mask).sum() / max(comps.mask.sum(), 1))
    if hasattr(comps, "num_tool_calls"):
        out["tool_calls_mean"] = float(np.mean(comps.num_tool_calls))
    return out


def write_json(path: str | Path, obj: Any, indent: int = 2) -> bool:
    """`obj` as JSON, written whole and only when it changed (metrics.write_atomic); returns whether it wrote."""
    return write_atomic(path, json.dumps(obj, indent=indent))


def read_json(path: str | Path) -> Any:
    """`path`'s JSON, or None when it is missing or does not read (e.g. cut by a kill, when writes were in place)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def plot(run_dir: Path) -> str | None:
    """curves.png (RL) and sft_curves.png from the stages' metrics; returns the main one's path, if any."""
    out = None
    metrics = run_dir / "rl" / "metrics.jsonl"
    if metrics.exists():
        out = str(run_dir / "curves.png")
        plot_curves(metrics, out, ["reward_mean", "accuracy", "mean_H", "mean_matched_iou", "loss", "reward/format"],
                    smooth=5)
    sft = run_dir / "sft" / "metrics.jsonl"
    if sft.exists():
        plot_curves(sft, run_dir / "sft_curves.png", ["loss"], smooth=5)
        out = out or str(run_dir / "sft_curves.png")
    return out


def print_summary(results: dict[str, Any]) -> None:
    lines = [f"run: {results['run_dir']}  method: {results['method']}"]
    for stage in ("after_sft", "after_rl"):
        s = results.get(stage)
        if not s:
            continue
        parts = []
        for key in ("accuracy", "mean_matched_iou", "mean_H", "reward", "well_formed"):
            if key in s and s[key]["n"] > 0:
                e = s[key]
                parts.append(f"{key} {e['mean']:.3f} ± {e['sem']:.3f} (n={e['n']})")
        lines.append(f"{stage}: " + "; ".join(parts))
    if results.get("curves_png"):
        lines.append(f"curves: {results['curves_png']}")
    print("\n".join(lines), flush=True)
