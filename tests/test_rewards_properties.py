"""Hypothesis: arbitrary strings and numbers into the parsers and the SpatialCORE/ProSR rewards.

No exception, no NaN, and every reward component inside its documented bounds.
"""

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spatial_jax.records import BlankRollout, GTBox, Rollout, TokenTrace
from spatial_jax.rewards import prosr, spatialcore
from spatial_jax.rewards.advantages import advantages_by_group
from spatial_jax.rewards.parse_think import parse_think, resolve_gold
from spatial_jax.testing import rollouts as synthetic

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

numbers = st.one_of(st.integers(-50, 1200), st.sampled_from(["", "-3", "1.5", "1e3", "0007", "x"]))
box_line = st.builds(
    lambda cs, label: '{"bbox_2d": [' + ", ".join(str(c) for c in cs) + '], "label": "' + label + '"}',
    st.lists(numbers, min_size=0, max_size=5),
    st.text(alphabet="abc rd\\\"", max_size=12),
)
fragment = st.one_of(box_line, st.text(max_size=20), st.sampled_from(["</think>", "\n", "B", " A ", "(C)", "<think>"]))
completions = st.lists(fragment, max_size=8).map("".join)


@SETTINGS
@given(st.one_of(st.text(), completions))
def test_parse_think_never_raises(text):
    p = parse_think(text)
    assert 0 <= p.reasoning_span[1] <= len(text)
    assert p.think_close_count == text.count("</think>")
    assert p.answer is None or (len(p.answer) == 1 and "A" <= p.answer <= "Z")
    for b in p.boxes:
        for s, e in b.coord_spans:
            assert text[s:e].isdigit() and e <= p.reasoning_span[1]
        if b.valid:
            assert len(b.bbox) == 4 and 0 <= b.bbox[0] < b.bbox[2] <= 1000 and 0 <= b.bbox[1] < b.bbox[3] <= 1000


@SETTINGS
@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text()),
       st.lists(st.text(max_size=10), max_size=5))
def test_resolve_gold_never_raises(answer, options):
    out = resolve_gold(answer, options)
    assert out is None or (len(out) == 1 and "A" <= out <= "Z")


def _trace(text, data):
    offsets = synthetic.tokenize(text)
    ent = data.draw(st.lists(st.one_of(st.floats(0, 30), st.just(float("nan")), st.just(float("inf"))),
                             min_size=len(offsets), max_size=len(offsets)))
    return TokenTrace(entropies=tuple(ent), offsets=tuple(offsets))


gt_boxes = st.lists(
    st.builds(lambda b, label, v: GTBox(bbox=tuple(b), label=label, validity=v),
              st.lists(st.floats(-10, 1100), min_size=4, max_size=4),
              st.text(alphabet="abc rd", max_size=8), st.floats(0, 1)),
    max_size=3,
)


@SETTINGS
@given(completions, gt_boxes, st.one_of(st.text(max_size=5), st.integers(-2, 5)), st.data())
def test_spatialcore_bounds(text, gt, answer, data):
    ro = Rollout(id="h", completion=text, question="where is the car", options=("A. car", "B. rd"),
                 answer=answer, gt_boxes=tuple(gt), trace=_trace(text, data))
    for cfg in (spatialcore.SpatialCOREConfig(), spatialcore.SpatialCOREConfig(beta=0.5, gamma=0.0)):
        s = spatialcore.score(ro, cfg)
        assert all(math.isfinite(v) for v in s.values())
        assert s["r_ans"] in (0.0, 1.0)
        assert -1.0 <= s["r_spatial"] <= 1.0 and -1.0 <= s["spatial_term"] <= 1.0
        assert 0.0 <= s["precision"] <= 1.0 and 0.0 <= s["recall"] <= 1.0 and 0.0 <= s["f_alpha"] <= 1.0 + 1e-12
        assert 0.0 <= s["mean_H"] <= 1.0 and 0.0 <= s["mean_matched_iou"] <= 1.0
        assert s["format"] <= 0.25 + 1e-12
        assert s["reward"] <= 2.25 + 1e-12
        if s["think_closed"] == 0.0:
            assert s["reward"] == 0.0


@SETTINGS
@given(completions, st.one_of(st.none(), completions), st.data())
def test_prosr_bounds(text, blank_text, data):
    blank = None if blank_text is None else BlankRollout(blank_text, _trace(blank_text, data))
    ro = Rollout(id="h", completion=text, options=("A", "B"), answer="B", trace=_trace(text, data), blank=blank)
    s = prosr.score(ro, prosr.ProSRConfig(min_span_tokens=1))
    assert all(math.isfinite(v) for v in s.values())
    assert -0.2 - 1e-12 <= s["reward"] <= 1.2 + 1e-12
    assert -1.0 <= s["r_cf"] <= 0.0 and -1.0 <= s["r_drift"] <= 0.0 and s["r_fmt"] in (0.0, 1.0)
    assert -1e-9 <= s["s_cf"] <= 1.0 + 1e-9


@SETTINGS
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.one_of(st.none(), st.sampled_from("abc"))), max_size=20))
def test_advantages_finite(items):
    adv = advantages_by_group([r for r, _ in items], [g for _, g in items])
    for (_, g), a in zip(items, adv):
        assert (a is None) == (g is None)
        assert a is None or math.isfinite(a)
    for g in "abc":
        vals = [a for (_, gg), a in zip(items, adv) if gg == g]
        if vals:
            assert abs(float(np.sum(vals))) <= 1e-6 * max(1.0, len(vals))
