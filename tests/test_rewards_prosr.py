"""ProSR reward (SPEC 3, eqs. 8-11) and its four diagnostics (eqs. 3-7): hand-computed cases."""

import jax
import numpy as np
import pytest

from spatial_jax.eval import prosr_diagnostics as diag
from spatial_jax.records import BlankRollout, Rollout, TokenTrace
from spatial_jax.rewards._host import host_float64
from spatial_jax.rewards.prosr import (
    ProSRConfig,
    counterfactual_penalty,
    drift_penalty,
    l1_normalise,
    resample,
    score,
    score_batch,
    segment_bounds,
    segment_means,
    trajectory_similarity,
)


def traced(span_entropies, tail="</think>\nB"):
    """A completion of len(span) one-character reasoning tokens, then the tail as three tokens."""
    n = len(span_entropies)
    text = "a" * n + tail
    offsets = [(i, i + 1) for i in range(n)]
    ent = list(span_entropies)
    if tail:
        close = text.find("</think>")
        offsets += [(close, close + 8), (close + 8, len(text))]
        ent += [9.0, 9.0]  # outside the span: must not count
    return text, TokenTrace(entropies=tuple(ent), offsets=tuple(offsets))


def make(span, blank_span=None, blank_tail="</think>\nB", tail="</think>\nB", answer="B"):
    text, trace = traced(span, tail)
    blank = None
    if blank_span is not None:
        btext, btrace = traced(blank_span, blank_tail)
        blank = BlankRollout(completion=btext, trace=btrace)
    return Rollout(id="p", completion=text, options=("A. x", "B. y"), answer=answer, trace=trace, blank=blank)


def test_resample_matches_numpy_interp():
    rng = np.random.default_rng(0)
    jitted = jax.jit(resample, static_argnums=2)
    with host_float64():
        for length in [1, 2, 3, 7, 64, 65, 200]:
            e = rng.uniform(0, 5, size=length)
            padded = np.zeros((1, 256))
            padded[0, :length] = e
            for t in [1, 2, 64, 100]:
                got = np.asarray(jitted(padded, np.array([length]), t))[0]
                want = np.interp(np.linspace(0, length - 1, t), np.arange(length), e)
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        assert np.all(np.asarray(resample(np.ones((1, 4)), np.array([0]), 8)) == 0.0)


def test_similarity_and_penalties():
    with host_float64():
        z = l1_normalise(np.array([[1.0, 3.0, 0.0]]), 1e-8)
        np.testing.assert_allclose(np.asarray(z), [[0.25, 0.75, 0.0]], atol=1e-8)
        assert float(trajectory_similarity(np.array([0.5, 0.5, 0]), np.array([0, 0, 1.0]))) == 0.0
        assert float(trajectory_similarity(np.array([0.5, 0.5]), np.array([0.5, 0.5]))) == 1.0
        pen = counterfactual_penalty(np.array([0.4, 0.7, 1.0, 0.2, 1.0]), np.array([1, 1, 1, 1, 0], bool), 0.4)
        np.testing.assert_allclose(np.asarray(pen), [0.0, -0.5, -1.0, 0.0, 0.0], atol=1e-12)
        np.testing.assert_allclose(np.asarray(drift_penalty(np.array([2.0, 1.0, 5.0]), np.array([1.0, 1.0, 1.0]),
                                                            0.1)), [-0.9, 0.0, -1.0], atol=1e-12)


def test_segments_follow_python_round():
    assert segment_bounds(10) == (3, 7, 10)
    assert segment_bounds(5) == (2, 4, 5)  # round(1.5) = 2, round(3.5) = 4
    assert segment_bounds(1) == (0, 1, 1)
    with host_float64():
        e = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 0.0]])
        means = np.asarray(segment_means(e, np.array([[2, 4, 5]])))
        np.testing.assert_allclose(means, [[1.5, 3.5, 5.0]])
        assert np.asarray(segment_means(e, np.array([[0, 1, 1]])))[0].tolist() == [0.0, 1.0, 0.0]


def test_hand_computed_reward():
    span = [1.0] * 14 + [2.0] * 6  # L = 20: middle [6, 14) mean 1, late [14, 20) mean 2 -> drift 0.9
    s = score(make(span, blank_span=span))
    assert s["span_len"] == 20 and s["delta_tail"] == pytest.approx(0.9)
    assert s["r_drift"] == pytest.approx(-0.9) and s["r_cf"] == pytest.approx(-1.0) and s["s_cf"] == pytest.approx(1.0)
    assert s["reward"] == pytest.approx(1.0 + 0.2 - 0.1 - 0.09)
    other = score(make(span, blank_span=span, blank_tail="</think>\nA"))
    assert other["r_cf"] == 0.0 and other["reward"] == pytest.approx(1.2 - 0.09)
    scaled = score(make(span, blank_span=[3 * x for x in span]))  # the shape, not the scale, is compared
    assert scaled["r_cf"] == pytest.approx(-1.0, abs=1e-6)


def test_counterfactual_similarity_value():
    e = [1.0] * 10 + [0.0] * 10
    eb = [0.0] * 10 + [1.0] * 10
    z = diag.normalised_trajectory(np.array(e))
    zb = diag.normalised_trajectory(np.array(eb))
    s_cf = 1 - 0.5 * np.abs(z - zb).sum()
    s = score(make(e, blank_span=eb))
    assert s["s_cf"] == pytest.approx(s_cf, abs=1e-12)
    assert s["r_cf"] == pytest.approx(-np.clip((s_cf - 0.4) / 0.6, 0, 1), abs=1e-12)


def test_validity_safeguards():
    short = score(make([1.0] * 9 + [5.0], blank_span=[1.0] * 9))
    assert short["drift_active"] == 1.0 and short["cf_active"] == 0.0 and short["r_cf"] == 0.0
    tiny = score(make([1.0] * 5 + [5.0] * 4, blank_span=[1.0] * 20))
    assert tiny["drift_active"] == 0.0 and tiny["r_drift"] == 0.0 and tiny["cf_active"] == 0.0
    no_blank = score(make([1.0] * 20))
    assert no_blank["has_blank"] == 0.0 and no_blank["r_cf"] == 0.0
    truncated = score(make([1.0] * 30, blank_span=[1.0] * 30, tail=""))
    assert truncated["reward"] == 0.0 and truncated["r_drift"] == 0.0 and truncated["r_cf"] == 0.0
    twice = score(make([1.0] * 20, tail="</think>\n</think>\nB"))
    assert twice["r_fmt"] == 0.0 and twice["r_acc"] == 1.0
    # Non-finite entropies are left out of the trajectory.
    text, trace = traced([1.0] * 10 + [float("nan")] * 3)
    s = score(Rollout(id="n", completion=text, answer="B", options=("A", "B"), trace=trace))
    assert s["span_len"] == 10


def test_batch_equals_single_and_overrides():
    from spatial_jax.testing import rollouts as synthetic

    ros = synthetic.rollouts(12, seed=5, with_blank=True)
    cfg = ProSRConfig(resample_len=16, margin=0.05)
    batch = score_batch(ros, cfg)
    for ro, b in zip(ros, batch):
        assert score(ro, cfg) == pytest.approx(b, abs=1e-12)
    with pytest.raises(ValueError):
        ProSRConfig(tau_cf=1.0)


def test_diagnostics_hand_cases():
    assert diag.blank_accuracy(["A", "B", None], ["A", "A", "A"]) == pytest.approx(1 / 3)
    assert diag.same_answer_rate(["A", "B", None, "C"], ["A", "C", None, "C"]) == pytest.approx(0.5)
    assert diag.blank_accuracy([], []) is None
    e = np.array([1.0, 1, 1, 1, 1, 1, 1, 2, 2, 2])  # L = 10: mid [3, 7) = 1, late [7, 10) = 2
    assert diag.delta_tail(e, 0.1) == pytest.approx(0.9)
    assert diag.delta_tail(e[::-1], 0.1) == 0.0
    assert diag.late_rise_rate([0.9, 0.0, 0.05, 0.11], 0.1) == pytest.approx(0.5)
    assert diag.pair_similarity(e, 2 * e) == pytest.approx(1.0, abs=1e-8)
    assert diag.pair_similarity(e, np.array([])) is None
    # eq. 5 averages over all N pairs: one without two trajectories enters as 0
    assert diag.normalised_trajectory_similarity([1.0, None, 0.5]) == pytest.approx(0.5)
    groups = diag.failure_groups([True, True, False, True], [0.9, 0.9, 0.9, 0.3], [0.0, 0.5, 0.0, 0.2])
    assert groups == ["spurious_only", "both", "clean", "tail_only"]
    span = [1.0] * 14 + [2.0] * 6
    ros = [make(span, blank_span=span), make(span[::-1], blank_span=span, blank_tail="</think>\nA")]
    out = diag.diagnose(ros)
    assert out["n"] == 2 and out["accuracy"] == 1.0 and out["A_blank"] == 0.5 and out["SAR"] == 0.5
    assert out["LRR@0.1"] == 0.5 and out["groups"] == {"clean": 1, "spurious_only": 0, "tail_only": 0, "both": 1}
    nts = (1.0 + diag.pair_similarity(np.array(span[::-1]), np.array(span))) / 2
    assert out["NTS"] == pytest.approx(nts) and out["NTS_undefined"] == 0
    out = diag.diagnose([*ros, make(span, blank_span=span, blank_tail="")])  # a blank that never closes its span
    assert out["n"] == 3 and out["NTS"] == pytest.approx(2 * nts / 3) and out["NTS_undefined"] == 1


def test_prosr_asks_for_reasoning_then_one_letter_and_no_boxes():
    """ProSR App. A.6 (SPEC 8): its prompt asks for no boxes (so no box digits enter its entropy trajectories) and
    for one letter after </think>; its SFT target is the synthetic world's reference in that format."""
    from spatial_jax.data import synthetic as syn
    from spatial_jax.data.prompts import THINK_BOXES
    from spatial_jax.methods import get_method

    fmt = get_method("prosr").prompt
    assert fmt.thinking and "bbox_2d" not in fmt.system and "box" not in fmt.system.lower()
    assert "exactly one capital letter" in fmt.system and "</think>" in fmt.system
    assert get_method("spatialcore").prompt is THINK_BOXES and fmt is not THINK_BOXES
    sample = syn.make_sample(syn.SyntheticConfig(), "train", 3, render_image=False)
    target = sample.reference[fmt.reference_key]
    assert "bbox_2d" not in target and target.endswith(f"</think>\n{sample.answer}")
