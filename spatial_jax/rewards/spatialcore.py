"""SpatialCORE reward (SPEC 2): confidence-weighted spatial matching, format term, answer gate, composition.
With the default constants a reward lies in [-1.2, 2.25]; token traces are read as rewards/uncertainty.py says.

Host parts (parsing, matching) run in float64 numpy; the per-token part (box uncertainty, eq. 5) runs as one
jitted call over every box of a batch (`score_batch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from spatial_jax.config import check_at_least, check_non_negative, check_positive, check_range, require
from spatial_jax.kernels.position.uncertainty import box_uncertainty_from_digits
from spatial_jax.records import Rollout
from spatial_jax.rewards._host import bucket, host_float64
from spatial_jax.rewards.advantages import AdvantageConfig
from spatial_jax.rewards.geometry import pairwise_iou
from spatial_jax.rewards.matching import max_weight_matching
from spatial_jax.rewards.parse_think import ParsedBox, ParsedThink, final_answer, parse_think, resolve_gold
from spatial_jax.rewards.text import label_similarity, normalise_label, short_answer_score, words
from spatial_jax.rewards.uncertainty import pack_rollout_boxes


@dataclasses.dataclass(frozen=True)
class SpatialCOREConfig:
    w_iou: float = 0.8  # eq. 3
    w_label: float = 0.2  # eq. 3
    tau_iou: float = 0.25  # eq. 3 IoU margin (authors' code)
    beta: float = 0.1  # eq. 6 confidence floor
    alpha: float = 2.0  # eq. 8 F_alpha
    over_penalty: float = 0.3  # A.4, per unmatched valid prediction
    no_box_penalty: float = 0.3  # A.3, times sum of validities
    no_box_floor: float = -1.0  # A.3
    spatial_clip: float = 1.0  # R_spatial in [-clip, clip]
    gamma: float = 0.3  # eq. 10 answer gate g(0)
    lambda_s: float = 1.0  # eq. 10
    format_base: float = 0.2  # lambda_fmt * R_fmt, stored scaled (3.2.2)
    format_floor: float = -0.2  # SPEC 2 (settled 2026-11-30): repeats cannot swamp a group's std
    repeat_label_penalty: float = 0.05
    repeat_label_cap: float = 0.15
    repeat_box_penalty: float = 0.1
    attempt_bonus: float = 0.05  # A.4
    coord_max: int = 1000
    digit_vocab: int = 10  # |D| in eq. 5
    tie_break: float = 1e-7  # equal-sum matchings: prefer the larger confidence-weighted sum
    validity_weighting: bool = True  # Table 3 ablation: False scores every pseudo-GT box as if v_k = 1
    advantage: AdvantageConfig = AdvantageConfig()  # eq. 2

    def __post_init__(self):
        check_range(self, "w_iou", 0.0, 1.0)
        check_range(self, "w_label", 0.0, 1.0)
        require("w_label", self.w_label, abs(self.w_iou + self.w_label - 1.0) <= 1e-9, "equal 1 - w_iou (eq. 3)")
        check_range(self, "tau_iou", 0.0, 1.0, high_open=True)
        check_range(self, "beta", 0.0, 1.0)
        check_positive(self, "alpha", "spatial_clip")
        check_non_negative(self, "over_penalty", "no_box_penalty", "lambda_s", "format_base", "repeat_label_penalty",
                           "repeat_label_cap", "repeat_box_penalty", "attempt_bonus")
        check_range(self, "no_box_floor", -1.0, 0.0)
        check_range(self, "format_floor", -1.0, 0.0)
        check_range(self, "gamma", 0.0, 1.0)
        check_at_least(self, coord_max=1, digit_vocab=2)
        check_range(self, "tie_break", 0.0, 1e-3)


def pair_rewards(pred_boxes, pred_labels, gt_boxes, gt_labels, validity, cfg: SpatialCOREConfig) -> np.ndarray:
    """Eq. 3: R_jk = (w_iou max(0, IoU - tau) + w_label Sim) v_k, shape [n_pred, n_gt]."""
    n, m = len(pred_labels), len(gt_labels)
    if n == 0 or m == 0:
        return np.zeros((n, m))
    ious = pairwise_iou(np.asarray(pred_boxes, np.float64), np.asarray(gt_boxes, np.float64))
    sim = np.array([[label_similarity(a, b) for b in gt_labels] for a in pred_labels], np.float64)
    v = np.asarray(validity, np.float64)[None, :]
    return (cfg.w_iou * np.maximum(0.0, ious - cfg.tau_iou) + cfg.w_label * sim) * v


def confidence_weight(h, cfg: SpatialCOREConfig) -> np.ndarray:
    """Eq. 6: omega = beta + (1 - beta)(1 - H)."""
    return cfg.beta + (1.0 - cfg.beta) * (1.0 - np.asarray(h, np.float64))


def match(r: np.ndarray, omega: np.ndarray, ious: np.ndarray, cfg: SpatialCOREConfig) -> list[tuple[int, int]]:
    """Eq. 4: one-to-one assignment maximising sum R_jk. Ties go to the larger sum of omega_j R_jk, then of IoU
    (shares of tie_break and tie_break^2), so the pairs, and the IoU reported for them, never depend on the solver
    (equal weights, e.g. without a token trace, left that to it)."""
    return max_weight_matching(r * (1.0 + cfg.tie_break * omega[:, None]) + cfg.tie_break**2 * ious)


def precision(r: np.ndarray, omega: np.ndarray, pairs: Sequence[tuple[int, int]]) -> float:
    """Eq. 7: mean over matched pairs of omega_j R_jk; 0 with no pair."""
    if not pairs:
        return 0.0
    return float(np.mean([omega[j] * r[j, k] for j, k in pairs]))


def recall(r: np.ndarray, validity) -> float:
    """Eq. 8: (sum_k v_k)^-1 sum_k max_j R_jk; 0 when sum v_k = 0 or nothing is predicted."""
    v = np.asarray(validity, np.float64)
    total = float(v.sum())
    if total <= 0.0 or r.shape[0] == 0:
        return 0.0
    return float(r.max(axis=0).sum() / total)


def f_alpha(p: float, rec: float, alpha: float) -> float:
    """Eq. 8: (1 + a^2) P R / (a^2 P + R); 0 when the denominator is 0."""
    denom = alpha**2 * p + rec
    if denom <= 0.0:
        return 0.0
    return (1.0 + alpha**2) * p * rec / denom


def gated_spatial(r_ans: float, r_spatial: float, cfg: SpatialCOREConfig) -> float:
    """Eq. 10's spatial term: lambda_s g(R_ans) R_spatial, the gate scaling only a positive R_spatial."""
    g = (1.0 if r_ans >= 1.0 else cfg.gamma) if r_spatial > 0.0 else 1.0
    return cfg.lambda_s * g * r_spatial


def format_term(parsed: ParsedThink, has_gt: bool, question: str, options: Sequence[str],
                cfg: SpatialCOREConfig, text_gold: bool = False) -> float:
    """3.2.2 / A.4, already scaled: 0 unless the tail is one `</think>` + one capital letter (a text gold: + a
    one-line answer, SPEC section 10); repeats cost, a relevant box attempt earns a bonus; floored at format_floor
    (SPEC 2)."""
    if not parsed.well_formed(text_gold):
        return 0.0
    seen_labels: set[str] = set()
    seen_boxes: set[tuple[int, ...]] = set()
    repeat_labels = repeat_boxes = 0
    for b in parsed.valid_boxes:
        lab = normalise_label(b.label)
        repeat_labels += lab in seen_labels
        repeat_boxes += b.bbox in seen_boxes
        seen_labels.add(lab)
        seen_boxes.add(b.bbox)
    out = cfg.format_base
    out -= min(cfg.repeat_label_cap, cfg.repeat_label_penalty * repeat_labels)
    out -= cfg.repeat_box_penalty * repeat_boxes
    if has_gt:
        context = words(question).union(*(words(o) for o in options))
        if any(words(b.label) & context for b in parsed.valid_boxes):
            out += cfg.attempt_bonus
    return max(cfg.format_floor, out)


def validities(gt: Sequence, cfg: SpatialCOREConfig) -> np.ndarray:
    """The v_k of eqs. 3 and 8 and A.3: the pseudo-GT validities, or all 1 with validity weighting off."""
    if not cfg.validity_weighting:
        return np.ones(len(gt), np.float64)
    return np.array([g.validity for g in gt], np.float64)


def no_spatial() -> dict[str, float]:
    """The spatial part of a completion that earns none (no reference, or truncated)."""
    return dict(r_spatial=0.0, precision=0.0, recall=0.0, f_alpha=0.0, over_penalty=0.0, n_matched=0.0,
                mean_matched_iou=0.0)


@dataclasses.dataclass(frozen=True)
class Assignment:
    """Eqs. 3-4 for one completion's valid boxes: pair rewards r [n, m], IoUs [n, m], confidence weights omega [n],
    validities v [m] and the matched pairs M*."""

    r: np.ndarray
    ious: np.ndarray
    omega: np.ndarray
    v: np.ndarray
    pairs: list[tuple[int, int]]

    def positive_pairs(self) -> list[tuple[int, int]]:
        """Pairs of positive reward: the boxes that matched a reference (zero-reward pairs only fill M*, and which
        of them is picked among ties is arbitrary)."""
        return [(j, k) for j, k in self.pairs if self.r[j, k] > 0]


def assign(boxes: Sequence[ParsedBox], h: np.ndarray, rollout: Rollout, cfg: SpatialCOREConfig) -> Assignment:
    gt = rollout.gt_boxes
    pred_xy = np.array([b.bbox for b in boxes], np.float64).reshape(-1, 4)
    gt_xy = np.array([g.bbox for g in gt], np.float64).reshape(-1, 4)
    v = validities(gt, cfg)
    r = pair_rewards(pred_xy, [b.label for b in boxes], gt_xy, [g.label for g in gt], v, cfg)
    omega = confidence_weight(h, cfg)
    ious = pairwise_iou(pred_xy, gt_xy) if len(boxes) and len(gt) else np.zeros((len(boxes), len(gt)))
    pairs = match(r, omega, ious, cfg) if len(boxes) and len(gt) else []
    return Assignment(r=r, ious=ious, omega=omega, v=v, pairs=pairs)


def spatial_reward(
    boxes: Sequence[ParsedBox], h: np.ndarray, rollout: Rollout, cfg: SpatialCOREConfig
) -> dict[str, float]:
    """Eqs. 3-8 with A.3/A.4: R_spatial and its parts for the valid predicted boxes of a closed completion.

    mean_matched_iou averages over matched pairs of positive pair reward (Assignment.positive_pairs)."""
    n, m = len(boxes), len(rollout.gt_boxes)
    out = no_spatial()
    if m == 0:
        return out  # A.3: no reference, boxes neither rewarded nor penalised
    if n == 0:
        out["r_spatial"] = max(cfg.no_box_floor, -cfg.no_box_penalty * float(validities(rollout.gt_boxes, cfg).sum()))
        return out  # A.3
    a = assign(boxes, h, rollout, cfg)
    p = precision(a.r, a.omega, a.pairs)
    rec = recall(a.r, a.v)
    f = f_alpha(p, rec, cfg.alpha) if a.v.sum() > 0 else 0.0
    over = cfg.over_penalty * max(0, n - len(a.pairs))  # A.4
    positive = [a.ious[j, k] for j, k in a.positive_pairs()]
    out.update(
        r_spatial=float(np.clip(f - over, -cfg.spatial_clip, cfg.spatial_clip)),
        precision=p,
        recall=rec,
        f_alpha=f,
        over_penalty=over,
        n_matched=float(len(a.pairs)),
        mean_matched_iou=float(np.mean(positive)) if positive else 0.0,
    )
    return out


_uncertainty_jit = jax.jit(box_uncertainty_from_digits)


def batch_uncertainty(
    rollouts: Sequence[Rollout], boxes: Sequence[Sequence[ParsedBox]], cfg: SpatialCOREConfig
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Eq. 5 for every box of every rollout in one jitted float64 call; per rollout (H [n], has_H [n])."""
    packed_e, packed_m = [], []
    for ro, bs in zip(rollouts, boxes):
        if bs:
            e, mk = pack_rollout_boxes(ro.completion, ro.trace.offsets, ro.trace.entropies,
                                       [b.coord_spans for b in bs])
            packed_e.append(e)
            packed_m.append(mk)
    total = sum(e.shape[0] for e in packed_e)
    if total == 0:
        return [(np.zeros(0), np.zeros(0, bool)) for _ in boxes]
    k = bucket(max(e.shape[2] for e in packed_e), 4)
    rows = bucket(total, 16)
    ent = np.zeros((rows, 4, k))
    mask = np.zeros((rows, 4, k), bool)
    at = 0
    for e, mk in zip(packed_e, packed_m):
        ent[at:at + e.shape[0], :, : e.shape[2]] = e
        mask[at:at + e.shape[0], :, : e.shape[2]] = mk
        at += e.shape[0]
    if cfg.digit_vocab != 10:
        ent = ent * (np.log(10.0) / np.log(cfg.digit_vocab))  # the jitted eq. 5 divides by ln 10, not ln|D|
    with host_float64():
        h, has = _uncertainty_jit(ent, mask)
        h, has = np.asarray(h, np.float64), np.asarray(has)
    out, at = [], 0
    for bs in boxes:
        out.append((h[at:at + len(bs)], has[at:at + len(bs)]))
        at += len(bs)
    return out


def _score_one(ro: Rollout, parsed: ParsedThink, valid: Sequence[ParsedBox], h: np.ndarray, has: np.ndarray,
               cfg: SpatialCOREConfig) -> dict[str, float]:
    text_gold = ro.answer_type == "text"
    gold = ro.answer if text_gold else resolve_gold(ro.answer, ro.options)
    closed = parsed.closed
    if text_gold:
        r_ans = short_answer_score(final_answer(ro.completion), gold) if closed else 0.0
    else:
        r_ans = 1.0 if closed and gold is not None and parsed.answer == gold else 0.0
    fmt = format_term(parsed, len(ro.gt_boxes) > 0, ro.question, ro.options, cfg, text_gold) if closed else 0.0
    sp = spatial_reward(valid, h, ro, cfg) if closed else no_spatial()  # truncated: R_spatial = 0
    gated = gated_spatial(r_ans, sp["r_spatial"], cfg)
    n_h = int(np.sum(has))
    return dict(
        reward=r_ans + fmt + gated,
        r_ans=r_ans,
        format=fmt,
        r_spatial=sp["r_spatial"],
        spatial_term=gated,
        precision=sp["precision"],
        recall=sp["recall"],
        f_alpha=sp["f_alpha"],
        over_penalty=sp["over_penalty"],
        n_pred=float(len(valid)),
        n_invalid=float(len(parsed.boxes) - len(valid)),
        n_gt=float(len(ro.gt_boxes)),
        n_matched=sp["n_matched"],
        mean_matched_iou=sp["mean_matched_iou"],
        mean_H=float(np.sum(np.where(has, h, 0.0)) / n_h) if n_h else 0.0,
        n_with_H=float(n_h),
        think_closed=float(closed),
        think_close_count=float(parsed.think_close_count),
        answer_parsed=float(parsed.answer is not None),
        gold_resolved=float(gold is not None),
        well_formed=float(parsed.well_formed(text_gold)),
    )


def score_batch(rollouts: Sequence[Rollout], cfg: SpatialCOREConfig = SpatialCOREConfig()) -> list[dict[str, float]]:
    """Scores many rollouts; the per-token uncertainty of all their boxes is one jitted call."""
    parsed = [parse_think(ro.completion, cfg.coord_max) for ro in rollouts]
    valid = [p.valid_boxes for p in parsed]
    hs = batch_uncertainty(rollouts, valid, cfg)
    return [_score_one(ro, p, vb, h, has, cfg) for ro, p, vb, (h, has) in zip(rollouts, parsed, valid, hs)]


def box_details(rollouts: Sequence[Rollout], cfg: SpatialCOREConfig = SpatialCOREConfig()) -> list[list[dict]]:
    """Per rollout, one record per valid predicted box for the §4.3 analyses: its uncertainty H (None without a
    digit trace), whether it matched a reference (a positive-reward pair of M*) and that pair's IoU (None if not).
    A completion that never closed its reasoning has no matching (its R_spatial is 0), so nothing matches."""
    parsed = [parse_think(ro.completion, cfg.coord_max) for ro in rollouts]
    valid = [p.valid_boxes for p in parsed]
    out = []
    for ro, p, bs, (h, has) in zip(rollouts, parsed, valid, batch_uncertainty(rollouts, valid, cfg)):
        iou_of: dict[int, float] = {}
        if p.closed and bs and ro.gt_boxes:
            a = assign(bs, h, ro, cfg)
            iou_of = {j: float(a.ious[j, k]) for j, k in a.positive_pairs()}
        out.append([{"H": float(h[j]) if has[j] else None, "matched": j in iou_of, "iou": iou_of.get(j)}
                    for j in range(len(bs))])
    return out


def score(rollout: Rollout, cfg: SpatialCOREConfig = SpatialCOREConfig()) -> dict[str, float]:
    """Eq. 10: r = R_ans + format term + lambda_s g(R_ans) R_spatial, with every component."""
    return score_batch([rollout], cfg)[0]
