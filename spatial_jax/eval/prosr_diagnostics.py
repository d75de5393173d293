"""ProSR's four process diagnostics on paired (image, blank-image) rollouts, and the failure-group split (SPEC 3).

A_blank (eq. 3), SAR (eq. 4), NTS (eq. 5), LRR@tau with Delta_tail (eqs. 6-7), each a mean over all N pairs. The
pairs are rollouts sampled from the policy, one with the image and one with its blank (eq. 2; evaluation draws them
at temperature 1, or takes its greedy rollouts when asked: eval.diagnostics). Pure functions of parsed answers and
entropy trajectories; `diagnose` builds those from Rollout records. spatial_jax/reference/prosr_diagnostics_torch.py
is the parity reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spatial_jax.records import Rollout
from spatial_jax.rewards.parse_think import parse_think, resolve_gold
from spatial_jax.rewards.prosr import ProSRConfig, segment_bounds, span_entropies

GROUPS = ("clean", "spurious_only", "tail_only", "both")


def _mean(flags: Sequence[float]) -> float | None:
    return float(np.mean(flags)) if len(flags) else None


def blank_accuracy(blank_answers: Sequence[str | None], gold: Sequence[str | None]) -> float | None:
    """Eq. 3: share of blank-image rollouts whose parsed answer equals the gold answer."""
    return _mean([float(a is not None and a == g) for a, g in zip(blank_answers, gold)])


def same_answers(answers: Sequence[str | None], blank_answers: Sequence[str | None]) -> list[bool]:
    """Per pair: both rollouts gave a parsed answer and it is the same one."""
    return [a is not None and a == b for a, b in zip(answers, blank_answers)]


def same_answer_rate(answers: Sequence[str | None], blank_answers: Sequence[str | None]) -> float | None:
    """Eq. 4."""
    return _mean([float(s) for s in same_answers(answers, blank_answers)])


def normalised_trajectory(e: np.ndarray, t: int = 64, eps: float = 1e-8) -> np.ndarray:
    """z = R_T(e) / (||R_T(e)||_1 + eps), R_T by numpy.interp (SPEC 7)."""
    e = np.asarray(e, np.float64)
    r = np.interp(np.linspace(0.0, len(e) - 1, t), np.arange(len(e)), e)
    return r / (np.abs(r).sum() + eps)


def pair_similarity(e: np.ndarray, e_blank: np.ndarray, t: int = 64, eps: float = 1e-8) -> float | None:
    """Per-sample term of eq. 5, 1 - 0.5 ||z^r - z^blank||_1; None when either trajectory is empty."""
    if len(e) == 0 or len(e_blank) == 0:
        return None
    return float(1.0 - 0.5 * np.abs(normalised_trajectory(e, t, eps) - normalised_trajectory(e_blank, t, eps)).sum())


def normalised_trajectory_similarity(sims: Sequence[float | None]) -> float | None:
    """Eq. 5: the mean over all N pairs; a pair without two reasoning trajectories (a span never closed, or empty)
    shares no trajectory shape and enters as 0 (`diagnose` reports how many did)."""
    return _mean([0.0 if s is None else s for s in sims])


def delta_tail(e: np.ndarray, margin: float = 0.1, mid_start: float = 0.3, late_start: float = 0.7) -> float:
    """Eq. 6: max(0, mu_late - mu_mid - m) over the 3:4:3 segments (SPEC 7); an empty segment has mean 0."""
    e = np.asarray(e, np.float64)
    b0, b1, n = segment_bounds(len(e), mid_start, late_start)
    mid = float(e[b0:b1].mean()) if b1 > b0 else 0.0
    late = float(e[b1:n].mean()) if n > b1 else 0.0
    return max(0.0, late - mid - margin)


def late_rise_rate(deltas: Sequence[float], tau: float = 0.1) -> float | None:
    """Eq. 7: share of rollouts with Delta_tail > tau."""
    return _mean([float(d > tau) for d in deltas])


def failure_groups(same: Sequence[bool], sims: Sequence[float | None], deltas: Sequence[float],
                   nts_threshold: float = 0.4, tau: float = 0.1) -> list[str]:
    """Per sample: spurious grounding = same answer and similarity > nts_threshold; tail = Delta_tail > tau."""
    out = []
    for s, sim, d in zip(same, sims, deltas):
        spurious = bool(s) and sim is not None and sim > nts_threshold
        tail = d > tau
        out.append(GROUPS[int(spurious) + 2 * int(tail)])
    return out


def diagnose(rollouts: Sequence[Rollout], cfg: ProSRConfig = ProSRConfig(), lrr_tau: float = 0.1,
             nts_threshold: float = 0.4) -> dict:
    """All four diagnostics and the failure groups over rollouts that carry their blank-image pair."""
    paired = [ro for ro in rollouts if ro.blank is not None]
    answers, blank_answers, gold, sims, deltas = [], [], [], [], []
    for ro in paired:
        p, b = parse_think(ro.completion), parse_think(ro.blank.completion)
        e = span_entropies(ro.completion, ro.trace, p.reasoning_span[1]) if p.closed else np.zeros(0)
        eb = span_entropies(ro.blank.completion, ro.blank.trace, b.reasoning_span[1]) if b.closed else np.zeros(0)
        answers.append(p.answer)
        blank_answers.append(b.answer)
        gold.append(resolve_gold(ro.answer, ro.options))
        sims.append(pair_similarity(e, eb, cfg.resample_len, cfg.l1_eps))
        deltas.append(delta_tail(e, cfg.margin, cfg.mid_start, cfg.late_start))
    same = same_answers(answers, blank_answers)
    groups = failure_groups(same, sims, deltas, nts_threshold, lrr_tau)
    return {
        "n": len(paired),
        "accuracy": _mean([float(a is not None and a == g) for a, g in zip(answers, gold)]),
        "A_blank": blank_accuracy(blank_answers, gold),
        "SAR": same_answer_rate(answers, blank_answers),
        "NTS": normalised_trajectory_similarity(sims),
        "NTS_undefined": sum(s is None for s in sims),
        f"LRR@{lrr_tau:g}": late_rise_rate(deltas, lrr_tau),
        "groups": {g: groups.count(g) for g in GROUPS},
        "group_of": {ro.id: g for ro, g in zip(paired, groups)},
    }
