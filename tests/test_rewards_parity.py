"""Main (JAX/numpy) vs independent torch float64 reference: 1,000 random cases per numeric function + edge cases.

Tolerance: 1e-6 absolute everywhere (both sides run in float64; observed differences are ~1e-15).
"""

import math

import numpy as np
import pytest
import torch

from spatial_jax.kernels.position.uncertainty import box_uncertainty_from_digits
from spatial_jax.reference import advantages_torch, geometry_torch, prosr_torch, spatialcore_torch
from spatial_jax.rewards import geometry
from spatial_jax.rewards._host import host_float64
from spatial_jax.rewards.advantages import advantages_by_group, group_advantages
from spatial_jax.rewards.prosr import (
    ProSRConfig,
    l1_normalise,
    resample,
    segment_bounds,
    segment_means,
    trajectory_similarity,
)
from spatial_jax.rewards.prosr import score_batch as prosr_main
from spatial_jax.rewards.spatialcore import SpatialCOREConfig, f_alpha, match, pair_rewards, precision, recall
from spatial_jax.rewards.spatialcore import score_batch as spatialcore_main
from spatial_jax.rewards.text import label_similarity
from spatial_jax.rewards.uncertainty import digit_token_positions, pack_box_digits
from spatial_jax.testing import rollouts as synthetic

TOL = 1e-6
N = 1000
CFG = SpatialCOREConfig()
WORDS = ["black", "sedan", "car", "red", "man", "tree", "ahead", "2", "light", ""]


def random_boxes(rng, n):
    b = rng.uniform(0, 100, size=(n, 4))
    ints = rng.random(n) < 0.5
    b[ints] = np.round(b[ints])
    degenerate = rng.random(n) < 0.1
    b[degenerate, 2] = b[degenerate, 0]  # zero width
    inverted = rng.random(n) < 0.05
    b[inverted, 3] = b[inverted, 1] - 5  # inverted height
    same = rng.random(n) < 0.05
    return b, same


def random_label(rng):
    return " ".join(rng.choice(WORDS, size=int(rng.integers(0, 4))))


def test_iou_and_ciou_parity():
    rng = np.random.default_rng(1)
    a, same = random_boxes(rng, N)
    b, _ = random_boxes(rng, N)
    b[same] = a[same]
    got_iou = np.array([geometry.iou(x, y) for x, y in zip(a, b)])
    ref_iou = np.array([geometry_torch.iou(x, y) for x, y in zip(a, b)])
    np.testing.assert_allclose(got_iou, ref_iou, atol=TOL, rtol=0)
    np.testing.assert_allclose(geometry.pairwise_iou(a[:40], b[:30]),
                               geometry_torch.pairwise_iou(a[:40], b[:30]).numpy(), atol=TOL, rtol=0)
    got = geometry.pairwise_ciou(a, b).diagonal()
    ref = geometry_torch.pairwise_ciou(torch.tensor(a), torch.tensor(b)).numpy().diagonal()
    np.testing.assert_allclose(got, ref, atol=TOL, rtol=0)
    assert np.all(np.isfinite(got))


def test_iou_and_ciou_parity_on_huge_coordinates():
    # Areas of such boxes overflow float64. Both sides measure a pair beyond 2**500 in units where its largest
    # magnitude is in [0.5, 1) (CIoU's eps then means the same; an extent near eps in those units is where a different
    # unit would show), found independently (frexp there, log2 here).
    rng = np.random.default_rng(11)
    a, same = random_boxes(rng, 200)
    b, _ = random_boxes(rng, 200)
    b[same] = a[same]
    scale = 10.0 ** rng.uniform(150, 306, size=(200, 1))
    a, b = a * scale, b * scale
    a[::7] /= scale[::7]  # some pairs of one huge and one ordinary box
    for got, ref in ((geometry.pairwise_iou(a, b), geometry_torch.pairwise_iou(a, b)),
                     (geometry.pairwise_ciou(a, b), geometry_torch.pairwise_ciou(a, b))):
        assert np.all(np.isfinite(got)) and torch.all(torch.isfinite(ref))
        np.testing.assert_allclose(got, ref.numpy(), atol=TOL, rtol=0)
    assert geometry_torch.iou([0, 0, 1e200, 1e200], [0, 0, 1e200, 1e200]) == 1.0


def test_label_similarity_and_pair_reward_parity():
    rng = np.random.default_rng(2)
    a = [random_label(rng) for _ in range(N)]
    b = [random_label(rng) for _ in range(N)]
    got = np.array([label_similarity(x, y) for x, y in zip(a, b)])
    ref = np.array([float(spatialcore_torch.label_similarity_matrix([x], [y])[0, 0]) for x, y in zip(a, b)])
    np.testing.assert_allclose(got, ref, atol=TOL, rtol=0)
    for _ in range(N // 10):  # 1,000 pair rewards in 100 random 10-entry matrices
        n, m = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        pb, _ = random_boxes(rng, n)
        gb, _ = random_boxes(rng, m)
        pl, gl = [random_label(rng) for _ in range(n)], [random_label(rng) for _ in range(m)]
        v = rng.uniform(0, 1, m)
        got = pair_rewards(pb, pl, gb, gl, v, CFG)
        ref = spatialcore_torch.pair_rewards(torch.tensor(pb), pl, torch.tensor(gb), gl, v, CFG).numpy()
        np.testing.assert_allclose(got, ref, atol=TOL, rtol=0)


def _random_box_tokens(rng):
    """A box line tokenised with random digit groupings and some punctuation-carrying tokens."""
    coords = [int(c) for c in rng.integers(0, 1001, size=4)]
    text = '{"bbox_2d": [' + ", ".join(str(c) for c in coords) + '], "label": "x"}'
    offsets, i = [], 0
    while i < len(text):
        step = int(rng.integers(1, 4))
        if text[i].isdigit() and rng.random() < 0.7:
            step = 1
        offsets.append((i, min(len(text), i + step)))
        i += step
    spans, at = [], text.index("[") + 1
    for c in coords:
        s = text.index(str(c), at)
        spans.append((s, s + len(str(c))))
        at = s + len(str(c))
    ent = rng.uniform(0, 3, size=len(offsets))
    ent[rng.random(len(offsets)) < 0.05] = np.nan
    return text, offsets, spans, ent


def test_box_uncertainty_parity():
    rng = np.random.default_rng(3)
    cases = [_random_box_tokens(rng) for _ in range(N)]
    positions = [[digit_token_positions(t, off, sp) for sp in spans] for t, off, spans, _ in cases]
    packed = [pack_box_digits([p], e, k=8) for p, (_, _, _, e) in zip(positions, cases)]
    ent = np.concatenate([p[0] for p in packed])
    mask = np.concatenate([p[1] for p in packed])
    with host_float64():
        h, has = (np.asarray(x) for x in box_uncertainty_from_digits(ent, mask))
    for i, (t, off, spans, e) in enumerate(cases):
        ref = spatialcore_torch.box_uncertainty(t, e.tolist(), off, spans)
        assert bool(has[i]) == (ref is not None)
        assert h[i] == pytest.approx(0.0 if ref is None else ref, abs=TOL)
    assert has.sum() > N // 2 and (~has).sum() > 0  # both kinds of box were exercised


def test_matching_precision_recall_f_parity():
    rng = np.random.default_rng(4)
    for i in range(N):
        n, m = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        r = rng.uniform(0, 1, size=(n, m))
        if i % 2:
            r = np.round(r * 4) / 4  # ties are common with quantised rewards
        omega = rng.uniform(0.1, 1, size=n)
        ious = rng.uniform(0, 1, size=(n, m))
        v = rng.uniform(0.01, 1, size=m)
        pairs = match(r, omega, ious, CFG)
        ref_pairs = spatialcore_torch.best_assignment(
            torch.tensor(r * (1 + CFG.tie_break * omega[:, None]) + CFG.tie_break**2 * ious))
        assert sorted(pairs) == sorted(ref_pairs)
        p = precision(r, omega, pairs)
        p_ref = float(np.mean([omega[j] * r[j, k] for j, k in ref_pairs]))
        assert len(pairs) == len(ref_pairs) == min(n, m)
        assert p == pytest.approx(p_ref, abs=TOL)
        rec = recall(r, v)
        assert rec == pytest.approx(float(torch.tensor(r).max(0).values.sum() / v.sum()), abs=TOL)
        assert f_alpha(p, rec, 2.0) == pytest.approx(spatialcore_torch.f_alpha(p_ref, rec, 2.0), abs=TOL)


def test_trajectory_parity():
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 300, size=(N, 2))
    lengths[:5] = [[1, 1], [1, 2], [2, 1], [10, 10], [299, 1]]
    e = np.zeros((N, 320))
    eb = np.zeros((N, 320))
    rows = []
    for i, (la, lb) in enumerate(lengths):
        a, b = rng.uniform(0, 4, la), rng.uniform(0, 4, lb)
        if i % 7 == 0:
            a[:] = 0.0  # all-zero trajectory: z = 0
        e[i, :la], eb[i, :lb] = a, b
        rows.append((a, b))
    bounds = np.array([segment_bounds(int(la)) for la, _ in lengths])
    with host_float64():
        z = l1_normalise(resample(e, lengths[:, 0], 64), 1e-8)
        zb = l1_normalise(resample(eb, lengths[:, 1], 64), 1e-8)
        s = np.asarray(trajectory_similarity(z, zb))
        means = np.asarray(segment_means(e, bounds))
    for i, (a, b) in enumerate(rows):
        ta, tb = torch.tensor(a), torch.tensor(b)
        assert s[i] == pytest.approx(prosr_torch.similarity(ta, tb, 64, 1e-8), abs=TOL)
        np.testing.assert_allclose(means[i], prosr_torch.segment_means(ta, 0.3, 0.7), atol=TOL, rtol=0)


@pytest.mark.parametrize("std", ["population", "sample", "none"])
def test_advantage_parity(std):
    """Random groups of 4 and edge cases (all-equal groups, groups of one, NaN and infinite rewards: SPEC 7's
    advantage 0) agree with the torch reference for each std kind, "none" being Dr. GRPO's."""
    rng = np.random.default_rng(6)
    r = rng.uniform(-1, 2, size=(N // 2, 4))
    r[::9] = 0.5  # zero spread
    r[1::9, 2] = np.nan
    r[2::9, 0] = np.inf
    r[3::9, 1] = -np.inf
    with host_float64():
        got = np.asarray(group_advantages(r, 1e-4, std))
        single = np.asarray(group_advantages(r[:, :1], 1e-4, std))
    ref = np.stack([advantages_torch.group_advantages(row, 1e-4, std).numpy() for row in r])
    np.testing.assert_allclose(got, ref, atol=TOL, rtol=0)
    assert np.all(got[::9] == 0) and np.all(got[1::9] == 0) and np.all(got[2::9] == 0) and np.all(got[3::9] == 0)
    assert np.all(single == 0) and all(advantages_torch.group_advantages(row[:1], 1e-4, std).item() == 0
                                       for row in r[:20])


def test_advantage_by_group_parity():
    rng = np.random.default_rng(6)
    rewards = rng.uniform(0, 1, size=200).tolist()
    groups = [None if i % 11 == 0 else str(int(rng.integers(0, 40))) for i in range(200)]
    got = advantages_by_group(rewards, groups)
    ref = advantages_torch.advantages_by_group(rewards, groups)
    assert [g is None for g in got] == [g is None for g in ref]
    np.testing.assert_allclose([g for g in got if g is not None], [g for g in ref if g is not None], atol=TOL)


def test_large_assignment_uses_hungarian():
    rng = np.random.default_rng(9)
    r = torch.tensor(rng.uniform(0, 1, size=(60, 3)))
    pairs = spatialcore_torch.best_assignment(r)
    assert len(pairs) == 3
    plain = match(r.numpy(), np.ones(60), np.zeros((60, 3)), SpatialCOREConfig(tie_break=0.0))
    assert sum(float(r[j, k]) for j, k in pairs) == pytest.approx(sum(float(r[j, k]) for j, k in plain), abs=TOL)


def _compare_records(main, ref):
    assert len(main) == len(ref)
    for a, b in zip(main, ref):
        assert a.keys() == b.keys()
        for k in a:
            assert math.isfinite(a[k]), k
            assert a[k] == pytest.approx(b[k], abs=TOL), k


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_spatialcore_score_parity(beta):
    cfg = SpatialCOREConfig(beta=beta)
    ros = synthetic.rollouts(N if beta == 0.1 else 100, seed=7)
    _compare_records(spatialcore_main(ros, cfg), spatialcore_torch.score_batch(ros, cfg))


def test_spatialcore_parity_without_validity_weighting():
    cfg = SpatialCOREConfig(validity_weighting=False)
    ros = synthetic.rollouts(300, seed=9)
    main = spatialcore_main(ros, cfg)
    _compare_records(main, spatialcore_torch.score_batch(ros, cfg))
    weighted = spatialcore_main(ros, CFG)
    assert sum(abs(a["r_spatial"] - b["r_spatial"]) > 1e-3 for a, b in zip(main, weighted)) > 10  # the switch acts


def test_box_details_parity():
    """Per-box H, match and IoU (the §4.3 analyses' inputs) agree with the torch reference box by box."""
    from spatial_jax.rewards.spatialcore import box_details

    ros = synthetic.rollouts(300, seed=10)
    main, ref = box_details(ros, CFG), spatialcore_torch.box_details(ros, CFG)
    assert [len(b) for b in main] == [len(b) for b in ref]
    flat = [(a, b) for ma, rb in zip(main, ref) for a, b in zip(ma, rb)]
    assert sum(a["matched"] for a, _ in flat) > 20 and sum(a["H"] is not None for a, _ in flat) > 20
    for a, b in flat:
        assert a["matched"] == b["matched"]
        for k in ("H", "iou"):
            assert (a[k] is None) == (b[k] is None), k
            if a[k] is not None:
                assert a[k] == pytest.approx(b[k], abs=TOL), k


def test_prosr_score_parity():
    cfg = ProSRConfig()
    ros = synthetic.rollouts(N, seed=8, with_blank=True)
    main = prosr_main(ros, cfg)
    _compare_records(main, prosr_torch.score_batch(ros, cfg))
    assert sum(m["cf_active"] for m in main) > N // 4 and sum(m["r_drift"] < 0 for m in main) > 10


def test_edge_case_parity():
    from spatial_jax.records import BlankRollout, GTBox, Rollout, TokenTrace

    line = '{"bbox_2d": [5, 5, 5, 9], "label": ""}\n{"bbox_2d": [0, 0, 1000, 1000], "label": "car"}\n'
    cases = [
        Rollout(id="empty", completion=""),
        Rollout(id="only-close", completion="</think>"),
        Rollout(id="zero-v", completion=line + "</think>\nA", answer=0, options=("A", "B"),
                gt_boxes=(GTBox((0, 0, 10, 10), "car", 0.0),)),
        Rollout(id="degenerate-gt", completion=line + "</think>\nA", answer="A",
                gt_boxes=(GTBox((3, 3, 3, 3), "", 1.0), GTBox((0, 0, 1000, 1000), "car", 1.0))),
        Rollout(id="nan-trace", completion=line + "x</think>B", answer="B",
                gt_boxes=(GTBox((0, 0, 1000, 1000), "car", 1.0),),
                trace=TokenTrace(entropies=(float("nan"),) * 3, offsets=((0, 1), (1, 2), (2, 3)))),
        Rollout(id="one-token", completion="a</think>B", answer="B",
                trace=TokenTrace(entropies=(0.5,), offsets=((0, 1),)),
                blank=BlankRollout("b</think>B", TokenTrace(entropies=(0.0,), offsets=((0, 1),)))),
    ]
    for cfg, main, ref in [(SpatialCOREConfig(), spatialcore_main, spatialcore_torch.score_batch),
                           (ProSRConfig(min_span_tokens=1), prosr_main, prosr_torch.score_batch)]:
        _compare_records(main(cases, cfg), ref(cases, cfg))


def _many_boxes(n, n_gt, seed):
    from spatial_jax.records import GTBox, Rollout, TokenTrace

    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        x1, y1 = (int(c) for c in rng.integers(0, 900, 2))
        w, h = (int(c) for c in rng.integers(1, 100, 2))
        lines.append(f'{{"bbox_2d": [{x1}, {y1}, {x1 + w}, {y1 + h}], "label": "{synthetic.OBJECTS[i % 12]} {i}"}}')
    lines += lines[:50]  # repeated boxes and labels: the format term's counts
    text = "\n".join(lines) + "\nThink.\n</think>\nA"
    offsets = synthetic.tokenize(text)
    gt = tuple(GTBox((80.0 * k, 100.0, 80.0 * k + 90, 190.0), synthetic.OBJECTS[k], 0.9) for k in range(n_gt))
    return Rollout(id="many", completion=text, question="Where is the man?", options=("A. x", "B. y"), answer="A",
                   gt_boxes=gt, trace=TokenTrace(tuple(synthetic.token_entropies(text, offsets, rng)),
                                                 tuple(offsets)))


def test_torch_reference_scales_to_thousands_of_boxes():
    """2,050 boxes (about 100k tokens): the reference took 72 s when each box scanned the whole trace; now each
    step is linear in boxes and tokens (observed ~0.3 s). 5 s leaves room for a shared, loaded CPU."""
    import time

    ros = [_many_boxes(2000, 1, seed=10), _many_boxes(2000, 12, seed=11)]  # exhaustive and Hungarian matching
    start = time.perf_counter()
    ref = spatialcore_torch.score_batch(ros, CFG)
    elapsed = time.perf_counter() - start
    _compare_records(spatialcore_main(ros, CFG), ref)
    assert all(r["n_pred"] == 2050 and r["n_with_H"] == 2050 for r in ref)
    assert elapsed < 5.0, f"torch reference took {elapsed:.1f} s for 2 x 2,050 boxes"


def _compare_diagnostics(main: dict, ref: dict) -> None:
    assert set(main) == set(ref)
    for k in main:
        if isinstance(main[k], float):
            assert main[k] == pytest.approx(ref[k], abs=TOL), k
        else:
            assert main[k] == ref[k], k


def test_prosr_diagnostics_parity():
    """ProSR's diagnostics (eqs. 3-7) against the torch reference on random pairs (unclosed spans, NaN entropies,
    unparsed answers among them) and on edge cases: no pairs, pairs without trajectories, one-token and all-zero
    trajectories, a rollout without its blank."""
    from spatial_jax.eval.prosr_diagnostics import diagnose
    from spatial_jax.records import BlankRollout, Rollout, TokenTrace
    from spatial_jax.reference import prosr_diagnostics_torch

    cfg = ProSRConfig()
    for seed in (4, 5):
        ros = synthetic.rollouts(N // 2, seed=seed, with_blank=True)
        main = diagnose(ros, cfg, 0.1, 0.4)
        _compare_diagnostics(main, prosr_diagnostics_torch.diagnose(ros, cfg, 0.1, 0.4))
        assert main["NTS_undefined"] > 0 and 0 < main["SAR"] < 1 and main["LRR@0.1"] > 0
    zeros = TokenTrace(entropies=(0.0, 0.0), offsets=((0, 1), (1, 2)))
    edge = [
        Rollout(id="unclosed", completion="ab", answer="A", trace=zeros, blank=BlankRollout("ab</think>A", zeros)),
        Rollout(id="both-open", completion="ab", trace=zeros, blank=BlankRollout("ab", zeros)),
        Rollout(id="zeros", completion="ab</think>A", answer="A", options=("A. x", "B. y"), trace=zeros,
                blank=BlankRollout("ab</think>A", zeros)),
        Rollout(id="one-token", completion="a</think>B", answer="B",
                trace=TokenTrace(entropies=(0.5,), offsets=((0, 1),)),
                blank=BlankRollout("b</think>B", TokenTrace(entropies=(0.0,), offsets=((0, 1),)))),
        Rollout(id="nan", completion="ab</think>B", answer=1, options=("A. x", "B. y"),
                trace=TokenTrace(entropies=(float("nan"),) * 2, offsets=((0, 1), (1, 2))),
                blank=BlankRollout("ab</think>B", zeros)),
        Rollout(id="no-blank", completion="ab</think>B", trace=zeros),
    ]
    for cases, tau in ((edge, 0.1), (edge[:1], 0.0), ([], 0.1)):
        _compare_diagnostics(diagnose(cases, cfg, tau), prosr_diagnostics_torch.diagnose(cases, cfg, tau))
    out = diagnose(edge, cfg)
    assert out["n"] == 5 and out["NTS_undefined"] == 3
