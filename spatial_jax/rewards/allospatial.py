"""AlloSpatial harness-gated trajectory reward, HGTR (SPEC 5; AlloSpatial §3.4, App. A).

R = 0.15 structure + 0.60 accuracy + 0.10 tool + 0.15 length, with structure in [0, 1], accuracy in [0, 1]
(0 unless structure >= 0.85), tool in [-1, 0.7] (its bonuses sum to 0.7), length in [-1, 0]; so with the default
weights R lies in [-0.25, 0.82]. Text inside `<tool_response>...</tool_response>` is tool output and is ignored.

Choices the paper leaves open, settled here:
- Numeric answers score MRA. For gold y = 0 the relative error is 0 when the prediction is 0 and infinite
  otherwise, so MRA is 1 or 0; a prediction with no finite number scores 0.
- Gold and `<Answer>` are read by `parse_harness.read_gold` / `read_number` / `read_letter`: a gold without
  options that is a number (optionally with a unit, "1.1 m") is numeric; otherwise it is a letter ("B", "(B)",
  "B. Yes") or an option's text. A gold that reads as neither scores accuracy 0.
- "Step4 after tool use" means a Step4 header after the last map/view call; the tool and step penalties apply
  once per tool kind; a map/view call is one that names world2mind/view_image (malformed JSON is neither).
- Tool term: valid calls (known tool, all required arguments) earn the bonuses; every map call counts towards
  the penalty beyond the second.
- Generated tokens: `rollout.num_generated_tokens`; else the tokens of `rollout.trace` that do not lie inside a
  `<tool_response>` span; else an estimate from the model's text (see `estimate_tokens`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

from spatial_jax.config import check_at_least, check_non_negative, check_range, require
from spatial_jax.records import Rollout
from spatial_jax.rewards import parse_harness
from spatial_jax.rewards.advantages import AdvantageConfig
from spatial_jax.rewards.text import short_answer_score

# Qwen tokenizers split numbers into single digits: words, digits and punctuation marks each count as one.
_TOKEN_ESTIMATE = re.compile(r"\d|[^\W\d]+|[^\w\s]")
# Penalty sums such as 1 - 0.15 must pass a 0.85 gate despite float rounding.
GATE_SLACK = 1e-9
# A relative error that equals 1 - theta in decimals (1.1 vs 1.0 at theta = 0.9) must pass despite float rounding.
MRA_SLACK = 1e-9


@dataclasses.dataclass(frozen=True)
class AlloSpatialConfig:
    # R = w_structure structure + w_accuracy accuracy + w_tool tool + w_length length (SPEC 5).
    w_structure: float = 0.15
    w_accuracy: float = 0.60
    w_tool: float = 0.10
    w_length: float = 0.15
    penalty_no_step1: float = 0.30
    penalty_no_step5: float = 0.20
    penalty_map_step_without_call: float = 0.35
    penalty_view_step_without_call: float = 0.35
    penalty_tool_without_step: float = 0.10
    penalty_no_cross_check: float = 0.10
    penalty_malformed_call: float = 0.15
    penalty_missing_argument: float = 0.20
    accuracy_gate: float = 0.85
    mra_thresholds: tuple[float, ...] = (0.50, 0.55, 0.60, 0.65, 0.70, 0.75, 0.80, 0.85, 0.90, 0.95)
    map_bonus: float = 0.5
    max_rewarded_map_calls: int = 2
    view_bonus: float = 0.2
    max_rewarded_view_calls: int = 4
    penalty_extra_map_call: float = 0.15
    advantage: AdvantageConfig = AdvantageConfig()  # eq. 2 (GRPO group advantages)
    length_free_tokens: int = 2000
    length_full_penalty_tokens: int = 4000

    def __post_init__(self) -> None:
        check_non_negative(
            self, "w_structure", "w_accuracy", "w_tool", "w_length", "penalty_no_step1", "penalty_no_step5",
            "penalty_map_step_without_call", "penalty_view_step_without_call", "penalty_tool_without_step",
            "penalty_no_cross_check", "penalty_malformed_call", "penalty_missing_argument", "map_bonus",
            "view_bonus", "penalty_extra_map_call",
        )
        check_range(self, "accuracy_gate", 0.0, 1.0)
        require("mra_thresholds", self.mra_thresholds,
                bool(self.mra_thresholds) and all(math.isfinite(t) and 0.0 <= t <= 1.0 for t in self.mra_thresholds),
                "be a non-empty list of values in [0, 1]")
        check_at_least(self, max_rewarded_map_calls=1, max_rewarded_view_calls=1, length_free_tokens=0)
        require("length_full_penalty_tokens", self.length_full_penalty_tokens,
                self.length_full_penalty_tokens > self.length_free_tokens,
                f"be > length_free_tokens = {self.length_free_tokens}")


def mra(prediction: float, target: float, thresholds: Sequence[float]) -> float:
    """Mean relative accuracy: mean over theta of 1[|y_hat - y| / |y| <= 1 - theta] (SPEC 5); 0 if not finite.

    The comparison allows MRA_SLACK, so a relative error on a threshold in decimal terms counts as within it."""
    if not (math.isfinite(prediction) and math.isfinite(target)):
        return 0.0
    if target == 0.0:
        rel = 0.0 if prediction == 0.0 else math.inf
    else:
        rel = abs(prediction - target) / abs(target)
    return sum(rel <= 1.0 - t + MRA_SLACK for t in thresholds) / len(thresholds)


def structure_score(h: parse_harness.ParsedHarness, cfg: AlloSpatialConfig) -> float:
    """SPEC 5 structure: 0 without <Answer>, else 1 minus the harness penalties, clamped to [0, 1]."""
    if h.answer is None:
        return 0.0
    has_map_calls, has_view_calls = bool(h.calls("map")), bool(h.calls("view"))
    has_map_step, has_view_step = h.has_step(parse_harness.STEP_MAP), h.has_step(parse_harness.STEP_VIEW)
    penalty = (
        cfg.penalty_no_step1 * (not h.has_step(1))
        + cfg.penalty_no_step5 * (not h.has_step(5))
        + cfg.penalty_map_step_without_call * (has_map_step and not has_map_calls)
        + cfg.penalty_view_step_without_call * (has_view_step and not has_view_calls)
        + cfg.penalty_tool_without_step * (has_map_calls and not has_map_step)
        + cfg.penalty_tool_without_step * (has_view_calls and not has_view_step)
        + cfg.penalty_no_cross_check * (not h.cross_check_after_tools)
        + cfg.penalty_malformed_call * h.n_malformed
        + cfg.penalty_missing_argument * h.n_missing_arguments
    )
    return min(1.0, max(0.0, 1.0 - penalty))


def raw_accuracy(answer_text: str | None, rollout: Rollout, cfg: AlloSpatialConfig) -> float:
    """Ungated accuracy of the `<Answer>` content: MRA for a numeric gold, a text gold's normalised match (numbers
    on both sides by MRA, SPEC section 10), exact letter otherwise."""
    if rollout.answer_type == "text":
        return short_answer_score(answer_text, rollout.answer, lambda p, g: mra(p, g, cfg.mra_thresholds))
    gold = parse_harness.read_gold(rollout.answer, rollout.options)
    if answer_text is None or gold is None:
        return 0.0
    if isinstance(gold, float):
        pred = parse_harness.read_number(answer_text)
        return 0.0 if pred is None else mra(pred, gold, cfg.mra_thresholds)
    return float(parse_harness.read_letter(answer_text, rollout.options) == gold)


def tool_score(h: parse_harness.ParsedHarness, accuracy: float, cfg: AlloSpatialConfig) -> float:
    """SPEC 5 tool term in [-1, 1]: bonuses scale with (gated) accuracy; extra map calls are penalised."""
    maps, views = h.calls("map"), h.calls("view")
    valid_maps = sum(c.valid for c in maps)
    valid_views = sum(c.valid for c in views)
    score = (
        cfg.map_bonus * accuracy * (1 <= valid_maps <= cfg.max_rewarded_map_calls)
        + cfg.view_bonus * accuracy * (1 <= valid_views <= cfg.max_rewarded_view_calls)
        - cfg.penalty_extra_map_call * max(0, len(maps) - cfg.max_rewarded_map_calls)
    )
    return min(1.0, max(-1.0, score))


def length_score(n_tokens: int, cfg: AlloSpatialConfig) -> float:
    """SPEC 5 length: 0 up to 2000 tokens, linear to -1 at 4000, -1 beyond."""
    span = cfg.length_full_penalty_tokens - cfg.length_free_tokens
    return 0.0 - min(1.0, max(0, n_tokens - cfg.length_free_tokens) / span)


def estimate_tokens(text: str) -> int:
    """Approximate token count of model text: words, single digits and punctuation marks count one each."""
    return len(_TOKEN_ESTIMATE.findall(text))


def generated_tokens(rollout: Rollout) -> int:
    """Model-generated tokens of a rollout, tool output excluded (see module docstring for the fallbacks)."""
    if rollout.num_generated_tokens is not None:
        return rollout.num_generated_tokens
    spans = parse_harness.response_spans(rollout.completion)
    if rollout.trace.offsets:
        inside = sum(any(a <= s and e <= b for a, b in spans) for s, e in rollout.trace.offsets)
        return len(rollout.trace.offsets) - inside
    return estimate_tokens(parse_harness.model_text(rollout.completion))


def score(rollout: Rollout, cfg: AlloSpatialConfig = AlloSpatialConfig()) -> dict[str, float]:
    """HGTR of one rollout: "reward", its components and parse diagnostics."""
    h = parse_harness.parse(rollout.completion)
    structure = structure_score(h, cfg)
    acc_raw = raw_accuracy(h.answer, rollout, cfg)
    accuracy = acc_raw if structure >= cfg.accuracy_gate - GATE_SLACK else 0.0
    tool = tool_score(h, accuracy, cfg)
    n_tokens = generated_tokens(rollout)
    length = length_score(n_tokens, cfg)
    reward = cfg.w_structure * structure + cfg.w_accuracy * accuracy + cfg.w_tool * tool + cfg.w_length * length
    return {
        "reward": reward,
        "structure": structure,
        "accuracy": accuracy,
        "accuracy_ungated": acc_raw,
        "tool": tool,
        "length": length,
        "generated_tokens": float(n_tokens),
        "map_calls": float(len(h.calls("map"))),
        "view_calls": float(len(h.calls("view"))),
        "malformed_calls": float(h.n_malformed),
        "answer_parsed": float(h.answer is not None),
        "gold_resolved": float(rollout.answer_type == "text"
                               or parse_harness.read_gold(rollout.answer, rollout.options) is not None),
    }


def score_batch(rollouts: Sequence[Rollout], cfg: AlloSpatialConfig = AlloSpatialConfig()) -> list[dict[str, float]]:
    return [score(r, cfg) for r in rollouts]
