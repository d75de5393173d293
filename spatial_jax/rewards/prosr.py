"""ProSR reward (SPEC 3): answer + format + counterfactual-invariance and tail-drift penalties (eqs. 8-11).
With the default weights a reward lies in [-0.2, 1.2]; token traces are read as rewards/uncertainty.py says.

Entropy trajectories are taken over the reasoning span (start of the completion to `</think>`); the trajectory
maths (resampling, l1 normalisation, s_cf, segment means) is jittable JAX, run for a whole batch at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spatial_jax.config import check_at_least, check_non_negative, check_positive, check_range
from spatial_jax.records import Rollout, TokenTrace
from spatial_jax.rewards._host import bucket, host_float64
from spatial_jax.rewards.advantages import AdvantageConfig
from spatial_jax.rewards.parse_think import ParsedThink, final_answer, parse_think, resolve_gold
from spatial_jax.rewards.text import normalise_short_answer, short_answer_score
from spatial_jax.rewards.uncertainty import read_entropies


@dataclasses.dataclass(frozen=True)
class ProSRConfig:
    resample_len: int = 64  # T of R_T (paper leaves it open)
    tau_cf: float = 0.4  # eq. 9
    margin: float = 0.1  # m of eq. 10
    lambda_fmt: float = 0.2  # eq. 11
    lambda_cf: float = 0.1  # eq. 11
    lambda_drift: float = 0.1  # eq. 11
    l1_eps: float = 1e-8  # z = R_T(e) / (||R_T(e)||_1 + eps)
    min_span_tokens: int = 10  # validity safeguard of 3.3.3
    mid_start: float = 0.3  # early:middle:late = 3:4:3
    late_start: float = 0.7
    advantage: AdvantageConfig = AdvantageConfig()  # eq. 2

    def __post_init__(self):
        check_at_least(self, resample_len=1, min_span_tokens=1)
        check_range(self, "tau_cf", 0.0, 1.0, high_open=True)
        check_non_negative(self, "margin", "lambda_fmt", "lambda_cf", "lambda_drift")
        check_positive(self, "l1_eps")
        check_range(self, "mid_start", 0.0, 1.0)
        check_range(self, "late_start", self.mid_start, 1.0)  # early:middle:late segments in order


def resample(e: jax.Array, length: jax.Array, t: int) -> jax.Array:
    """R_T (SPEC 7): numpy.interp(linspace(0, L-1, T), arange(L), e) on padded [..., Lmax] rows of true length L.

    L = 1 gives a constant row; L = 0 gives zeros.
    """
    length = jnp.asarray(length)
    last = jnp.maximum(length - 1, 0).astype(e.dtype)[..., None]
    frac_pos = jnp.arange(t, dtype=e.dtype) / max(t - 1, 1)
    x = last * frac_pos
    i0 = jnp.clip(jnp.floor(x).astype(jnp.int32), 0, jnp.maximum(length - 1, 0)[..., None])
    i1 = jnp.minimum(i0 + 1, jnp.maximum(length - 1, 0)[..., None])
    w = x - i0.astype(e.dtype)
    v0 = jnp.take_along_axis(e, i0, axis=-1)
    v1 = jnp.take_along_axis(e, i1, axis=-1)
    out = v0 + w * (v1 - v0)
    return jnp.where((length > 0)[..., None], out, jnp.zeros((), e.dtype))


def l1_normalise(x: jax.Array, eps: float) -> jax.Array:
    """z = x / (||x||_1 + eps) along the last axis."""
    return x / (jnp.sum(jnp.abs(x), axis=-1, keepdims=True) + eps)


def trajectory_similarity(z: jax.Array, z_blank: jax.Array) -> jax.Array:
    """Eq. 8: s_cf = 1 - 0.5 ||z - z_blank||_1."""
    return 1.0 - 0.5 * jnp.sum(jnp.abs(z - z_blank), axis=-1)


def counterfactual_penalty(s_cf: jax.Array, same_answer: jax.Array, tau_cf: float) -> jax.Array:
    """Eq. 9: -clip((s_cf - tau) / (1 - tau), 0, 1) when both rollouts give the same answer, else 0."""
    pen = -jnp.clip((s_cf - tau_cf) / (1.0 - tau_cf), 0.0, 1.0)
    return jnp.where(same_answer, pen, jnp.zeros_like(pen))


def segment_means(e: jax.Array, bounds: jax.Array) -> jax.Array:
    """Mean of each of the 3 segments [0, b0), [b0, b1), [b1, b2) of padded rows; bounds [..., 3]; empty -> 0."""
    pos = jnp.arange(e.shape[-1])
    starts = jnp.concatenate([jnp.zeros_like(bounds[..., :1]), bounds[..., :2]], axis=-1)
    inside = (pos >= starts[..., :, None]) & (pos < bounds[..., :, None])
    total = jnp.sum(jnp.where(inside, e[..., None, :], 0), axis=-1)
    count = jnp.sum(inside, axis=-1)
    return jnp.where(count > 0, total / jnp.maximum(count, 1).astype(e.dtype), jnp.zeros((), e.dtype))


def drift_penalty(h_late: jax.Array, h_mid: jax.Array, margin: float) -> jax.Array:
    """Eq. 10: -clip(max(0, H_L - H_M - m), 0, 1)."""
    return -jnp.clip(jnp.maximum(h_late - h_mid - margin, 0.0), 0.0, 1.0)


def _trajectory_terms(e, length, e_blank, length_blank, bounds, t: int, l1_eps: float):
    z = l1_normalise(resample(e, length, t), l1_eps)
    zb = l1_normalise(resample(e_blank, length_blank, t), l1_eps)
    return trajectory_similarity(z, zb), segment_means(e, bounds)


_terms_jit = jax.jit(_trajectory_terms, static_argnames=("t",))


def segment_bounds(length: int, mid_start: float = 0.3, late_start: float = 0.7) -> tuple[int, int, int]:
    """SPEC 7: early [0, round(0.3 L)), middle [.., round(0.7 L)), late [.., L), with Python's round."""
    return round(mid_start * length), round(late_start * length), length


def span_entropies(completion: str, trace: TokenTrace, end: int) -> np.ndarray:
    """Entropies of the tokens lying inside [0, end) (SPEC 7), in order; tokens a trace cannot hold (zero-width,
    unreadable entropy: rewards/uncertainty.py) are left out."""
    n = min(len(trace.entropies), len(trace.offsets))
    if n == 0:
        return np.zeros(0)
    ent, readable = read_entropies(trace.entropies[:n])
    inside = np.array([0 <= s < e <= end for s, e in trace.offsets[:n]])  # Python ints: no int64 overflow
    return ent[inside & readable]


def _trajectory(completion: str, trace: TokenTrace, parsed: ParsedThink) -> np.ndarray:
    return span_entropies(completion, trace, parsed.reasoning_span[1]) if parsed.closed else np.zeros(0)


def _pad(rows: Sequence[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros((len(rows), width))
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, np.array([len(r) for r in rows], np.int32)


def _accuracy(ro: Rollout, p: ParsedThink, text_gold: bool) -> float:
    """R_acc: the parsed letter against the gold letter, or a text gold's normalised match (SPEC section 10)."""
    if not p.closed:
        return 0.0
    if text_gold:
        return short_answer_score(final_answer(ro.completion), ro.answer)
    gold = resolve_gold(ro.answer, ro.options)
    return 1.0 if gold is not None and p.answer == gold else 0.0


def _same_answer(ro: Rollout, p: ParsedThink, blank: ParsedThink, text_gold: bool) -> bool:
    """Whether the image-blind rollout reached the same final answer (eq. 9 applies only then)."""
    if not text_gold:
        return p.answer is not None and p.answer == blank.answer
    mine, theirs = final_answer(ro.completion), final_answer(ro.blank.completion)
    return mine is not None and theirs is not None and normalise_short_answer(mine) == normalise_short_answer(theirs)


def score_batch(rollouts: Sequence[Rollout], cfg: ProSRConfig = ProSRConfig()) -> list[dict[str, float]]:
    """Eq. 11 for many rollouts; the trajectory terms of the whole batch are one jitted call."""
    n = len(rollouts)
    if n == 0:
        return []
    parsed = [parse_think(ro.completion) for ro in rollouts]
    blanks = [parse_think(ro.blank.completion) if ro.blank is not None else None for ro in rollouts]
    traj = [_trajectory(ro.completion, ro.trace, p) for ro, p in zip(rollouts, parsed)]
    traj_b = [
        _trajectory(ro.blank.completion, ro.blank.trace, b) if b is not None else np.zeros(0)
        for ro, b in zip(rollouts, blanks)
    ]
    width = bucket(max(len(x) for x in traj + traj_b), 64)
    rows = bucket(n, 8)
    pad = [np.zeros(0)] * (rows - n)
    e, le = _pad(traj + pad, width)
    eb, lb = _pad(traj_b + pad, width)
    bounds = np.array([segment_bounds(int(L), cfg.mid_start, cfg.late_start) for L in le], np.int32)
    with host_float64():
        s_cf, means = _terms_jit(e, le, eb, lb, bounds, t=cfg.resample_len, l1_eps=cfg.l1_eps)
        s_cf, means = np.asarray(s_cf, np.float64), np.asarray(means, np.float64)
    out = []
    for i, ro in enumerate(rollouts):
        p, b = parsed[i], blanks[i]
        text_gold = ro.answer_type == "text"
        r_acc, r_fmt = _accuracy(ro, p, text_gold), float(p.well_formed(text_gold))
        drift_on = p.closed and le[i] >= cfg.min_span_tokens
        cf_on = drift_on and b is not None and b.closed and lb[i] >= cfg.min_span_tokens
        same = cf_on and _same_answer(ro, p, b, text_gold)
        r_cf = -float(np.clip((s_cf[i] - cfg.tau_cf) / (1.0 - cfg.tau_cf), 0.0, 1.0)) if same else 0.0  # eq. 9
        h_e, h_m, h_l = (float(x) for x in means[i])
        delta = max(0.0, h_l - h_m - cfg.margin)
        r_drift = -min(delta, 1.0) if drift_on else 0.0  # eq. 10
        reward = r_acc + cfg.lambda_fmt * r_fmt + cfg.lambda_cf * r_cf + cfg.lambda_drift * r_drift  # eq. 11
        out.append(
            dict(
                reward=reward,
                r_acc=r_acc,
                r_fmt=r_fmt,
                r_cf=r_cf,
                r_drift=r_drift,
                s_cf=float(s_cf[i]) if cf_on else 0.0,
                delta_tail=delta if drift_on else 0.0,
                h_early=h_e,
                h_mid=h_m,
                h_late=h_l,
                span_len=float(le[i]),
                blank_span_len=float(lb[i]),
                cf_active=float(cf_on),
                drift_active=float(drift_on),
                same_answer=float(same),
                has_blank=float(b is not None),
                think_closed=float(p.closed),
                answer_parsed=float(p.answer is not None),
                gold_resolved=float(text_gold or resolve_gold(ro.answer, ro.options) is not None),
                well_formed=float(p.well_formed(text_gold)),
            )
        )
    return out


def score(rollout: Rollout, cfg: ProSRConfig = ProSRConfig()) -> dict[str, float]:
    """Eq. 11: R = R_acc + 0.2 R_fmt + 0.1 R_cf + 0.1 R_drift, with every component."""
    return score_batch([rollout], cfg)[0]
