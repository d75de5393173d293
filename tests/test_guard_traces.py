"""Token traces that cannot be right, in Rollouts built directly (records.py refuses them in JSON): the scorers read
them one way, documented in spatial_jax/rewards/uncertainty.py and spatial_jax/reference/trace_torch.py. A token
counts only when 0 <= start < end <= len(completion) and its entropy is a number in [-ENTROPY_ROUNDING,
ENTROPY_LIMIT] (a negative one is float32 rounding and reads 0, as records.py reads it); any other token is left
out. Rewards stay in their bounds (SpatialCORE [-1.2, 2.25], ProSR [-0.2, 1.2]) and the JAX scorers agree with
their torch references.

Before: a negative digit entropy pulled a box's H below the truth (clipped to 0: omega = 1, the largest weight),
negative entropies entered ProSR's trajectory and segment means, and huge ones overflowed them to inf.
"""

import math

import numpy as np
import pytest

from spatial_jax.records import ENTROPY_LIMIT, ENTROPY_ROUNDING, BlankRollout, GTBox, Rollout, TokenTrace
from spatial_jax.reference import prosr_torch, spatialcore_torch
from spatial_jax.rewards import prosr, spatialcore
from spatial_jax.testing import rollouts as synthetic

TOL = 1e-9
BOUNDS = {"spatialcore": (-1.2, 2.25), "prosr": (-0.2, 1.2)}


def _trace(text, rng, kind):
    """A trace of `text` broken the way `kind` says."""
    offsets = synthetic.tokenize(text)
    ent = synthetic.token_entropies(text, offsets, rng)
    n, size = len(offsets), len(text)
    if kind == "past_end":
        offsets = [(s, e + size) if i % 3 == 0 else (s, e) for i, (s, e) in enumerate(offsets)]
    elif kind == "outside":
        offsets = [(s + 2 * size, e + 2 * size) if i % 2 else (-e, -s) for i, (s, e) in enumerate(offsets)]
    elif kind == "whole":
        offsets = [(0, size)] * n
    elif kind == "inverted":
        offsets = [(e, s) if i % 2 else (s, s) for i, (s, e) in enumerate(offsets)]
    elif kind == "negative":
        ent = [(-h, -1e-5)[i % 4 == 1] if i % 2 else h for i, h in enumerate(ent)]
    elif kind == "all_negative":
        ent = [-1.0 - h for h in ent]
    elif kind == "infinite":
        ent = [(math.inf, -math.inf, math.nan)[i % 3] if i % 2 else h for i, h in enumerate(ent)]
    elif kind == "huge":
        ent = [1e300 if i % 2 else h for i, h in enumerate(ent)]
    elif kind == "short":
        ent = ent[: n // 2]
    return TokenTrace(entropies=tuple(ent), offsets=tuple(offsets))


KINDS = ("past_end", "outside", "whole", "inverted", "negative", "all_negative", "infinite", "huge", "short")


def _broken(kind, n=200, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for ro in synthetic.rollouts(n, seed=seed, with_blank=True):
        blank = BlankRollout(ro.blank.completion, _trace(ro.blank.completion, rng, kind))
        out.append(Rollout(id=ro.id, completion=ro.completion, question=ro.question, options=ro.options,
                           answer=ro.answer, gt_boxes=ro.gt_boxes, trace=_trace(ro.completion, rng, kind),
                           blank=blank, group=ro.group))
    return out


def _agree_within_bounds(main, ref, bounds):
    for a, b in zip(main, ref, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert math.isfinite(a[k]), k
            assert a[k] == pytest.approx(b[k], abs=TOL), k
        assert bounds[0] - 1e-12 <= a["reward"] <= bounds[1] + 1e-12


@pytest.mark.parametrize("kind", KINDS)
def test_broken_traces_agree_and_stay_in_bounds(kind):
    ros = _broken(kind)
    cfg = spatialcore.SpatialCOREConfig()
    _agree_within_bounds(spatialcore.score_batch(ros, cfg), spatialcore_torch.score_batch(ros, cfg),
                         BOUNDS["spatialcore"])
    pcfg = prosr.ProSRConfig()
    _agree_within_bounds(prosr.score_batch(ros, pcfg), prosr_torch.score_batch(ros, pcfg), BOUNDS["prosr"])


def _box_rollout(digit_entropies):
    """One valid box whose 4 coordinates are one digit each; coordinate i's digit has entropy digit_entropies[i]."""
    text = '{"bbox_2d": [1, 2, 3, 4], "label": "car"}\n</think>\nA'
    offsets = synthetic.tokenize(text)
    coords = {text.index(c, text.index("[")): h for c, h in zip("1234", digit_entropies)}
    ent = [coords.get(s, 1.0) for s, _ in offsets]
    return Rollout(id="b", completion=text, options=("A. x", "B. y"), answer="A",
                   gt_boxes=(GTBox((1.0, 2.0, 3.0, 4.0), "car", 1.0),),
                   trace=TokenTrace(tuple(ent), tuple(offsets)))


@pytest.mark.parametrize("score_batch", [spatialcore.score_batch, spatialcore_torch.score_batch])
def test_negative_or_absurd_digit_entropy_is_no_information(score_batch):
    cfg = spatialcore.SpatialCOREConfig()
    # All four digits unreadable: the box has no uncertainty (omega = 1), never H = 0 by clipping.
    for bad in (-2.0, math.inf, 2 * ENTROPY_LIMIT):
        s = score_batch([_box_rollout([bad] * 4)], cfg)[0]
        assert s["n_with_H"] == 0.0 and s["mean_H"] == 0.0
    # A box with one unreadable digit lacks that coordinate: no uncertainty either.
    assert score_batch([_box_rollout([1.0, 1.0, -5.0, 1.0])], cfg)[0]["n_with_H"] == 0.0
    s = score_batch([_box_rollout([1.0, 1.0, 2.0, 1.0])], cfg)[0]
    assert s["n_with_H"] == 1.0 and s["mean_H"] == pytest.approx(1.25 / math.log(10.0), abs=1e-12)
    # float32 rounding of a near-certain token (as records.py reads it): 0, still information.
    s = score_batch([_box_rollout([-ENTROPY_ROUNDING, -1e-7, 0.0, 4 * math.log(10.0)])], cfg)[0]
    assert s["n_with_H"] == 1.0 and s["mean_H"] == pytest.approx(1.0, abs=1e-12)


def test_prosr_trajectory_keeps_only_readable_tokens():
    span = [1.0] * 14 + [2.0] * 6
    text = "a" * 20 + "</think>\nB"
    good = [(i, i + 1) for i in range(20)] + [(20, 28), (28, 30)]
    ent = span + [9.0, 9.0]
    bad_ent = span + [-3.0] * 5 + [9.0, 9.0]  # five extra tokens with negative entropy inside the span
    bad_off = good[:20] + [(i, i + 1) for i in range(5)] + good[20:]
    clean = Rollout(id="c", completion=text, options=("A", "B"), answer="B", trace=TokenTrace(tuple(ent), tuple(good)))
    dirty = Rollout(id="d", completion=text, options=("A", "B"), answer="B",
                    trace=TokenTrace(tuple(bad_ent), tuple(bad_off)))
    huge = Rollout(id="h", completion=text, options=("A", "B"), answer="B",
                   trace=TokenTrace(tuple(span + [1e300] * 5 + [9.0, 9.0]), tuple(bad_off)))
    cfg = prosr.ProSRConfig()
    for score_batch in (prosr.score_batch, prosr_torch.score_batch):
        want, got, big = score_batch([clean, dirty, huge], cfg)
        assert got["span_len"] == big["span_len"] == 20.0
        assert got == pytest.approx(want, abs=1e-12) and big == pytest.approx(want, abs=1e-12)
        assert want["r_drift"] == pytest.approx(-0.9)
