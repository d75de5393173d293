"""Shared reward pieces: label text, box geometry, matching, digit-token mapping and eq. 5 box uncertainty."""

import math

import jax
import numpy as np
import pytest

from spatial_jax.kernels.position.uncertainty import LN10, box_uncertainty_from_digits
from spatial_jax.rewards.geometry import ciou, iou, pairwise_ciou, pairwise_iou, valid_box
from spatial_jax.rewards.matching import max_weight_matching, min_cost_matching
from spatial_jax.rewards.text import label_similarity, normalise_label, words
from spatial_jax.rewards.uncertainty import (
    box_digit_positions,
    digit_token_positions,
    pack_box_digits,
    pack_rollout_boxes,
)


def test_label_text():
    assert normalise_label("  Black\t Sedan \n") == "black sedan"
    assert words("Black-sedan #2, black") == {"black", "sedan", "2"}
    assert label_similarity("black sedan ahead", "black sedan") == pytest.approx(2 / math.sqrt(6), abs=1e-15)
    assert label_similarity("Traffic  light", "traffic light") == pytest.approx(1.0)
    assert label_similarity("dog", "cat") == 0.0
    assert label_similarity("", "dog") == 0.0 and label_similarity("!!", "dog") == 0.0


def test_iou_hand_cases():
    assert iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert iou([0, 0, 10, 10], [10, 0, 20, 10]) == 0.0  # touching edges
    assert iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    assert iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert iou([0, 0, 2, 2], [1, 1, 3, 3]) == pytest.approx(1 / 7)
    assert iou([5, 5, 5, 5], [5, 5, 5, 5]) == 0.0  # zero area, empty union
    assert iou([10, 10, 0, 0], [0, 0, 10, 10]) == 0.0  # inverted box has zero extent
    m = pairwise_iou([[0, 0, 10, 10], [5, 0, 15, 10], [0, 0, 1, 1]], [[0, 0, 10, 10], [5, 0, 15, 10]])
    assert m.shape == (3, 2) and m.dtype == np.float64
    np.testing.assert_allclose(m, [[1, 1 / 3], [1 / 3, 1], [0.01, 0]], atol=1e-15)
    assert pairwise_iou(np.zeros((0, 4)), [[0, 0, 1, 1]]).shape == (0, 1)
    with pytest.raises(ValueError):
        pairwise_iou([[0, 0, 1]], [[0, 0, 1, 1]])


def test_huge_coordinates_are_scaled_not_overflowed():
    # areas of boxes this large overflow float64; IoU and CIoU are (up to eps) scale-free, so a power-of-two scale
    # must not change them
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0, 100, size=(5, 4)), rng.uniform(0, 100, size=(7, 4))
    for k in (2.0**600, 2.0**1000):
        assert iou(np.array([1, 2, 30, 40]) * k, np.array([1, 2, 30, 40]) * k) == 1.0
        np.testing.assert_array_equal(pairwise_iou(a * k, b * k), pairwise_iou(a, b))
        np.testing.assert_allclose(pairwise_ciou(a * k, b * k), pairwise_ciou(a, b), atol=1e-5)  # eps, scaled
    assert iou([0, 0, 1e200, 1e200], [0, 0, 1e200, 1e200]) == 1.0
    assert iou([-1.7e308, -1.7e308, 1.7e308, 1.7e308], [0, 0, 1.7e308, 1.7e308]) == pytest.approx(0.25)
    assert ciou([-1.7e308, 0, 1.7e308, 1e308], [-1.7e308, 0, 1.7e308, 1e308]) == pytest.approx(1.0, abs=1e-6)
    # a huge pair beside ordinary ones: only the huge pair is rescaled
    m = pairwise_iou([[0, 0, 10, 10], [0, 0, 1e300, 1e300]], [[5, 0, 15, 10], [0, 0, 1e300, 5e299]])
    assert m[0, 0] == pytest.approx(1 / 3) and m[1, 1] == pytest.approx(0.5) and np.all(np.isfinite(m))


def test_ciou_hand_cases():
    # Same size, shifted by 1 in x: IoU 1/3, rho^2 = 1, c^2 = 3^2 + 2^2, aspect term 0.
    assert ciou([0, 0, 2, 2], [1, 0, 3, 2]) == pytest.approx(1 / 3 - 1 / 13, abs=1e-6)
    assert ciou([0, 0, 4, 4], [0, 0, 4, 4]) == pytest.approx(1.0, abs=1e-6)
    # Concentric, 2x1 vs 1x2: IoU 1/3, rho 0, v = 4/pi^2 (atan 2 - atan 0.5)^2.
    v = 4 / math.pi**2 * (math.atan(0.5) - math.atan(2.0)) ** 2
    expected = 1 / 3 - v / ((1 - 1 / 3) + v) * v
    assert ciou([0, 1, 2, 2], [0.5, 0.5, 1.5, 2.5]) == pytest.approx(expected, abs=1e-6)
    for a, b in [([3, 3, 3, 3], [3, 3, 3, 3]), ([0, 0, 0, 0], [5, 5, 9, 9]), ([9, 9, 1, 1], [0, 0, 0, 0])]:
        value = ciou(a, b)
        assert math.isfinite(value) and -1.5 <= value <= 1.0
    rng = np.random.default_rng(0)
    boxes = rng.uniform(0, 100, size=(200, 4))
    m = pairwise_ciou(boxes[:100], boxes[100:])
    assert np.all(np.isfinite(m)) and m.min() >= -1.5 and m.max() <= 1.0


def test_valid_box():
    assert valid_box([0, 0, 1000, 1000], "car")
    assert not valid_box([0, 0, 1000, 1001], "car")
    assert not valid_box([5, 0, 5, 10], "car")  # x2 == x1
    assert not valid_box([0, 10, 5, 3], "car")
    assert not valid_box([0, 0, 5, 5], "   ")
    assert not valid_box([0.0, 0, 5, 5], "car")
    assert not valid_box([True, 0, 5, 5], "car")
    assert not valid_box([0, 0, 5], "car")
    assert valid_box([0, 0, 5, 5], "", need_label=False)


def test_matching():
    score = np.array([[0.9, 0.8], [0.85, 0.1]])
    assert sorted(max_weight_matching(score)) == [(0, 1), (1, 0)]
    assert sorted(min_cost_matching(-score)) == [(0, 1), (1, 0)]
    wide = np.zeros((2, 5))
    pairs = max_weight_matching(wide)
    assert len(pairs) == 2 and len({k for _, k in pairs}) == 2  # zero-score pairs are still matched
    assert len(max_weight_matching(np.zeros((4, 1)))) == 1
    assert max_weight_matching(np.zeros((0, 3))) == []
    with pytest.raises(ValueError):
        max_weight_matching(np.array([[np.nan]]))


def test_digit_token_positions():
    text = '{"bbox_2d": [734, 5, 60, 1000], "label": "x"}'
    # Qwen-like: every digit its own token, plus one multi-character token carrying a comma.
    offsets = []
    i = 0
    while i < len(text):
        if text[i].isdigit():
            offsets.append((i, i + 1))
            i += 1
        elif text.startswith(", ", i):
            offsets.append((i, i + 2))
            i += 2
        else:
            offsets.append((i, i + 1))
            i += 1
    start = text.index("734")
    pos = digit_token_positions(text, offsets, (start, start + 3))
    assert [text[slice(*offsets[t])] for t in pos] == ["7", "3", "4"]
    # A token mixing digits and punctuation is excluded; a multi-digit token is kept.
    offsets2 = [(0, start), (start, start + 2), (start + 2, start + 4)]  # "73" and "4,"
    assert digit_token_positions(text, offsets2, (start, start + 3)) == [1]
    spans = [(start, start + 3), (start + 5, start + 6), (start + 8, start + 10), (start + 12, start + 16)]
    per = box_digit_positions(text, offsets, spans)
    assert [len(p) for p in per] == [3, 1, 2, 4]


def test_box_uncertainty_eq5():
    f = jax.jit(box_uncertainty_from_digits)
    ent = np.zeros((4, 4, 3))
    mask = np.zeros((4, 4, 3), bool)
    mask[0, :, :2] = True  # all-zero entropies -> H = 0
    ent[1] = LN10
    mask[1] = True  # all ln 10 -> H = 1
    # Box 2: unequal digit counts: coordinate means 1, 2, 0, 3 -> mean 1.5 -> H = 1.5 / ln 10.
    ent[2, 0, :1], mask[2, 0, :1] = [1.0], True
    ent[2, 1, :3], mask[2, 1, :3] = [1.0, 2.0, 3.0], True
    ent[2, 2, :2], mask[2, 2, :2] = [0.0, 0.0], True
    ent[2, 3, :2], mask[2, 3, :2] = [3.0, np.nan], True  # NaN counts as masked
    mask[3, :3, 0] = True  # 4th coordinate has no digit -> no uncertainty
    h, has = f(ent, mask)
    np.testing.assert_allclose(np.asarray(h), [0.0, 1.0, 1.5 / LN10, 0.0], atol=1e-6)
    assert np.asarray(has).tolist() == [True, True, True, False]
    h2, has2 = f(np.full((2, 4, 2), 50.0), np.ones((2, 4, 2), bool))  # clipped to 1
    np.testing.assert_allclose(np.asarray(h2), 1.0)
    h3, has3 = f(np.full((4, 2), np.inf), np.ones((4, 2), bool))  # unbatched; all non-finite -> no uncertainty
    assert float(h3) == 0.0 and not bool(has3)


def test_pack_box_digits():
    values, mask = pack_box_digits([[[0], [1, 2], [], [9]]], [0.5, 1.0, 2.0], rows=3, k=4)
    assert values.shape == (3, 4, 4) and mask.shape == (3, 4, 4)
    assert mask[0].sum() == 3 and not mask[1:].any()  # position 9 is outside the sequence
    np.testing.assert_allclose(values[0, 1, :2], [1.0, 2.0])
    with pytest.raises(ValueError):
        pack_box_digits([[[0, 1, 2]] * 4], [0.0] * 3, k=2)


def test_pack_rollout_boxes():
    text = '{"bbox_2d": [12, 3, 40, 5], "label": "a"}'
    offsets = [(i, i + 1) for i in range(len(text))]
    ent = [float(i) for i in range(len(text))]
    spans = [[(13, 15), (17, 18), (20, 22), (24, 25)]]  # "12", "3", "40", "5"
    assert [text[a:b] for a, b in spans[0]] == ["12", "3", "40", "5"]
    values, mask = pack_rollout_boxes(text, offsets, ent, spans, k=4, rows=2)
    assert mask.sum(axis=-1).tolist() == [[2, 1, 2, 1], [0, 0, 0, 0]]
    assert values[0, 0, :2].tolist() == [13.0, 14.0]
    empty_v, empty_m = pack_rollout_boxes(text, [], [], spans)
    assert not empty_m.any() and empty_v.shape == (1, 4, 1)
