"""Torch float64 reference of the SpatialThinker dense reward (SPEC 4), written apart from rewards/spatialthinker.py.

Shares only the string parsers (rewards/parse_scene.py, rewards/text.py word sets) and the torch CIoU reference.
The Hungarian step is checked by exhaustive search over one-to-one assignments when there are at most
MAX_ENUMERATED of them (scipy otherwise, for large scenes only).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from scipy.optimize import linear_sum_assignment

from spatial_jax.records import Rollout
from spatial_jax.reference import geometry_torch
from spatial_jax.rewards import parse_scene, text
from spatial_jax.rewards.spatialthinker import SpatialThinkerConfig

F64 = torch.float64
MAX_ENUMERATED = 5040
COORD_LIMIT = 1e6


def count_term(p_obj: torch.Tensor, g_obj: torch.Tensor, p_rel: torch.Tensor, g_rel: torch.Tensor,
               cfg: SpatialThinkerConfig) -> torch.Tensor:
    """Batched C: 0.7 object term + 0.3 relation term; object term alone where g_rel = 0."""

    def term(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        p, g = p.to(F64), g.to(F64)
        return (1.0 - (p - g).abs() / g.clamp(min=1.0)).clamp(min=0.0)

    obj, rel = term(p_obj, g_obj), term(p_rel, g_rel)
    mixed = cfg.count_object_weight * obj + cfg.count_relation_weight * rel
    return torch.where(g_rel.to(F64) > 0, mixed, obj)


def label_similarity(pred_labels: Sequence[str], ref_labels: Sequence[str]) -> torch.Tensor:
    """[n, m] cosine of binary bag-of-words vectors; 0 where a label has no word."""
    sets_p, sets_r = [text.words(s) for s in pred_labels], [text.words(s) for s in ref_labels]
    vocab = sorted(set().union(*sets_p, *sets_r))
    index = {w: i for i, w in enumerate(vocab)}

    def onehot(sets: list[frozenset[str]]) -> torch.Tensor:
        m = torch.zeros(len(sets), len(vocab), dtype=F64)
        for r, s in enumerate(sets):
            m[r, [index[w] for w in s]] = 1.0
        return m

    a, b = onehot(sets_p), onehot(sets_r)
    norms = a.sum(1, keepdim=True).sqrt() * b.sum(1, keepdim=True).sqrt().T
    return torch.where(norms > 0, (a @ b.T) / norms.clamp(min=1e-300), 0.0)


def _assignment(cost: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows and columns of a minimum-cost one-to-one assignment with min(n, m) pairs."""
    n, m = cost.shape
    k = min(n, m)
    if math.perm(max(n, m), k) > MAX_ENUMERATED:
        r, c = linear_sum_assignment(cost.numpy())
        return torch.as_tensor(r), torch.as_tensor(c)
    if n <= m:
        cols = torch.tensor(list(itertools.permutations(range(m), k)), dtype=torch.int64).reshape(-1, k)
        rows = torch.arange(k).expand_as(cols)
    else:
        rows = torch.tensor(list(itertools.permutations(range(n), k)), dtype=torch.int64).reshape(-1, k)
        cols = torch.arange(k).expand_as(rows)
    best = cost[rows, cols].sum(dim=1).argmin()
    return rows[best], cols[best]


def spatial_term(pred_boxes: torch.Tensor, pred_labels: Sequence[str], ref_boxes: torch.Tensor,
                 ref_labels: Sequence[str], cfg: SpatialThinkerConfig) -> torch.Tensor:
    """S on normalised boxes: minimum-cost matching on 2(1 - sim) + (1 - q), q = (CIoU + 1) / 2; mean q."""
    if len(ref_labels) == 0:
        return torch.tensor(1.0 if len(pred_labels) == 0 else 0.0, dtype=F64)
    if len(pred_labels) == 0:
        return torch.tensor(0.0, dtype=F64)
    q = (geometry_torch.pairwise_ciou(pred_boxes, ref_boxes, cfg.ciou_eps) + 1.0) / 2.0
    cost = cfg.label_cost_weight * (1.0 - label_similarity(pred_labels, ref_labels)) + (1.0 - q)
    rows, cols = _assignment(cost)
    return q[rows, cols].sum() / len(ref_labels)


def _normalised(boxes: list, size: tuple[float, float] | None) -> torch.Tensor:
    b = torch.tensor(boxes, dtype=F64).reshape(-1, 4)
    if size is not None:
        b = b / torch.tensor([size[0], size[1], size[0], size[1]], dtype=F64)
    return b.clamp(-COORD_LIMIT, COORD_LIMIT)


def _reference(r: Rollout) -> tuple[list, list[str], int]:
    if r.scene is not None:
        objs = r.scene.get("objects", [])
        for i, o in enumerate(objs):
            box = o.get("bbox")
            if not (isinstance(box, list) and len(box) == 4 and all(
                    isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in box)):
                raise ValueError(f"reference scene.objects[{i}].bbox must be 4 finite numbers, got {box!r}")
        ids = [o.get("id") for o in objs]
        return ([o["bbox"] for o in objs], [parse_scene.id_label(i) if isinstance(i, str) else "" for i in ids],
                len(r.scene.get("relationships", [])))
    return [b.bbox for b in r.gt_boxes], [" ".join(b.label.lower().split()) for b in r.gt_boxes], 0


def score_batch(
    rollouts: Sequence[Rollout], cfg: SpatialThinkerConfig = SpatialThinkerConfig()
) -> list[dict[str, float]]:
    if not rollouts:
        return []
    parsed = [parse_scene.parse(r.completion) for r in rollouts]
    refs = [_reference(r) for r in rollouts]
    fmt = torch.tensor([float(p.format_ok) for p in parsed], dtype=F64)
    count = count_term(
        torch.tensor([len(p.objects) for p in parsed]), torch.tensor([len(ref[1]) for ref in refs]),
        torch.tensor([len(p.relationships) for p in parsed]), torch.tensor([ref[2] for ref in refs]), cfg,
    )
    acc = torch.tensor(
        [float(parse_scene.answer_matches(p.answer, parse_scene.gold_option(r.answer, r.options)))
         for p, r in zip(parsed, rollouts)], dtype=F64,
    )
    spatial = torch.zeros(len(rollouts), dtype=F64)
    for i, (p, r, ref) in enumerate(zip(parsed, rollouts, refs)):
        if p.format_ok and (acc[i] == 1 or not cfg.spatial_requires_correct):
            usable = r.image_size is not None and all(0 < float(c) < math.inf for c in r.image_size)
            size = r.image_size if usable else parse_scene.parse_image_size(r.question)
            spatial[i] = spatial_term(_normalised([o.bbox for o in p.objects], size), [o.label for o in p.objects],
                                      _normalised(ref[0], size), ref[1], cfg)
    # Lexicographic gate: F = 0 zeroes C, A and S.
    count, acc, spatial = count * fmt, acc * fmt, spatial * fmt
    reward = cfg.w_format * fmt + cfg.w_count * count + cfg.w_accuracy * acc + cfg.w_spatial * spatial
    return [
        {"reward": float(reward[i]), "format": float(fmt[i]), "count": float(count[i]),
         "accuracy": float(acc[i]), "spatial": float(spatial[i]), "pred_objects": float(len(parsed[i].objects)),
         "ref_objects": float(len(refs[i][1])), "answer_parsed": float(parsed[i].answer is not None),
         "gold_resolved": float(parse_scene.gold_option(rollouts[i].answer, rollouts[i].options) is not None)}
        for i in range(len(rollouts))
    ]
