"""SpatialCORE reward (SPEC 2): parser, hand-computed reward cases, format term, answer gate, advantages, config."""

import math

import numpy as np
import pytest

from spatial_jax.config import ConfigError, apply_overrides
from spatial_jax.kernels.position.uncertainty import LN10
from spatial_jax.methods import get_method
from spatial_jax.records import GTBox, Rollout, TokenTrace
from spatial_jax.rewards.advantages import advantages_by_group
from spatial_jax.rewards.advantages import group_advantages_jit as group_advantages
from spatial_jax.rewards.parse_think import answer_letter, parse_think, resolve_gold
from spatial_jax.rewards.spatialcore import SpatialCOREConfig, f_alpha, score, score_batch
from spatial_jax.testing import rollouts as synthetic

CFG = SpatialCOREConfig()
OPTIONS = ("A. the sedan is left", "B. a man on the left")


def box_line(b, label):
    return f'{{"bbox_2d": [{b[0]}, {b[1]}, {b[2]}, {b[3]}], "label": "{label}"}}'


def make(completion, gt=(), digit_h=0.0, other_h=1.0, question="Where is the black car?",
         answer="B. a man on the left"):
    offsets = synthetic.tokenize(completion)
    ent = [digit_h if completion[s:e].isdigit() else other_h for s, e in offsets]
    return Rollout(id="x", completion=completion, question=question, options=OPTIONS, answer=answer,
                   gt_boxes=tuple(GTBox(bbox=tuple(map(float, b)), label=lab, validity=v) for b, lab, v in gt),
                   trace=TokenTrace(entropies=tuple(ent), offsets=tuple(offsets)))


def test_parse_think_boxes_and_spans():
    text = (box_line([10, 20, 300, 400], "black sedan") + "\n" + '{"label": "man", "bbox_2d": [1, 2, 3, 4]}\n'
            + '{"bbox_2d": [1, 2, 3], "label": "x"}\n{"bbox_2d": [5, 5, 1, 9], "label": "y"}\n'
            + '{"bbox_2d": [1.5, 2, 3, 4], "label": "z"}\nThink.\n</think>\nB\n' + box_line([1, 1, 2, 2], "late"))
    p = parse_think(text)
    assert [b.valid for b in p.boxes] == [True, True, False, False, False]
    assert p.boxes[0].bbox == (10, 20, 300, 400) and p.boxes[1].label == "man"
    assert [text[s:e] for s, e in p.boxes[0].coord_spans] == ["10", "20", "300", "400"]
    assert p.reasoning_span == (0, text.index("</think>"))
    assert p.think_close_count == 1 and not p.well_formed_tail  # a box after the answer breaks the tail
    assert p.answer == "B"


def test_answer_letter_rule():
    assert answer_letter("x</think>\n  C \n") == "C"
    assert answer_letter("x</think>The answer is B.") == "B"
    assert answer_letter("x</think>(A) or maybe D") == "D"
    assert answer_letter("x</think>none") is None
    assert answer_letter("no close tag B") is None
    assert answer_letter("a</think>A</think>B") == "B"  # text after the last </think>


def test_resolve_gold():
    assert resolve_gold("B. a man on the left", OPTIONS) == "B"
    assert resolve_gold("(B) a man on the left", OPTIONS) == "B"
    assert resolve_gold("A. B is wrong", OPTIONS) == "A"  # the leading letter, never a later word
    assert resolve_gold("b", OPTIONS) == "B"
    assert resolve_gold(1, OPTIONS) == "B"
    assert resolve_gold(2, OPTIONS) is None and resolve_gold(-1, OPTIONS) is None
    assert resolve_gold("a man on the left", OPTIONS) == "B"  # option text
    assert resolve_gold("A man on the right", OPTIONS) is None  # an article, not a letter
    assert resolve_gold(None, OPTIONS) is None and resolve_gold(True, OPTIONS) is None
    assert resolve_gold(1.0, OPTIONS) is None


def test_f_alpha_alpha_two():
    assert f_alpha(0.5, 0.8, 2.0) == pytest.approx(5 * 0.4 / (4 * 0.5 + 0.8))
    assert f_alpha(0.0, 0.0, 2.0) == 0.0
    assert f_alpha(0.3, 0.3, 2.0) == pytest.approx(0.3)


def _hand_spatial(p, rec):
    return 5 * p * rec / (4 * p + rec)


@pytest.mark.parametrize("digit_h,omega", [(0.0, 1.0), (LN10, 0.1)])
def test_hand_computed_reward(digit_h, omega):
    text = box_line([0, 0, 100, 100], "black sedan ahead") + "\nReasoning.\n</think>\nB"
    ro = make(text, gt=[([0, 0, 100, 50], "black sedan", 0.8)], digit_h=digit_h)
    s = score(ro)
    r = (0.8 * (0.5 - 0.25) + 0.2 * 2 / math.sqrt(6)) * 0.8
    assert s["precision"] == pytest.approx(omega * r, abs=1e-12)
    assert s["recall"] == pytest.approx(r / 0.8, abs=1e-12)
    assert s["mean_H"] == pytest.approx(digit_h / LN10, abs=1e-12) and s["n_with_H"] == 1
    expected_sp = _hand_spatial(omega * r, r / 0.8)
    assert s["r_spatial"] == pytest.approx(expected_sp, abs=1e-12)
    assert s["r_ans"] == 1.0 and s["format"] == pytest.approx(0.25)  # "black" is in the question: bonus
    assert s["reward"] == pytest.approx(1.0 + 0.25 + expected_sp, abs=1e-12)
    assert s["mean_matched_iou"] == pytest.approx(0.5)


def test_box_without_token_trace_gets_omega_one():
    text = box_line([0, 0, 100, 100], "car") + "\n</think>\nB"
    ro = make(text, gt=[([0, 0, 100, 100], "car", 1.0)])
    bare = Rollout(id="x", completion=text, options=OPTIONS, answer="B", gt_boxes=ro.gt_boxes)
    s = score(bare)
    assert s["n_with_H"] == 0 and s["precision"] == pytest.approx(0.8 * 0.75 + 0.2)


def test_no_reference_and_no_prediction():
    text = box_line([0, 0, 100, 100], "car") + "\n" + box_line([0, 0, 50, 100], "dog") + "\n</think>\nB"
    s = score(make(text))
    assert s["r_spatial"] == 0.0 and s["over_penalty"] == 0.0 and s["format"] == pytest.approx(0.2)  # no bonus
    s = score(make("Nothing to box.\n</think>\nB", gt=[([0, 0, 9, 9], "car", 0.5)]))
    assert s["r_spatial"] == pytest.approx(-0.15) and s["spatial_term"] == pytest.approx(-0.15)
    gt4 = [([0, 0, 9, 9], f"thing {i}", 1.0) for i in range(4)]
    assert score(make("Nothing.\n</think>\nA", gt=gt4))["r_spatial"] == -1.0  # -1.2 floored


def test_over_prediction_and_invalid_boxes():
    boxes = [box_line([0, 0, 100, 100], "car"), box_line([0, 0, 99, 100], "car"), box_line([1, 0, 100, 100], "van")]
    invalid = '{"bbox_2d": [50, 50, 10, 10], "label": "car"}'
    gt = [([0, 0, 100, 100], "car", 1.0)]
    s = score(make("\n".join(boxes + [invalid]) + "\n</think>\nB", gt=gt))
    assert s["n_pred"] == 3 and s["n_invalid"] == 1 and s["n_matched"] == 1
    assert s["over_penalty"] == pytest.approx(0.6)
    assert s["r_spatial"] == pytest.approx(s["f_alpha"] - 0.6)
    s1 = score(make(boxes[0] + "\n" + invalid + "\n</think>\nB", gt=gt))
    assert s1["over_penalty"] == 0.0 and s1["n_invalid"] == 1  # invalid boxes are never penalised


def test_answer_gate_never_softens_a_penalty():
    gt = [([0, 0, 100, 100], "car", 1.0)]
    good = box_line([0, 0, 100, 100], "car") + "\n</think>\n"
    right, wrong = score(make(good + "B", gt=gt)), score(make(good + "A", gt=gt))
    assert right["r_spatial"] == pytest.approx(wrong["r_spatial"]) and right["r_spatial"] > 0
    assert right["spatial_term"] == pytest.approx(right["r_spatial"])
    assert wrong["spatial_term"] == pytest.approx(0.3 * wrong["r_spatial"])
    extra = "\n".join(box_line([500, 500, 600 + i, 600], f"thing {i}") for i in range(3))
    penalised = score(make(extra + "\n</think>\nA", gt=gt))
    assert penalised["r_ans"] == 0.0 and penalised["r_spatial"] < 0
    assert penalised["spatial_term"] == pytest.approx(penalised["r_spatial"])
    none = score(make("no boxes\n</think>\nA", gt=gt))
    assert none["spatial_term"] == pytest.approx(-0.3)


def test_format_term():
    gt = [([0, 0, 100, 100], "car", 1.0)]
    cars = "\n".join(box_line([i, 0, 100, 100], "Car ") for i in range(5))
    assert score(make(cars + "\n</think>\nB", gt=gt, question="q"))["format"] == pytest.approx(0.2 - 0.15)
    same_xy = box_line([0, 0, 9, 9], "cat") + "\n" + box_line([0, 0, 9, 9], "dog")
    assert score(make(same_xy + "\n</think>\nB", gt=gt, question="q"))["format"] == pytest.approx(0.1)
    assert score(make(same_xy + "\n</think>\nB", gt=gt, question="the dog"))["format"] == pytest.approx(0.15)
    assert score(make("x\n</think>\n</think>\nB", gt=gt))["format"] == 0.0
    s = score(make("x\n</think>\nThe answer is B.", gt=gt))
    assert s["format"] == 0.0 and s["r_ans"] == 1.0


def test_truncated_completion_scores_zero():
    gt = [([0, 0, 100, 100], "car", 1.0)]
    s = score(make(box_line([0, 0, 100, 100], "car") + "\nstill thinking B", gt=gt))
    assert s["reward"] == 0.0 and s["r_ans"] == 0.0 and s["format"] == 0.0 and s["r_spatial"] == 0.0
    assert s["think_closed"] == 0.0


def test_batch_equals_single():
    ros = synthetic.rollouts(40, seed=3)
    batch = score_batch(ros, CFG)
    for ro, b in zip(ros, batch):
        assert score(ro, CFG) == pytest.approx(b, abs=1e-12)


def test_config_validation_and_overrides():
    with pytest.raises(ValueError, match="w_iou"):
        SpatialCOREConfig(w_iou=0.7)
    assert apply_overrides(CFG, ["beta=0.5"]).beta == 0.5
    assert apply_overrides(CFG, ["w_iou=0.7", "w_label=0.3"]).w_label == 0.3
    with pytest.raises(ConfigError):
        apply_overrides(CFG, ["nope=1"])
    with pytest.raises(ConfigError):
        get_method("spatialcore").config(["gamma=2"])
    assert get_method("spatialcore").config(["beta=0.5"]).beta == 0.5
    beta_half = score(make(box_line([0, 0, 9, 9], "car") + "\n</think>\nB", gt=[([0, 0, 9, 9], "car", 1.0)],
                           digit_h=LN10), SpatialCOREConfig(beta=0.5))
    assert beta_half["precision"] == pytest.approx(0.5 * (0.8 * 0.75 + 0.2))


def test_group_advantages_eq2():
    adv = np.asarray(group_advantages(np.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])))
    np.testing.assert_allclose(adv[0], np.array([1, -1, -1, 1]) * 0.5 / (0.5 + 1e-4), rtol=1e-6)
    np.testing.assert_array_equal(adv[1], 0.0)
    sample = np.asarray(group_advantages(np.array([[1.0, 0.0]]), 1e-4, "sample"))
    np.testing.assert_allclose(sample, [[0.5 / (math.sqrt(0.5) + 1e-4), -0.5 / (math.sqrt(0.5) + 1e-4)]], rtol=1e-6)
    mask = np.array([[True, True, False]])
    masked = np.asarray(group_advantages(np.array([[2.0, 0.0, 99.0]]), 1e-4, "population", mask))
    np.testing.assert_allclose(masked, [[1 / (1 + 1e-4), -1 / (1 + 1e-4), 0.0]], rtol=1e-6)
    out = advantages_by_group([1.0, 2.0, 3.0, 5.0, 0.1, 0.1], ["a", "a", None, "b", "c", "c"])
    assert out[2] is None and out[3] == 0.0 and out[4] == 0.0 and out[5] == 0.0
    assert out[0] == pytest.approx(-0.5 / (0.5 + 1e-4), rel=1e-12) and out[1] == pytest.approx(-out[0], rel=1e-12)
    with pytest.raises(ValueError):
        group_advantages(np.zeros((1, 2)), 1e-4, "bogus")


def test_dr_grpo_advantages_by_hand():
    """Dr. GRPO (Liu et al. 2025, Sec. 3.1): A_i = r_i - mean_G r, no division by the group's std. Rewards
    (1, 0, 0, 0): mean 1/4, advantages (3/4, -1/4, -1/4, -1/4), where eq. 2 would give (sqrt 3, -1/sqrt 3, ...)."""
    r = np.array([[1.0, 0.0, 0.0, 0.0], [2.0, 4.0, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3]])
    adv = np.asarray(group_advantages(r, 1e-4, "none"))
    np.testing.assert_allclose(adv[0], [0.75, -0.25, -0.25, -0.25], rtol=1e-6)
    np.testing.assert_allclose(adv[1], [0.5, 2.5, -1.5, -1.5], rtol=1e-6)
    np.testing.assert_array_equal(adv[2], 0.0)  # no spread: 0 exactly, whatever the rounding of the mean
    mask = np.array([[True, True, False, False]] * 3)
    np.testing.assert_allclose(np.asarray(group_advantages(r, 1e-4, "none", mask))[1], [-1.0, 1.0, 0.0, 0.0])
    scaled = np.asarray(group_advantages(r[:1], 1e-4, "population"))[0]
    np.testing.assert_allclose(scaled, adv[0] / (math.sqrt(3) / 4 + 1e-4), rtol=1e-6)
    out = advantages_by_group([1.0, 0.0, 7.0, 5.0], ["a", "a", "b", None], std="none")
    assert out == [0.5, -0.5, 0.0, None]


def test_overlong_and_non_ascii_coordinates_are_invalid_boxes():
    """A 5000-digit coordinate (beyond int()'s 4300-digit limit) and Unicode digits are no JSON integers in
    [0, 1000]: the box is invalid (ignored by the spatial reward), never a crash; main and torch agree."""
    from spatial_jax.reference import spatialcore_torch

    huge = box_line(["9" * 5000, 0, 10, 10], "car")
    arabic = box_line(["\u0661\u0662", 0, 300, 300], "car")
    good = box_line(["0" * 5000 + "1", 0, 100, 100], "car")  # leading zeros: still the integer 1
    gt = [([0, 0, 100, 100], "car", 1.0)]
    ro = make("\n".join([huge, arabic, good]) + "\n</think>\nB", gt=gt)
    assert [b.valid for b in parse_think(ro.completion).boxes] == [False, False, True]
    main, ref = score(ro), spatialcore_torch.score_batch([ro], CFG)[0]
    assert main["n_pred"] == 1.0 and main["n_invalid"] == 2.0 and main["over_penalty"] == 0.0
    assert main == pytest.approx(ref, abs=1e-12)


def test_numpy_integer_gold_is_an_option_index():
    assert resolve_gold(np.int64(1), OPTIONS) == "B" and resolve_gold(np.int32(5), OPTIONS) is None
    assert score(make("x\n</think>\nB", answer=np.int64(1)))["r_ans"] == 1.0


def test_format_floor_bounds_the_reward():
    """SPEC 2 (settled 2026-11-30): the format term is floored at -0.2, so 200 copies of one box (-20.8 before)
    score -1.2, the bottom of [-1.2, 2.25]; the torch reference applies the same floor."""
    from spatial_jax.reference import spatialcore_torch

    copies = "\n".join([box_line([0, 0, 100, 100], "car")] * 200)
    ro = make(copies + "\n</think>\nA", gt=[([500, 500, 600, 600], "dog", 1.0)])
    s = score(ro)
    assert s["format"] == pytest.approx(-0.2) and s["r_spatial"] == -1.0
    assert s["reward"] == pytest.approx(-1.2) and s["reward"] >= -1.2 - 1e-12
    assert s == pytest.approx(spatialcore_torch.score_batch([ro], CFG)[0], abs=1e-12)
    three = "\n".join([box_line([0, 0, 100, 100], "car")] * 3)  # 0.2 - 0.1 - 0.2 = -0.1: above the floor
    assert score(make(three + "\n</think>\nA", question="q"))["format"] == pytest.approx(-0.1)
    assert SpatialCOREConfig(format_floor=-1.0).format_floor == -1.0


def test_validity_weighting_off_scores_every_reference_as_v_one():
    """Table 3's ablation: the same completion scores as if each pseudo-GT validity were 1 (eqs. 3, 8 and A.3)."""
    text = box_line([0, 0, 100, 100], "black sedan ahead") + "\nReasoning.\n</think>\nB"
    off = SpatialCOREConfig(validity_weighting=False)
    low = score(make(text, gt=[([0, 0, 100, 50], "black sedan", 0.4)]), off)
    one = score(make(text, gt=[([0, 0, 100, 50], "black sedan", 1.0)]), CFG)
    on = score(make(text, gt=[([0, 0, 100, 50], "black sedan", 0.4)]), CFG)
    for k in ("precision", "recall", "r_spatial", "reward"):
        assert low[k] == pytest.approx(one[k], abs=1e-12), k
    assert on["precision"] == pytest.approx(0.4 * one["precision"], abs=1e-12)
    missing = make("Nothing.\n</think>\nB", gt=[([0, 0, 9, 9], "car", 0.5)])
    assert score(missing, off)["r_spatial"] == pytest.approx(-0.3) and score(missing)["r_spatial"] == -0.15
    assert apply_overrides(CFG, ["validity_weighting=false"]).validity_weighting is False


def test_box_details_name_each_valid_box_h_match_and_iou():
    from spatial_jax.rewards.spatialcore import box_details

    boxes = [box_line([0, 0, 100, 100], "car"), box_line([500, 500, 600, 600], "tree"),
             '{"bbox_2d": [50, 50, 10, 10], "label": "car"}']  # the last is invalid: no record
    ro = make("\n".join(boxes) + "\n</think>\nB", gt=[([0, 0, 100, 50], "car", 1.0)], digit_h=LN10 / 2)
    (got,) = box_details([ro])
    assert [b["matched"] for b in got] == [True, False]
    assert got[0]["iou"] == pytest.approx(0.5) and got[1]["iou"] is None
    assert [b["H"] for b in got] == pytest.approx([0.5, 0.5])
    assert score(ro)["mean_matched_iou"] == pytest.approx(got[0]["iou"])
    (open_,) = box_details([make(boxes[0] + "\nno close", gt=[([0, 0, 100, 50], "car", 1.0)])])
    assert open_ == [{"H": 0.0, "matched": False, "iou": None}]  # an unclosed completion matches nothing
