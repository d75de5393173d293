"""Torch float64 reference of the SpatialCORE reward (SPEC 2), written apart from spatial_jax.rewards.spatialcore.

Shares only the string parsers (parse_think, resolve_gold, the word tokeniser); every number is computed here.
Matching is exhaustive search over assignments (the reward's box counts are small; scipy beyond 8! candidates).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from scipy.optimize import linear_sum_assignment

from spatial_jax.reference.geometry_torch import pairwise_iou
from spatial_jax.rewards.parse_think import parse_think, resolve_gold
from spatial_jax.rewards.text import normalise_label, words

DTYPE = torch.float64


def label_similarity_matrix(a: Sequence[str], b: Sequence[str]) -> torch.Tensor:
    """Eq. 13 via explicit binary bag-of-words vectors over the joint vocabulary."""
    sa, sb = [words(x) for x in a], [words(x) for x in b]
    vocab = sorted(set().union(*sa, *sb))
    index = {w: i for i, w in enumerate(vocab)}
    va = torch.zeros(len(a), len(vocab), dtype=DTYPE)
    vb = torch.zeros(len(b), len(vocab), dtype=DTYPE)
    for row, s in enumerate(sa):
        for w in s:
            va[row, index[w]] = 1.0
    for row, s in enumerate(sb):
        for w in s:
            vb[row, index[w]] = 1.0
    na, nb = va.norm(dim=1), vb.norm(dim=1)
    dot = va @ vb.T
    denom = na[:, None] * nb[None, :]
    return torch.where(denom > 0, dot / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(dot))


def pair_rewards(pred_boxes, pred_labels, gt_boxes, gt_labels, validity, cfg) -> torch.Tensor:
    """Eq. 3."""
    if len(pred_labels) == 0 or len(gt_labels) == 0:
        return torch.zeros(len(pred_labels), len(gt_labels), dtype=DTYPE)
    i_o_u = pairwise_iou(pred_boxes, gt_boxes)
    sim = label_similarity_matrix(pred_labels, gt_labels)
    v = torch.as_tensor(validity, dtype=DTYPE)
    return (cfg.w_iou * torch.clamp(i_o_u - cfg.tau_iou, min=0.0) + cfg.w_label * sim) * v[None, :]


def box_uncertainty(completion: str, entropies, offsets, coord_spans, digit_vocab: int = 10) -> float | None:
    """Eq. 5 from raw token entropies and character offsets; None when a coordinate has no usable digit token."""
    ent = torch.as_tensor(list(entropies), dtype=DTYPE)
    coord_means = []
    for a, b in coord_spans:
        picked = []
        for t, (s, e) in enumerate(offsets):
            text = completion[s:e]
            overlaps = s < b and e > a
            if overlaps and text != "" and all(ch in "0123456789" for ch in text) and t < ent.numel():
                if math.isfinite(float(ent[t])):
                    picked.append(ent[t])
        if not picked:
            return None
        coord_means.append(torch.stack(picked).mean())
    if len(coord_means) != 4:
        return None
    return float(torch.clamp(torch.stack(coord_means).mean() / math.log(digit_vocab), 0.0, 1.0))


MAX_EXHAUSTIVE = 40_320  # 8! assignments; beyond that the Hungarian algorithm (scipy) answers


def best_assignment(score: torch.Tensor) -> list[tuple[int, int]]:
    """Maximum-sum one-to-one assignment with min(n, m) pairs: exhaustive for small sizes, else scipy."""
    n, m = score.shape
    if math.perm(max(n, m), min(n, m)) > MAX_EXHAUSTIVE:
        rows, cols = linear_sum_assignment(score.numpy(), maximize=True)
        return [(int(j), int(k)) for j, k in zip(rows, cols)]
    s = score.tolist()
    best, best_pairs = -math.inf, []
    if n <= m:
        for cols in itertools.permutations(range(m), n):
            total = sum(s[j][k] for j, k in enumerate(cols))
            if total > best:
                best, best_pairs = total, list(enumerate(cols))
    else:
        for rows in itertools.permutations(range(n), m):
            total = sum(s[j][k] for k, j in enumerate(rows))
            if total > best:
                best, best_pairs = total, [(j, k) for k, j in enumerate(rows)]
    return best_pairs


def f_alpha(p: float, r: float, alpha: float) -> float:
    denom = alpha**2 * p + r
    return 0.0 if denom <= 0 else (1 + alpha**2) * p * r / denom


def _format(parsed, has_gt: bool, question: str, options, cfg) -> float:
    if parsed.think_close_count != 1:
        return 0.0
    tail = parsed.after_think.strip()
    if not (len(tail) == 1 and tail in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"):
        return 0.0
    valid = [b for b in parsed.boxes if b.valid]
    labels = [normalise_label(b.label) for b in valid]
    coords = [tuple(b.bbox) for b in valid]
    rep_l = sum(1 for i, x in enumerate(labels) if x in labels[:i])
    rep_b = sum(1 for i, x in enumerate(coords) if x in coords[:i])
    value = cfg.format_base - min(cfg.repeat_label_cap, rep_l * cfg.repeat_label_penalty)
    value -= rep_b * cfg.repeat_box_penalty
    ctx = set(words(question))
    for o in options:
        ctx |= words(o)
    if has_gt and any(words(b.label) & ctx for b in valid):
        value += cfg.attempt_bonus
    return value


def score_one(ro, cfg) -> dict[str, float]:
    parsed = parse_think(ro.completion, cfg.coord_max)
    gold = resolve_gold(ro.answer, ro.options)
    closed = parsed.think_close_count > 0
    r_ans = 1.0 if closed and gold is not None and parsed.answer == gold else 0.0
    fmt = _format(parsed, len(ro.gt_boxes) > 0, ro.question, ro.options, cfg) if closed else 0.0
    valid = [b for b in parsed.boxes if b.valid]
    hs = [
        box_uncertainty(ro.completion, ro.trace.entropies, ro.trace.offsets, b.coord_spans, cfg.digit_vocab)
        if ro.trace.offsets
        else None
        for b in valid
    ]
    omega = torch.tensor([1.0 if h is None else cfg.beta + (1 - cfg.beta) * (1 - h) for h in hs], dtype=DTYPE)
    r_sp = p = rec = f = over = 0.0
    n_matched = 0
    mean_iou = 0.0
    n, m = len(valid), len(ro.gt_boxes)
    if closed and m > 0:
        v = torch.tensor([g.validity for g in ro.gt_boxes], dtype=DTYPE)
        if n == 0:
            r_sp = max(cfg.no_box_floor, -cfg.no_box_penalty * float(v.sum()))
        else:
            pb = torch.tensor([list(b.bbox) for b in valid], dtype=DTYPE)
            gb = torch.tensor([list(g.bbox) for g in ro.gt_boxes], dtype=DTYPE)
            r = pair_rewards(pb, [b.label for b in valid], gb, [g.label for g in ro.gt_boxes], v, cfg)
            pairs = best_assignment(r * (1 + cfg.tie_break * omega[:, None]))
            n_matched = len(pairs)
            p = float(torch.stack([omega[j] * r[j, k] for j, k in pairs]).mean()) if pairs else 0.0
            rec = float(r.max(dim=0).values.sum() / v.sum()) if float(v.sum()) > 0 else 0.0
            f = f_alpha(p, rec, cfg.alpha) if float(v.sum()) > 0 else 0.0
            over = cfg.over_penalty * (n - n_matched)
            r_sp = min(cfg.spatial_clip, max(-cfg.spatial_clip, f - over))
            ious = pairwise_iou(pb, gb)
            positive = [ious[j, k] for j, k in pairs if float(r[j, k]) > 0]
            mean_iou = float(torch.stack(positive).mean()) if positive else 0.0
    gate = (1.0 if r_ans == 1.0 else cfg.gamma) if r_sp > 0 else 1.0
    term = cfg.lambda_s * gate * r_sp
    with_h = [h for h in hs if h is not None]
    return dict(
        reward=r_ans + fmt + term,
        r_ans=r_ans,
        format=fmt,
        r_spatial=r_sp,
        spatial_term=term,
        precision=p,
        recall=rec,
        f_alpha=f,
        over_penalty=over,
        n_pred=float(n),
        n_invalid=float(len(parsed.boxes) - n),
        n_gt=float(m),
        n_matched=float(n_matched),
        mean_matched_iou=mean_iou,
        mean_H=sum(with_h) / len(with_h) if with_h else 0.0,
        n_with_H=float(len(with_h)),
        think_closed=float(closed),
        think_close_count=float(parsed.think_close_count),
        answer_parsed=float(parsed.answer is not None),
        gold_resolved=float(gold is not None),
        well_formed=float(parsed.think_close_count == 1 and len(parsed.after_think.strip()) == 1
                          and parsed.after_think.strip() in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    )


def score_batch(rollouts, cfg) -> list[dict[str, float]]:
    return [score_one(ro, cfg) for ro in rollouts]
