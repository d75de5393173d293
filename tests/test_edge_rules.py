"""Rules decided at an edge, each pinned where a one-character change would move it (issue 36's planted bugs): the
last `<answer>` tag, MRA's hit at a threshold exactly, AlloSpatial's map bonus at exactly max_rewarded_map_calls,
and a box whose uncertainty equals a quartile edge."""

import pytest

from spatial_jax.eval.grounding import iou_by_uncertainty_quartile
from spatial_jax.rewards import parse_harness
from spatial_jax.rewards.allospatial import AlloSpatialConfig, tool_score
from spatial_jax.suites.extract import choice_letter, mra


def test_the_last_answer_tag_decides():
    assert choice_letter("<answer>A</answer> on second thought <answer>C</answer>", 4) == "C"


@pytest.mark.parametrize("pred", [1.5, 0.5])
def test_mra_counts_a_relative_error_equal_to_one_minus_a_threshold_as_a_hit(pred):
    # |pred - 1| / 1 = 0.5 = 1 - 0.50 exactly: a hit at the 0.50 threshold only, of ten
    assert mra(pred, 1.0) == pytest.approx(0.1)
    assert mra(1.0, 1.0) == 1.0


def _map_calls(n: int) -> parse_harness.ParsedHarness:
    call = parse_harness.ToolCall(0, 1, "", "map", {}, "map", malformed=False)
    return parse_harness.ParsedHarness(steps=(), tool_calls=(call,) * n, answer="A")


def test_the_map_bonus_is_paid_up_to_and_at_max_rewarded_map_calls():
    cfg = AlloSpatialConfig()
    at_max = cfg.max_rewarded_map_calls
    assert tool_score(_map_calls(at_max), 1.0, cfg) == pytest.approx(cfg.map_bonus)
    assert tool_score(_map_calls(1), 1.0, cfg) == pytest.approx(cfg.map_bonus)
    assert tool_score(_map_calls(at_max + 1), 1.0, cfg) == pytest.approx(-cfg.penalty_extra_map_call)


def test_an_uncertainty_equal_to_a_quartile_edge_goes_to_the_upper_quartile():
    # edges of [1, 2, 3, 4, 5] are 2, 3 and 4 exactly: 1 | 2 | 3 | 4, 5
    quartiles = iou_by_uncertainty_quartile([1, 2, 3, 4, 5], [0.1, 0.2, 0.3, 0.4, 0.5])
    assert [q.n for q in quartiles] == [1, 1, 1, 2]
    assert [q.mean for q in quartiles] == pytest.approx([0.1, 0.2, 0.3, 0.45])
