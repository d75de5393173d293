"""Policy evaluation: greedy rollouts on a dataset, scored by the method's reward, summarised with standard errors.

Accuracy is reported overall and per category (sample-weighted: each question counts once), with the grounding
figures the method has (mean matched IoU and mean box uncertainty H for SpatialCORE).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.data.pipeline import blank_batch
from spatial_jax.eval.grounding import accuracy_by_category, estimate
from spatial_jax.rewards.registry import get_method
from spatial_jax.rl.multiturn import sample_multiturn
from spatial_jax.rl.rollouts import sample, to_rollouts
from spatial_jax.sampling.config import SamplingConfig

# method -> the component that says the answer is right
ACCURACY_KEY = {"spatialcore": "r_ans", "prosr": "r_acc", "spatialthinker": "accuracy", "allospatial": "accuracy_ungated"}
# method -> whether a completion is well-formed, from its components
WELL_FORMED: dict[str, Callable[[dict], bool]] = {
    "spatialcore": lambda c: c["well_formed"] > 0 and c["think_close_count"] == 1,
    "prosr": lambda c: c["r_fmt"] > 0,
    "spatialthinker": lambda c: c["format"] > 0,
    "allospatial": lambda c: c["structure"] >= 0.85,
}
# reported with standard errors when the method produces them
_GROUNDING = ("mean_matched_iou", "mean_H", "r_spatial", "precision", "recall", "spatial", "count", "tool")


def summarise(method: str, scores: list[dict[str, float]], categories: list[str]) -> dict[str, Any]:
    acc_key, well_formed = ACCURACY_KEY[method], WELL_FORMED[method]
    correct = [s[acc_key] for s in scores]
    out: dict[str, Any] = {
        "n": len(scores),
        "accuracy": estimate(correct).as_dict(),
        "reward": estimate([s["reward"] for s in scores]).as_dict(),
        "well_formed": estimate([float(well_formed(s)) for s in scores]).as_dict(),
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
    method: str,
    reward_cfg,
    max_new_tokens: int,
    max_samples: int = 0,
    progress: Callable[[int], None] | None = None,
    max_tool_turns: int = 0,
    max_tool_tokens: int = 512,
    blank_fill: str = "mean",
    image_cfg: ImageProcessingConfig = ImageProcessingConfig(),
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Greedy decoding over `batches` (pipeline Batches in RL mode); returns (summary, per-sample rows).
    AlloSpatial with max_tool_turns > 0 runs the same multi-turn tool rollouts as training; ProSR decodes each
    prompt on a blank image too (fill `blank_fill`, images processed with `image_cfg`), so its reward has the
    counterfactual term it has in training (ProSR eq. 8)."""
    scorer = get_method(method).score_batch
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=(tokenizer.im_end_id,),
                         pad_token_id=tokenizer.pad_id)
    scores, rows, categories = [], [], []
    for batch in batches:
        if method == "allospatial" and max_tool_turns > 0:
            completions = sample_multiturn(model, batch, tokenizer, cfg, 1, 0, max_turns=max_tool_turns,
                                           max_tool_tokens=max_tool_tokens)
        else:
            completions = sample(model, batch, tokenizer, cfg, group_size=1, seed=0)
        blank = None
        if method == "prosr":
            blank = sample(model, blank_batch(batch, blank_fill, image_cfg), tokenizer, cfg, group_size=1, seed=0)
        rollouts = to_rollouts(batch, completions, 1, step=0, blank=blank)
        for record, rollout, s in zip(batch.records, rollouts, scorer(rollouts, reward_cfg)):
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
