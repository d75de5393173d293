"""Policy evaluation: greedy rollouts on a dataset, scored by the method's reward, summarised with standard errors.

Accuracy is reported overall and per category (sample-weighted: each question counts once), with the grounding
figures the method has (mean matched IoU and mean box uncertainty H for SpatialCORE). A method with box uncertainty
also gets the §4.3 analyses over its predicted boxes (matched IoU by H quartile, Spearman rho(H, IoU)); one with
blank-image pairs gets ProSR's process diagnostics (A_blank, SAR, NTS, LRR), from pairs sampled at temperature 1 as
ProSR eq. 2 draws them (a second pass over the questions), or from the greedy rollouts (`diagnostics="greedy"`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.eval.grounding import (
    accuracy_by_category,
    estimate,
    iou_by_uncertainty_quartile,
    uncertainty_iou_spearman,
)
from spatial_jax.eval.prosr_diagnostics import diagnose
from spatial_jax.methods import Method
from spatial_jax.rewards.prosr import ProSRConfig
from spatial_jax.rollout.collect import ToolSettings, collect
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.hosts import HostShare

# reported with standard errors when the method produces them
# where ProSR's diagnostics read their (image, blank) pairs from: rollouts sampled at temperature 1 (eq. 2), or the
# greedy evaluation rollouts
DIAGNOSTIC_ROLLOUTS = ("sampled", "greedy")
_GROUNDING = ("mean_matched_iou", "mean_H", "r_spatial", "precision", "recall", "spatial", "count", "tool")


def summarise(method: Method, scores: list[dict[str, float]], categories: list[str]) -> dict[str, Any]:
    correct = [s[method.accuracy_key] for s in scores]
    out: dict[str, Any] = {
        "n": len(scores),
        "accuracy": estimate(correct).as_dict(),
        "reward": estimate([s["reward"] for s in scores]).as_dict(),
        "well_formed": estimate([float(method.well_formed(s)) for s in scores]).as_dict(),
        "accuracy_by_category": {k: v.as_dict() for k, v in accuracy_by_category(correct, categories).items()},
    }
    for key in _GROUNDING:
        if scores and key in scores[0]:
            values = [s[key] for s in scores]
            if key in ("mean_matched_iou", "mean_H"):  # only rollouts that have a matched box / a box with H
                gate = "n_matched" if key == "mean_matched_iou" else "n_with_H"
                values = [s[key] for s in scores if s.get(gate, 0) > 0]
            out[key] = estimate(values).as_dict()
    return out


def box_analyses(boxes: list[list[dict]]) -> dict[str, Any]:
    """§4.3 over every predicted box that has an uncertainty H and matched a reference: mean matched IoU in each H
    quartile (lowest H first) and Spearman rho between H and IoU; plus how many boxes there were."""
    flat = [b for per_rollout in boxes for b in per_rollout]
    scored = [b for b in flat if b["matched"] and b["H"] is not None]
    h = [b["H"] for b in scored]
    iou = [b["iou"] for b in scored]
    rho = uncertainty_iou_spearman(h, iou)
    return {
        "n_boxes": len(flat),
        "n_with_H": sum(b["H"] is not None for b in flat),
        "n_matched": sum(b["matched"] for b in flat),
        "iou_by_H_quartile": [e.as_dict() for e in iou_by_uncertainty_quartile(h, iou)],
        "rho_H_iou": None if rho != rho else rho,  # NaN (too few or constant) -> None: JSON has no NaN
    }


def process_diagnostics(rollouts: list, reward_cfg, drawn: str = "greedy") -> tuple[dict[str, Any], dict[str, str]]:
    """ProSR's A_blank, SAR, NTS and LRR over image/blank pairs (`drawn`: how they were decoded, reported), and each
    rollout's failure group."""
    cfg = reward_cfg if isinstance(reward_cfg, ProSRConfig) else ProSRConfig()
    d = diagnose(rollouts, cfg)
    return {"rollouts": drawn, **{k: v for k, v in d.items() if k != "group_of"}}, d["group_of"]


def evaluate(
    model,
    tokenizer,
    batches: Iterable,
    method: Method,
    reward_cfg,
    max_new_tokens: int,
    max_samples: int = 0,
    progress: Callable[[int], None] | None = None,
    tools: ToolSettings = ToolSettings(),
    blank_fill: str = "mean",
    image_cfg: ImageProcessingConfig = ImageProcessingConfig(),
    hosts: HostShare = HostShare(),
    diagnostics: str = "sampled",
    seed: int = 0,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Greedy decoding over `batches` (pipeline Batches in RL mode); returns (summary, per-sample rows).
    Rollouts come from the same `collect` as training: tool turns for a method that uses tools, and a blank-image
    rollout per prompt for one that needs it (fill `blank_fill`), so the reward keeps every term it has in training.
    `model`: a decoding copy (rollout/decode_copy.py) or a model. With `hosts` of several processes, `batches` are
    this process's share of the samples (in order: process p's follow process p - 1's) and the figures are those
    of every share, the same on every process. A method with blank rollouts gets ProSR's diagnostics from pairs
    `diagnostics` says how to draw (DIAGNOSTIC_ROLLOUTS); sampled ones draw batch k's with seeds from `seed` and k."""
    if diagnostics not in DIAGNOSTIC_ROLLOUTS:
        raise ValueError(f"diagnostics must be one of {DIAGNOSTIC_ROLLOUTS}, got {diagnostics!r}")
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=(tokenizer.im_end_id,),
                         pad_token_id=tokenizer.pad_id)
    drawn_cfg = dataclasses.replace(cfg, temperature=1.0)
    sampled = method.needs_blank and diagnostics == "sampled"
    scores, rows, categories, rollouts, boxes, pairs = [], [], [], [], [], []
    for k, batch in enumerate(batches):
        got = collect(model, batch, tokenizer, method, reward_cfg, cfg, 1, 0, tools=tools, blank_fill=blank_fill,
                      image_cfg=image_cfg)
        per_box = method.box_details(got.rollouts, reward_cfg) if method.box_details else [None] * len(got.rollouts)
        if sampled:  # eq. 2: r ~ pi(. | x, I) and its blank-image pair, apart from the greedy answers
            pairs.extend(collect(model, batch, tokenizer, method, reward_cfg, drawn_cfg, 1, seed + 2 * k,
                                 blank_seed=seed + 2 * k + 1, tools=tools, blank_fill=blank_fill,
                                 image_cfg=image_cfg).rollouts)
        for record, rollout, s, b in zip(batch.records, got.rollouts, got.scores, per_box):
            scores.append(s)
            categories.append(record.category or "all")
            rollouts.append(rollout)
            boxes.append(b)
            rows.append(dict(id=record.id, category=record.category, completion=rollout.completion,
                             correct=s[method.accuracy_key], **s, **({} if b is None else {"boxes": b})))
        if progress is not None:
            progress(len(batch.records))
        if max_samples and len(scores) >= max_samples:
            break
    if hosts.count > 1:  # every process's share, in sample order
        shares = hosts.everyone((scores, rows, categories, rollouts, boxes, pairs))
        scores, rows, categories, rollouts, boxes, pairs = ([x for share in shares for x in share[k]]
                                                            for k in range(6))
    if max_samples:
        scores, rows, categories = scores[:max_samples], rows[:max_samples], categories[:max_samples]
        rollouts, boxes, pairs = rollouts[:max_samples], boxes[:max_samples], pairs[:max_samples]
    summary = summarise(method, scores, categories)
    if method.box_details:
        summary["boxes"] = box_analyses(boxes)
    if method.needs_blank:
        summary["process"], groups = process_diagnostics(pairs if sampled else rollouts, reward_cfg,
                                                         "sampled (temperature 1)" if sampled else "greedy")
        for row, rollout in zip(rows, rollouts):
            row["process_group"] = groups.get(rollout.id)
    return summary, rows
