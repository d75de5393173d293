"""What a run reports: per-step rollout metrics, the training curves and the end-of-job summary."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from spatial_jax.eval.grounding import estimate
from spatial_jax.methods import Method
from spatial_jax.rl.metrics import read_metrics, write_atomic
from spatial_jax.rollout.completions import Completions


def rollout_metrics(method: Method, scores: list[dict[str, float]], rewards: np.ndarray, adv: np.ndarray,
                    comps: Completions) -> dict[str, Any]:
    """One RL step's rollouts [groups, G]: reward and its components, accuracy, grounding figures, advantages, lengths;
    groups_with_spread (the share of groups whose rewards are not all equal: only those carry a gradient),
    well_formed (the share of rollouts in the method's format, by its plug-in's own test) and entropy_mean (the mean
    token entropy of the sampled completions at temperature 1)."""
    out: dict[str, Any] = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std())}
    out["groups_with_spread"] = float(np.mean(rewards.max(axis=1) > rewards.min(axis=1)))
    out["well_formed"] = float(np.mean([bool(method.well_formed(s)) for s in scores]))
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


def correct_by_id(rows: list[dict[str, Any]]) -> dict[str, float]:
    """An evaluation's rows as question id -> correctness (rows without a score left out)."""
    return {r["id"]: r["correct"] for r in rows if "correct" in r}


def compare_stages(run_dir: Path, results: dict[str, Any]) -> dict[str, Any]:
    """Accuracy after RL minus after SFT, paired question by question over the held-out rows both evaluations
    scored (its standard error is that of the paired difference); {} unless this job evaluated both stages."""
    if not (results.get("after_sft") and results.get("after_rl")):
        return {}
    sft, rl = read_json(run_dir / "eval_sft.json"), read_json(run_dir / "eval_rl.json")
    if not (isinstance(sft, dict) and isinstance(rl, dict) and "rows" in sft and "rows" in rl):
        return {}
    before = correct_by_id(sft["rows"])
    diffs = [r["correct"] - before[r["id"]] for r in rl["rows"] if "correct" in r and r["id"] in before]
    return {"accuracy_gain_paired": estimate(diffs).as_dict()} if diffs else {}


_RL_CURVES = ("reward_mean", "accuracy", "mean_H", "mean_matched_iou", "reward/format", "loss")


def plot(run_dir: Path, results: dict[str, Any] | None = None, smooth: int = 5) -> str | None:
    """curves.png: the SFT loss, the RL curves (moving average over `smooth` steps on the raw points) and, from
    `results`, matched IoU by box-uncertainty quartile after SFT and after RL. Returns its path, or None with
    nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sft, rl = read_metrics(run_dir / "sft" / "metrics.jsonl"), read_metrics(run_dir / "rl" / "metrics.jsonl")
    stages = [k for k in ("after_sft", "after_rl") if (results or {}).get(k, {}).get("boxes")]
    panels = ([("sft", "loss")] if sft else []) + ([("rl", k) for k in _RL_CURVES] if rl else [])
    if not panels and not stages:
        return None
    n = len(panels) + bool(stages)
    cols = min(4, n)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(4.2 * cols, 3.1 * ((n + cols - 1) // cols)),
                             squeeze=False)
    for ax, (stage, key) in zip(axes.flat, panels):
        pts = [(r["step"], r[key]) for r in (sft if stage == "sft" else rl)
               if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        ax.set_title(f"{stage}: {key}")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if not pts:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            continue
        steps, values = np.array(pts, dtype=np.float64).T
        ax.plot(steps, values, alpha=0.35, color="C0")
        if len(values) >= smooth > 1:
            ax.plot(steps[smooth - 1:], np.convolve(values, np.ones(smooth) / smooth, mode="valid"), color="C0")
    if stages:
        ax = axes.flat[len(panels)]
        width = 0.8 / len(stages)
        for i, stage in enumerate(stages):
            q = results[stage]["boxes"]["iou_by_H_quartile"]
            means = [e["mean"] if e["n"] else 0.0 for e in q]
            errs = [e["sem"] if e["n"] else 0.0 for e in q]
            rho = results[stage]["boxes"]["rho_H_iou"]
            ax.bar(np.arange(4) + (i - (len(stages) - 1) / 2) * width, means, width, yerr=errs, capsize=3,
                   label=f"{stage} (rho {'n/a' if rho is None else f'{rho:+.2f}'})")
        ax.set_xticks(range(4), ["Q1 low H", "Q2", "Q3", "Q4 high H"])
        ax.set_title("matched IoU by box uncertainty H")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    out = run_dir / "curves.png"
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=90)
    plt.close(fig)
    write_atomic(out, png.getvalue())  # unchanged curves are not rewritten: a finished run reruns read-only
    return str(out)


def _fmt(e: dict[str, Any]) -> str:
    return "n/a" if not e.get("n") else f"{e['mean']:.3f} ± {e['sem']:.3f}"


def print_summary(results: dict[str, Any]) -> None:
    lines = [f"run: {results['run_dir']}  method: {results['method']}"]
    for stage in ("after_sft", "after_rl"):
        s = results.get(stage)
        if not s:
            continue
        parts = []
        for key in ("accuracy", "mean_matched_iou", "mean_H", "reward", "well_formed"):
            if key in s and s[key]["n"] > 0:
                parts.append(f"{key} {_fmt(s[key])} (n={s[key]['n']})")
        lines.append(f"{stage}: " + "; ".join(parts))
        if s.get("boxes"):
            b = s["boxes"]
            rho = "n/a" if b["rho_H_iou"] is None else f"{b['rho_H_iou']:+.3f}"
            quart = ", ".join(_fmt(e) for e in b["iou_by_H_quartile"])
            lines.append(f"  boxes {b['n_boxes']} ({b['n_matched']} matched): matched IoU by H quartile, low to "
                         f"high: {quart}; Spearman rho(H, IoU) {rho}")
        if s.get("process"):
            p = s["process"]
            shown = [k for k in p if k not in ("n", "groups", "accuracy", "rollouts", "NTS_undefined")]
            lines.append(f"  process ({p.get('rollouts', 'greedy')} pairs): " + "; ".join(
                f"{k} {'n/a' if p[k] is None else f'{p[k]:.3f}'}" for k in shown)
                + (f"; NTS counts {p['NTS_undefined']} pairs without trajectories as 0" if p.get("NTS_undefined")
                   else ""))
    if results.get("accuracy_gain_paired"):
        g = results["accuracy_gain_paired"]
        lines.append(f"accuracy after RL - after SFT (paired): {_fmt(g)} (n={g['n']})")
    if results.get("curves_png"):
        lines.append(f"curves: {results['curves_png']}")
    print("\n".join(lines), flush=True)
