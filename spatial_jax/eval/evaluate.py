"""Policy evaluation: greedy rollouts on a dataset, scored by the method's reward, summarised with standard errors.

Accuracy is reported overall and per category (sample-weighted: each question counts once), with the grounding
figures the method has (mean matched IoU and mean box uncertainty H for SpatialCORE).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.eval.grounding import accuracy_by_category, estimate
from spatial_jax.methods import Method
from spatial_jax.rollout.collect import ToolSettings, collect
from spatial_jax.rollout.config import SamplingConfig

# reported with standard errors when the method produces them
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
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Greedy decoding over `batches` (pipeline Batches in RL mode); returns (summary, per-sample rows).
    Rollouts come from the same `collect` as training: tool turns for a method that uses tools, and a blank-image
    rollout per prompt for one that needs it (fill `blank_fill`), so the reward keeps every term it has in training."""
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=(tokenizer.im_end_id,),
                         pad_token_id=tokenizer.pad_id)
    scores, rows, categories = [], [], []
    for batch in batches:
        got = collect(model, batch, tokenizer, method, reward_cfg, cfg, 1, 0, tools=tools, blank_fill=blank_fill,
                      image_cfg=image_cfg)
        for record, rollout, s in zip(batch.records, got.rollouts, got.scores):
            scores.append(s)
            categories.append(record.category or "all")
            rows.append(dict(id=record.id, category=record.category, completion=rollout.completion, **s))
        if progress is not None:
            progress(len(batch.records))
        if max_samples and len(scores) >= max_samples:
            break
    if max_samples:
        scores, rows, categories = scores[:max_samples], rows[:max_samples], categories[:max_samples]
    return summarise(method, scores, categories), rows
