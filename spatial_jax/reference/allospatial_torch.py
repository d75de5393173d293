"""Torch float64 reference of the AlloSpatial HGTR reward (SPEC 5), written apart from rewards/allospatial.py.

Shares only the string parser (rewards/parse_harness.py); every number is computed here as batched tensors.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from spatial_jax.records import Rollout
from spatial_jax.rewards import parse_harness
from spatial_jax.rewards.allospatial import AlloSpatialConfig

F64 = torch.float64
_WORDS_DIGITS_PUNCT = re.compile(r"\d|[^\W\d]+|[^\w\s]")
_GATE_SLACK = 1e-9
_MRA_SLACK = 1e-9  # decimal ties with a threshold (|1.1 - 1| / 1 vs 1 - 0.9) pass


def mra(pred: torch.Tensor, target: torch.Tensor, thresholds: Sequence[float]) -> torch.Tensor:
    """[n] mean relative accuracy; y = 0 needs an exact 0, and non-finite values score 0."""
    pred, target = pred.to(F64), target.to(F64)
    zero = target == 0
    rel_nonzero = (pred - target).abs() / torch.where(zero, 1.0, target.abs())
    rel = torch.where(zero, torch.where(pred == 0, 0.0, torch.inf), rel_nonzero)
    rel = torch.where(torch.isfinite(pred) & torch.isfinite(target), rel, torch.inf)
    tol = 1.0 - torch.tensor(thresholds, dtype=F64) + _MRA_SLACK
    return (rel[:, None] <= tol[None, :]).to(F64).mean(dim=1)


def harness_features(h: parse_harness.ParsedHarness) -> list[float]:
    maps, views = h.calls("map"), h.calls("view")
    return [
        float(h.answer is not None), float(h.has_step(1)), float(h.has_step(5)),
        float(h.has_step(parse_harness.STEP_MAP)), float(h.has_step(parse_harness.STEP_VIEW)),
        float(len(maps)), float(len(views)), float(sum(c.valid for c in maps)), float(sum(c.valid for c in views)),
        float(h.cross_check_after_tools), float(h.n_malformed), float(h.n_missing_arguments),
    ]


def _in_range(n: torch.Tensor, hi: int) -> torch.Tensor:
    return ((n >= 1) & (n <= hi)).to(F64)


def hgtr(features: torch.Tensor, acc_raw: torch.Tensor, n_tokens: torch.Tensor,
         cfg: AlloSpatialConfig) -> dict[str, torch.Tensor]:
    """Batched HGTR from [n, 12] harness features (see `harness_features`), ungated accuracy and token counts."""
    (answer, step1, step5, map_step, view_step, n_map, n_view, valid_map, valid_view, cross_ok,
     malformed, missing) = features.to(F64).unbind(dim=1)
    has_map, has_view = (n_map > 0).to(F64), (n_view > 0).to(F64)
    penalty = (
        cfg.penalty_no_step1 * (1 - step1)
        + cfg.penalty_no_step5 * (1 - step5)
        + cfg.penalty_map_step_without_call * map_step * (1 - has_map)
        + cfg.penalty_view_step_without_call * view_step * (1 - has_view)
        + cfg.penalty_tool_without_step * (has_map * (1 - map_step) + has_view * (1 - view_step))
        + cfg.penalty_no_cross_check * (1 - cross_ok)
        + cfg.penalty_malformed_call * malformed
        + cfg.penalty_missing_argument * missing
    )
    structure = answer * (1 - penalty).clamp(0.0, 1.0)
    accuracy = torch.where(structure >= cfg.accuracy_gate - _GATE_SLACK, acc_raw.to(F64), 0.0)
    tool = (
        cfg.map_bonus * accuracy * _in_range(valid_map, cfg.max_rewarded_map_calls)
        + cfg.view_bonus * accuracy * _in_range(valid_view, cfg.max_rewarded_view_calls)
        - cfg.penalty_extra_map_call * (n_map - cfg.max_rewarded_map_calls).clamp(min=0)
    ).clamp(-1.0, 1.0)
    excess = (n_tokens.to(F64) - cfg.length_free_tokens).clamp(min=0)
    length = -(excess / (cfg.length_full_penalty_tokens - cfg.length_free_tokens)).clamp(max=1.0)
    reward = cfg.w_structure * structure + cfg.w_accuracy * accuracy + cfg.w_tool * tool + cfg.w_length * length
    return {"reward": reward, "structure": structure, "accuracy": accuracy, "tool": tool, "length": length}


def _tokens(r: Rollout) -> int:
    if r.num_generated_tokens is not None:
        return r.num_generated_tokens
    spans = torch.tensor(parse_harness.response_spans(r.completion), dtype=torch.int64).reshape(-1, 2)
    if r.trace.offsets:
        off = torch.tensor(r.trace.offsets, dtype=torch.int64)
        inside = ((spans[None, :, 0] <= off[:, None, 0]) & (off[:, None, 1] <= spans[None, :, 1])).any(dim=1)
        return int((~inside).sum())
    return len(_WORDS_DIGITS_PUNCT.findall(parse_harness.model_text(r.completion)))


def score_batch(rollouts: Sequence[Rollout], cfg: AlloSpatialConfig = AlloSpatialConfig()) -> list[dict[str, float]]:
    if not rollouts:
        return []
    parsed = [parse_harness.parse(r.completion) for r in rollouts]
    feats = torch.tensor([harness_features(h) for h in parsed], dtype=F64)
    acc_raw = torch.zeros(len(rollouts), dtype=F64)
    numeric = []
    for i, (r, h) in enumerate(zip(rollouts, parsed)):
        gold = parse_harness.read_gold(r.answer, r.options)
        if h.answer is None or gold is None:
            continue
        if isinstance(gold, float):
            pred = parse_harness.read_number(h.answer)
            if pred is not None:
                numeric.append((i, pred, gold))
        else:
            acc_raw[i] = float(parse_harness.read_letter(h.answer, r.options) == gold)
    if numeric:
        idx, pred, gold = zip(*numeric)
        acc_raw[list(idx)] = mra(torch.tensor(pred, dtype=F64), torch.tensor(gold, dtype=F64), cfg.mra_thresholds)
    n_tokens = torch.tensor([_tokens(r) for r in rollouts], dtype=F64)
    out = hgtr(feats, acc_raw, n_tokens, cfg)
    return [
        {**{k: float(v[i]) for k, v in out.items()}, "accuracy_ungated": float(acc_raw[i]),
         "generated_tokens": float(n_tokens[i]), "map_calls": float(feats[i, 5]), "view_calls": float(feats[i, 6]),
         "malformed_calls": float(feats[i, 10]), "answer_parsed": float(feats[i, 0]),
         "gold_resolved": float(parse_harness.read_gold(r.answer, r.options) is not None)}
        for i, r in enumerate(rollouts)
    ]
