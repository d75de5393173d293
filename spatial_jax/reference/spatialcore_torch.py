"""Torch float64 reference of the SpatialCORE reward (SPEC 2), written apart from spatial_jax.rewards.spatialcore.

Shares only the string parsers (parse_think, resolve_gold, the word tokeniser); every number is computed here.
Matching is exhaustive search over assignments while there are at most 8! candidates, else scipy's Hungarian solver.
Each step is linear in the number of boxes and tokens (up to the matching), so thousands of boxes score in seconds.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Sequence

import torch
from scipy.optimize import linear_sum_assignment

from spatial_jax.reference.geometry_torch import pairwise_iou
from spatial_jax.reference.trace_torch import usable_tokens
from spatial_jax.rewards.parse_think import parse_think, resolve_gold
from spatial_jax.rewards.text import normalise_label, words

DTYPE = torch.float64
DIGITS = frozenset("0123456789")


def label_similarity_matrix(a: Sequence[str], b: Sequence[str]) -> torch.Tensor:
    """Eq. 13 via explicit binary bag-of-words vectors over b's vocabulary: a word of `a` outside it adds nothing
    to a dot product, so it enters only the norm (sqrt of the word count)."""
    sa, sb = [words(x) for x in a], [words(x) for x in b]
    index = {w: i for i, w in enumerate(sorted(set().union(*sb)))}

    def vectors(sets):
        out = torch.zeros(len(sets), len(index), dtype=DTYPE)
        hits = [(row, index[w]) for row, s in enumerate(sets) for w in s if w in index]
        if hits:
            rows, cols = zip(*hits)
            out[list(rows), list(cols)] = 1.0
        return out

    va, vb = vectors(sa), vectors(sb)
    na = torch.tensor([len(s) for s in sa], dtype=DTYPE).sqrt()
    nb = vb.norm(dim=1)
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


class DigitTokens:
    """The usable tokens (trace_torch) of one completion whose text is ASCII digits only, filed under the run of
    consecutive digit characters they lie in, so a coordinate looks only at the tokens of its own digits."""

    def __init__(self, completion: str, entropies, offsets):
        self.run = []  # per character: index of its digit run, or -1
        count = -1
        for i, ch in enumerate(completion):
            if ch in DIGITS:
                if i == 0 or completion[i - 1] not in DIGITS:
                    count += 1
                self.run.append(count)
            else:
                self.run.append(-1)
        spans, ent = usable_tokens(completion, entropies, offsets)
        self.by_run: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        for u, (s, e) in enumerate(spans):
            if self.run[s] >= 0 and self.run[s] == self.run[e - 1]:  # first and last in one run: all digits
                self.by_run[self.run[s]].append((s, e, u))
        self.entropies = ent

    def coordinate(self, a: int, b: int) -> torch.Tensor:
        """Entropies of the digit tokens overlapping the characters [a, b)."""
        runs = sorted({self.run[c] for c in range(a, b) if self.run[c] >= 0})
        picked = [u for r in runs for s, e, u in self.by_run[r] if s < b and e > a]
        return self.entropies[picked]

    def box(self, coord_spans, digit_vocab: int = 10) -> float | None:
        """Eq. 5; None when a coordinate has no usable digit token."""
        if len(coord_spans) != 4:
            return None
        means = []
        for a, b in coord_spans:
            h = self.coordinate(a, b)
            if h.numel() == 0:
                return None
            means.append(h.mean())
        return float(torch.clamp(torch.stack(means).mean() / math.log(digit_vocab), 0.0, 1.0))


def box_uncertainty(completion: str, entropies, offsets, coord_spans, digit_vocab: int = 10) -> float | None:
    """Eq. 5 from raw token entropies and character offsets; None when a coordinate has no usable digit token."""
    return DigitTokens(completion, entropies, offsets).box(coord_spans, digit_vocab)


MAX_EXHAUSTIVE = 40_320  # 8! assignments; beyond that the Hungarian algorithm (scipy) answers


def _assignments_exceed(big: int, small: int, limit: int) -> bool:
    """Whether big! / (big - small)! > limit, without computing a factorial of thousands of digits."""
    count = 1
    for i in range(small):
        count *= big - i
        if count > limit:
            return True
    return False


def best_assignment(score: torch.Tensor) -> list[tuple[int, int]]:
    """Maximum-sum one-to-one assignment with min(n, m) pairs: exhaustive for small sizes, else scipy."""
    n, m = score.shape
    if _assignments_exceed(max(n, m), min(n, m), MAX_EXHAUSTIVE):
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
    # A value seen k times repeats k - 1 times.
    rep_l = sum(k - 1 for k in Counter(normalise_label(b.label) for b in valid).values())
    rep_b = sum(k - 1 for k in Counter(tuple(b.bbox) for b in valid).values())
    value = cfg.format_base - min(cfg.repeat_label_cap, rep_l * cfg.repeat_label_penalty)
    value -= rep_b * cfg.repeat_box_penalty
    ctx = set(words(question))
    for o in options:
        ctx |= words(o)
    if has_gt and any(words(b.label) & ctx for b in valid):
        value += cfg.attempt_bonus
    return max(value, cfg.format_floor)  # SPEC 2: never below the floor


def score_one(ro, cfg) -> dict[str, float]:
    return _score_and_boxes(ro, cfg)[0]


def _score_and_boxes(ro, cfg) -> tuple[dict[str, float], list[dict]]:
    """The reward components and, per valid box, {H, matched, iou} as rewards.spatialcore.box_details defines them."""
    parsed = parse_think(ro.completion, cfg.coord_max)
    gold = resolve_gold(ro.answer, ro.options)
    closed = parsed.think_close_count > 0
    r_ans = 1.0 if closed and gold is not None and parsed.answer == gold else 0.0
    fmt = _format(parsed, len(ro.gt_boxes) > 0, ro.question, ro.options, cfg) if closed else 0.0
    valid = [b for b in parsed.boxes if b.valid]
    tokens = DigitTokens(ro.completion, ro.trace.entropies, ro.trace.offsets) if valid else None
    hs = [tokens.box(b.coord_spans, cfg.digit_vocab) for b in valid]
    omega = torch.tensor([1.0 if h is None else cfg.beta + (1 - cfg.beta) * (1 - h) for h in hs], dtype=DTYPE)
    r_sp = p = rec = f = over = 0.0
    n_matched = 0
    mean_iou = 0.0
    iou_of: dict[int, float] = {}
    n, m = len(valid), len(ro.gt_boxes)
    if closed and m > 0:
        # validity weighting off (Table 3 ablation): every reference weighs 1
        v = torch.tensor([g.validity if cfg.validity_weighting else 1.0 for g in ro.gt_boxes], dtype=DTYPE)
        if n == 0:
            r_sp = max(cfg.no_box_floor, -cfg.no_box_penalty * float(v.sum()))
        else:
            pb = torch.tensor([list(b.bbox) for b in valid], dtype=DTYPE)
            gb = torch.tensor([list(g.bbox) for g in ro.gt_boxes], dtype=DTYPE)
            r = pair_rewards(pb, [b.label for b in valid], gb, [g.label for g in ro.gt_boxes], v, cfg)
            ious = pairwise_iou(pb, gb)
            # Ties: larger sum of omega R, then of IoU.
            pairs = best_assignment(r * (1 + cfg.tie_break * omega[:, None]) + cfg.tie_break**2 * ious)
            n_matched = len(pairs)
            p = float(torch.stack([omega[j] * r[j, k] for j, k in pairs]).mean()) if pairs else 0.0
            rec = float(r.max(dim=0).values.sum() / v.sum()) if float(v.sum()) > 0 else 0.0
            f = f_alpha(p, rec, cfg.alpha) if float(v.sum()) > 0 else 0.0
            over = cfg.over_penalty * (n - n_matched)
            r_sp = min(cfg.spatial_clip, max(-cfg.spatial_clip, f - over))
            iou_of = {j: float(ious[j, k]) for j, k in pairs if float(r[j, k]) > 0}
            mean_iou = sum(iou_of.values()) / len(iou_of) if iou_of else 0.0
    gate = (1.0 if r_ans == 1.0 else cfg.gamma) if r_sp > 0 else 1.0
    term = cfg.lambda_s * gate * r_sp
    with_h = [h for h in hs if h is not None]
    boxes = [{"H": h, "matched": j in iou_of, "iou": iou_of.get(j)} for j, h in enumerate(hs)]
    scores = dict(
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
    return scores, boxes


def score_batch(rollouts, cfg) -> list[dict[str, float]]:
    return [score_one(ro, cfg) for ro in rollouts]


def box_details(rollouts, cfg) -> list[list[dict]]:
    return [_score_and_boxes(ro, cfg)[1] for ro in rollouts]
