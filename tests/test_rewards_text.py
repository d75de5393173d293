"""SPEC section 10's short text answers at their edges (spatial_jax/rewards/text.py): answers as models write them
(a closing full stop, a leading point, a word where the gold is a number), numbers by AlloSpatial's MRA where the
method scores numbers so, and values that are no finite number."""

from __future__ import annotations

import pytest

from spatial_jax.rewards.allospatial import AlloSpatialConfig, mra
from spatial_jax.rewards.text import short_answer_score


def _mra(p, g):
    return mra(p, g, AlloSpatialConfig().mra_thresholds)


@pytest.mark.parametrize("predicted, gold, expected", [
    ("5 .", "5", 1.0),  # a closing full stop after a space: still the number 5
    (".5", "0.5", 1.0),  # a leading point is part of the number
    ("0.5.", ".5", 1.0),
    ("5", "50", 0.0),
    ("nan", "nan", 1.0),  # no finite number: compared as text
    ("nan", "NaN.", 1.0),
    ("inf", "1e400", 0.0),  # 1e400 overflows to inf: neither is a finite number, and the texts differ
    ("five", "5", 0.0),
    ("5", "five", 0.0),
    ("The Five.", "five", 1.0),
])
def test_numbers_and_words_as_models_write_them(predicted, gold, expected):
    assert short_answer_score(predicted, gold) == expected


def test_numbers_score_by_the_methods_own_rule():
    # MRA of 9 against 10: relative error 0.1 passes the thresholds up to 0.90 (9 of 10)
    assert short_answer_score("9", "10", _mra) == pytest.approx(0.9)
    assert short_answer_score("10.", "10", _mra) == 1.0
    assert short_answer_score("11", "10", _mra) == pytest.approx(0.9)
    seen = []
    short_answer_score("9", "10", lambda p, g: seen.append((p, g)) or 0.0)
    assert seen == [(9.0, 10.0)]  # prediction first, then the gold
    # a word on either side is no number: compared as text, the number rule never asked
    assert short_answer_score("ten", "10", _mra) == 0.0 and short_answer_score("10", "ten", _mra) == 0.0
    # a gold of 0 has no relative error: exact
    assert short_answer_score("0", "0", _mra) == 1.0 and short_answer_score("0.01", "0", _mra) == 0.0


def test_no_answer_or_no_gold_text_scores_zero():
    assert short_answer_score(None, "left") == 0.0
    assert short_answer_score("the", "the") == 0.0  # a gold that normalises to nothing
    assert short_answer_score("left", 3.0) == 0.0
