"""SpatialThinker dense reward (SPEC 4; SpatialThinker §3.1, App. C): R = 0.1 F + 0.2 C + 0.5 A + 0.2 S.

F = 0 zeroes C, A and S (lexicographic gate) and S counts only when A = 1, so R lies in [0, 1]; S itself lies in
(-0.25, 1] because CIoU > -1.5.

Choices the paper leaves open, settled here:
- The reference is `rollout.scene` ({"objects": [{"id", "bbox"}], "relationships": [...]}, pixel boxes, labels
  from the ids) when given, else `rollout.gt_boxes` (no relations). Predicted labels come from the ids too
  ("traffic_light.2" -> "traffic light").
- Boxes are divided by the image size (`rollout.image_size` when positive and finite, else "Image size: (W x H)"
  in `rollout.question`, else left in pixels) and the normalised coordinates clipped to
  [-COORD_LIMIT, COORD_LIMIT], so absurd coordinates give a finite CIoU instead of an overflow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from spatial_jax.config import check_non_negative, check_positive, require
from spatial_jax.records import RecordError, Rollout
from spatial_jax.rewards import geometry, matching, parse_scene, text
from spatial_jax.rewards.advantages import AdvantageConfig

# Far beyond any real box in pixels or image fractions, small enough that squared extents cannot overflow.
COORD_LIMIT = 1e6


@dataclasses.dataclass(frozen=True)
class SpatialThinkerConfig:
    # R = w_format F + w_count C + w_accuracy A + w_spatial S (SPEC 4).
    w_format: float = 0.1
    w_count: float = 0.2
    w_accuracy: float = 0.5
    w_spatial: float = 0.2
    count_object_weight: float = 0.7
    count_relation_weight: float = 0.3
    label_cost_weight: float = 2.0  # matching cost 2 (1 - sim) + (1 - (CIoU + 1) / 2)
    ciou_eps: float = 1e-7
    spatial_requires_correct: bool = True  # False: S for every well-formed answer (ungated variant, App. C.1)
    advantage: AdvantageConfig = AdvantageConfig()  # eq. 2 (GRPO group advantages)

    def __post_init__(self) -> None:
        check_non_negative(self, "w_format", "w_count", "w_accuracy", "w_spatial", "count_object_weight",
                           "count_relation_weight", "label_cost_weight")
        require("count_relation_weight", self.count_relation_weight,
                abs(self.count_object_weight + self.count_relation_weight - 1.0) <= 1e-9,
                "equal 1 - count_object_weight")
        check_positive(self, "ciou_eps")


@dataclasses.dataclass(frozen=True)
class Reference:
    """Reference scene: pixel boxes [m, 4], labels, and the number of relations (None when there are none)."""

    boxes: np.ndarray
    labels: tuple[str, ...]
    n_relations: int | None


def _ref_box(raw: Any, where: str) -> tuple[float, ...]:
    if not isinstance(raw, (list, tuple)) or len(raw) != 4:
        raise RecordError(f"field '{where}' must be 4 numbers, got {raw!r}")
    out = []
    for c in raw:
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c):
            raise RecordError(f"field '{where}' must be 4 finite numbers, got {raw!r}")
        out.append(float(c))
    return tuple(out)


def reference(rollout: Rollout) -> Reference:
    """The rollout's reference scene; raises RecordError naming a malformed `scene` field."""
    if rollout.scene is not None:
        objects = rollout.scene.get("objects", [])
        rels = rollout.scene.get("relationships", [])
        if not isinstance(objects, list) or not isinstance(rels, list):
            raise RecordError("fields 'scene.objects' and 'scene.relationships' must be lists")
        boxes, labels = [], []
        for i, obj in enumerate(objects):
            if not isinstance(obj, dict):
                raise RecordError(f"field 'scene.objects[{i}]' must be an object")
            boxes.append(_ref_box(obj.get("bbox"), f"scene.objects[{i}].bbox"))
            oid = obj.get("id")
            labels.append(parse_scene.id_label(oid) if isinstance(oid, str) else "")
        return Reference(np.asarray(boxes, dtype=np.float64).reshape(-1, 4), tuple(labels), len(rels) or None)
    boxes = np.asarray([b.bbox for b in rollout.gt_boxes], dtype=np.float64).reshape(-1, 4)
    return Reference(boxes, tuple(text.normalise_label(b.label) for b in rollout.gt_boxes), None)


def image_size(rollout: Rollout) -> tuple[float, float] | None:
    """`rollout.image_size` when it is a usable size (finite, positive), else the one stated in the question."""
    if rollout.image_size is not None:
        w, h = (float(c) for c in rollout.image_size)
        if 0 < w < math.inf and 0 < h < math.inf:
            return (w, h)
    return parse_scene.parse_image_size(rollout.question)


def normalise_boxes(boxes: np.ndarray, size: tuple[float, float] | None) -> np.ndarray:
    """Pixels -> fractions of the stated image size, clipped to +-COORD_LIMIT."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if size is not None:
        b = b / np.array([size[0], size[1], size[0], size[1]], dtype=np.float64)
    return np.clip(b, -COORD_LIMIT, COORD_LIMIT)


def count_score(n_pred_obj: int, n_ref_obj: int, n_pred_rel: int, n_ref_rel: int | None,
                cfg: SpatialThinkerConfig) -> float:
    """SPEC 4 C: 0.7 object term + 0.3 relation term; the object term alone when the reference has no relations."""

    def term(p: int, g: int) -> float:
        return max(0.0, 1.0 - abs(p - g) / max(g, 1))

    objects = term(n_pred_obj, n_ref_obj)
    if not n_ref_rel:
        return objects
    return cfg.count_object_weight * objects + cfg.count_relation_weight * term(n_pred_rel, n_ref_rel)


def spatial_score(pred_boxes: np.ndarray, pred_labels: Sequence[str], ref_boxes: np.ndarray,
                  ref_labels: Sequence[str], cfg: SpatialThinkerConfig) -> float:
    """SPEC 4 S on normalised boxes: Hungarian on 2(1 - sim) + (1 - q), q = (CIoU + 1) / 2; mean q over references."""
    n_pred, n_ref = len(pred_labels), len(ref_labels)
    if n_ref == 0:
        return 1.0 if n_pred == 0 else 0.0
    if n_pred == 0:
        return 0.0
    q = (geometry.pairwise_ciou(pred_boxes, ref_boxes, cfg.ciou_eps) + 1.0) / 2.0
    sim = np.array([[text.label_similarity(a, b) for b in ref_labels] for a in pred_labels], dtype=np.float64)
    cost = cfg.label_cost_weight * (1.0 - sim) + (1.0 - q)
    return float(sum(q[j, k] for j, k in matching.min_cost_matching(cost)) / n_ref)


def score(rollout: Rollout, cfg: SpatialThinkerConfig = SpatialThinkerConfig()) -> dict[str, float]:
    """Dense reward of one rollout: "reward", its components F ("format"), C, A, S, and parse diagnostics."""
    parsed = parse_scene.parse(rollout.completion)
    ref = reference(rollout)
    fmt = float(parsed.format_ok)
    text_gold = rollout.answer_type == "text"
    gold = rollout.answer if text_gold else parse_scene.gold_option(rollout.answer, rollout.options)
    count = accuracy = spatial = 0.0
    if parsed.format_ok:
        count = count_score(len(parsed.objects), len(ref.labels), len(parsed.relationships), ref.n_relations, cfg)
        # a text gold is matched by SPEC section 10's normalised form; an option by SPEC 4 A
        accuracy = (text.short_answer_score(parsed.answer, gold) if text_gold
                    else float(parse_scene.answer_matches(parsed.answer, gold)))
        if accuracy == 1.0 or not cfg.spatial_requires_correct:
            size = image_size(rollout)
            spatial = spatial_score(
                normalise_boxes(np.array([o.bbox for o in parsed.objects]), size),
                [o.label for o in parsed.objects],
                normalise_boxes(ref.boxes, size),
                ref.labels,
                cfg,
            )
    reward = cfg.w_format * fmt + cfg.w_count * count + cfg.w_accuracy * accuracy + cfg.w_spatial * spatial
    return {
        "reward": reward,
        "format": fmt,
        "count": count,
        "accuracy": accuracy,
        "spatial": spatial,
        "pred_objects": float(len(parsed.objects)),
        "ref_objects": float(len(ref.labels)),
        "answer_parsed": float(parsed.answer is not None),
        "gold_resolved": float(gold is not None),
    }


def score_batch(
    rollouts: Sequence[Rollout], cfg: SpatialThinkerConfig = SpatialThinkerConfig()
) -> list[dict[str, float]]:
    return [score(r, cfg) for r in rollouts]
