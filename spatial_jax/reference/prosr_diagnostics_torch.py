"""Torch float64 reference of ProSR's process diagnostics (eqs. 3-7, SPEC 3), written apart from
spatial_jax.eval.prosr_diagnostics: trajectories, similarities and segment statistics come from prosr_torch.

Every figure is a mean over all N pairs (eqs. 3-5, 7); a pair without two reasoning trajectories enters NTS as 0.
"""

from __future__ import annotations

import torch

from spatial_jax.reference.prosr_torch import reasoning_entropies, segment_means, similarity
from spatial_jax.rewards.parse_think import parse_think, resolve_gold

GROUPS = ("clean", "spurious_only", "tail_only", "both")


def _trajectory(completion: str, trace) -> torch.Tensor:
    end = completion.find("</think>")
    if end < 0:
        return torch.zeros(0, dtype=torch.float64)
    return reasoning_entropies(completion, trace.entropies, trace.offsets, end)


def _share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def diagnose(rollouts, cfg, lrr_tau: float = 0.1, nts_threshold: float = 0.4) -> dict:
    paired = [ro for ro in rollouts if ro.blank is not None]
    correct, blank_correct, same, sims, rises, groups = [], [], [], [], [], []
    for ro in paired:
        answer, blank_answer = parse_think(ro.completion).answer, parse_think(ro.blank.completion).answer
        gold = resolve_gold(ro.answer, ro.options)
        e, eb = _trajectory(ro.completion, ro.trace), _trajectory(ro.blank.completion, ro.blank.trace)
        defined = e.numel() > 0 and eb.numel() > 0
        sim = similarity(e, eb, cfg.resample_len, cfg.l1_eps) if defined else None
        _, mid, late = segment_means(e, cfg.mid_start, cfg.late_start)
        delta = max(0.0, late - mid - cfg.margin)
        correct.append(answer is not None and answer == gold)
        blank_correct.append(blank_answer is not None and blank_answer == gold)
        same.append(answer is not None and answer == blank_answer)
        sims.append(sim)
        rises.append(delta > lrr_tau)
        spurious = same[-1] and sim is not None and sim > nts_threshold
        groups.append(GROUPS[int(spurious) + 2 * int(rises[-1])])
    nts = [0.0 if s is None else s for s in sims]
    return {
        "n": len(paired),
        "accuracy": _share(correct),
        "A_blank": _share(blank_correct),
        "SAR": _share(same),
        "NTS": sum(nts) / len(nts) if nts else None,
        "NTS_undefined": sum(s is None for s in sims),
        f"LRR@{lrr_tau:g}": _share(rises),
        "groups": {g: groups.count(g) for g in GROUPS},
        "group_of": {ro.id: g for ro, g in zip(paired, groups)},
    }
