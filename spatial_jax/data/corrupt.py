"""The pseudo-GT corruption test (SpatialCORE A.3, SPEC 2) on any dataset with boxes.

Exactly round(fraction x total boxes) boxes of the whole dataset (half rounds up), drawn uniformly without
replacement, each get one corruption drawn uniformly: removed; relabelled with another valid label of the same sample
(validity > 0, a different label once lower-cased; a sample with no such label gets one of the two other kinds
instead); or displaced to integer coordinates inside [0, 1000], non-degenerate, with IoU < displace_iou against the
original (moved at its own size when that can reach the bound, shrunk as well when the box is too large to). Every
draw comes from one generator seeded by `seed`, in dataset order, so a seed fixes the output. Each corrupted sample
records what was done in meta["corruption"] (appended to a list already there).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from spatial_jax.config import check_non_negative, check_range
from spatial_jax.data.sample import Sample
from spatial_jax.data.synthetic import iou
from spatial_jax.records import GTBox

NORM = 1000
KINDS = ("removed", "relabelled", "displaced")
# Same-size moves tried before shrinking too: a box moves below the bound in a few draws unless it is too large.
_MOVE_TRIES = 200
_SHRINK_TRIES = 100


@dataclasses.dataclass(frozen=True)
class CorruptConfig:
    """fraction: share of all boxes corrupted (A.3: 0.4). displace_iou: a displaced box's IoU with its original stays
    below it (A.3: 0.6). seed: the generator's seed."""

    fraction: float = 0.4
    seed: int = 0
    displace_iou: float = 0.6

    def __post_init__(self):
        check_range(self, "fraction", 0, 1)
        check_non_negative(self, "seed")  # numpy seeds are non-negative
        check_range(self, "displace_iou", 0, 1, low_open=True, high_open=True)


def displace(rng: np.random.Generator, box: Sequence[float], max_iou: float) -> tuple[int, int, int, int]:
    """A non-degenerate integer box inside [0, NORM] with IoU < max_iou against `box`: the same size moved; a box too
    large for that is also shrunk, each side by a factor under sqrt(max_iou), which bounds the IoU below max_iou
    wherever it lands (IoU <= the area ratio)."""
    w = int(min(NORM, max(1, round(box[2] - box[0]))))
    h = int(min(NORM, max(1, round(box[3] - box[1]))))
    for attempt in range(_MOVE_TRIES + _SHRINK_TRIES):
        nw, nh = w, h
        if attempt >= _MOVE_TRIES:
            nw = max(1, int(w * math.sqrt(max_iou) * rng.uniform(0.25, 1.0)))
            nh = max(1, int(h * math.sqrt(max_iou) * rng.uniform(0.25, 1.0)))
        x = int(rng.integers(0, NORM - nw + 1))
        y = int(rng.integers(0, NORM - nh + 1))
        moved = (x, y, x + nw, y + nh)
        if iou(moved, box) < max_iou:
            return moved
    raise ValueError(f"cannot displace box {list(box)} to IoU < {max_iou} inside the [0, {NORM}] frame")


def _plain(c: float) -> int | float:
    return int(c) if float(c).is_integer() else float(c)


def _norm_label(label: str) -> str:
    return " ".join(label.lower().split())


def _corrupt_sample(rng: np.random.Generator, s: Sample, chosen: list[int], cfg: CorruptConfig,
                    counts: dict[str, int]) -> Sample:
    boxes: list[GTBox | None] = list(s.gt_boxes)
    records = []
    for j in chosen:
        box = s.gt_boxes[j]
        record: dict[str, Any] = {"index": j, "label": box.label, "box": [_plain(c) for c in box.bbox]}
        kind = KINDS[int(rng.integers(len(KINDS)))]
        if kind == "relabelled":
            others = list(dict.fromkeys(
                b.label for b in s.gt_boxes if b.validity > 0 and _norm_label(b.label) != _norm_label(box.label)))
            if others:
                record["new_label"] = others[int(rng.integers(len(others)))]
                boxes[j] = dataclasses.replace(box, label=record["new_label"])
            else:
                kind = ("removed", "displaced")[int(rng.integers(2))]
                record["instead_of"] = "relabelled"
                counts["relabel_fallbacks"] += 1
        if kind == "removed":
            boxes[j] = None
        elif kind == "displaced":
            try:
                moved = displace(rng, box.bbox, cfg.displace_iou)
            except ValueError as e:
                raise s.error(f"gt_boxes[{j}]: {e}") from None
            record["new_box"] = list(moved)
            record["iou"] = round(iou(moved, box.bbox), 4)
            boxes[j] = dataclasses.replace(box, bbox=tuple(float(c) for c in moved))
        record["kind"] = kind
        counts[kind] += 1
        records.append(record)
    history = s.meta.get("corruption", [])
    if not isinstance(history, list):
        raise s.error(f"meta.corruption must be a list to add to, got {type(history).__name__}")
    meta = {**s.meta, "corruption": history + records}
    return dataclasses.replace(s, gt_boxes=tuple(b for b in boxes if b is not None), meta=meta)


def corrupt(samples: Sequence[Sample], cfg: CorruptConfig = CorruptConfig()) -> tuple[list[Sample], dict[str, Any]]:
    """The corrupted samples (input order; untouched samples are returned as they are) and a report of what
    changed: totals, counts per kind, relabels that fell back to another kind, samples changed."""
    slots = [(i, j) for i, s in enumerate(samples) for j in range(len(s.gt_boxes))]
    n = math.floor(cfg.fraction * len(slots) + 0.5)
    rng = np.random.default_rng(cfg.seed)
    picked: dict[int, list[int]] = {}
    for k in sorted(int(k) for k in rng.choice(len(slots), size=n, replace=False)):
        i, j = slots[k]
        picked.setdefault(i, []).append(j)
    counts = {kind: 0 for kind in KINDS} | {"relabel_fallbacks": 0}
    out = [_corrupt_sample(rng, s, picked[i], cfg, counts) if i in picked else s for i, s in enumerate(samples)]
    report = {
        "samples": len(samples),
        "boxes": len(slots),
        "fraction": cfg.fraction,
        "seed": cfg.seed,
        "corrupted": n,
        "by_kind": {kind: counts[kind] for kind in KINDS},
        "relabel_fallbacks": counts["relabel_fallbacks"],
        "samples_changed": len(picked),
        "boxes_after": sum(len(s.gt_boxes) for s in out),
    }
    return out, report
