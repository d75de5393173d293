"""The rollout record every scorer takes: one completion plus whatever its method needs to score it.

Built by the trainer from sampler output, or by `spatial-jax score` from a JSONL line (`Rollout.from_json`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

# Entropies are nats over a vocabulary: ln(V) < 30 for any real V; beyond this bound a value is a unit or data error.
ENTROPY_LIMIT = 1e6


class RecordError(ValueError):
    """A rollout record that cannot be scored; the message names the field."""


@dataclasses.dataclass(frozen=True)
class GTBox:
    """A pseudo-ground-truth (or reference) box: [x1, y1, x2, y2], its label, its validity v in [0, 1]."""

    bbox: tuple[float, float, float, float]
    label: str
    validity: float = 1.0


@dataclasses.dataclass(frozen=True)
class TokenTrace:
    """Per-token entropies (nats, full vocabulary) and [start, end) character offsets into a completion."""

    entropies: tuple[float, ...] = ()
    offsets: tuple[tuple[int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class BlankRollout:
    """ProSR: the rollout of the same prompt on a blank image."""

    completion: str
    trace: TokenTrace = TokenTrace()


@dataclasses.dataclass(frozen=True)
class Rollout:
    id: str
    completion: str
    question: str = ""
    options: tuple[str, ...] = ()
    answer: Any = None
    gt_boxes: tuple[GTBox, ...] = ()
    trace: TokenTrace = TokenTrace()
    blank: BlankRollout | None = None
    scene: dict | None = None
    image_size: tuple[int, int] | None = None
    num_generated_tokens: int | None = None
    group: str | None = None

    @staticmethod
    def from_json(obj: Any) -> Rollout:
        """Validates one parsed JSON object; raises RecordError naming the bad field."""
        if not isinstance(obj, dict):
            raise RecordError(f"expected a JSON object, got {type(obj).__name__}")
        if "completion" not in obj or not isinstance(obj["completion"], str):
            raise RecordError("field 'completion' must be a string")
        rid = obj.get("id", "")
        options = obj.get("options") or ()
        if not isinstance(options, (list, tuple)) or not all(isinstance(o, str) for o in options):
            raise RecordError("field 'options' must be a list of strings")
        question = obj.get("question", "")
        if not isinstance(question, str):
            raise RecordError("field 'question' must be a string")
        group = obj.get("group")
        return Rollout(
            id=str(rid),
            completion=obj["completion"],
            question=question,
            options=tuple(options),
            answer=obj.get("answer"),
            gt_boxes=parse_gt_boxes(obj.get("gt_boxes")),
            trace=_trace(obj.get("token_entropies"), obj.get("token_offsets"), "token_"),
            blank=_blank(obj.get("blank")),
            scene=_scene(obj.get("scene")),
            image_size=parse_image_size(obj.get("image_size")),
            num_generated_tokens=_opt_int(obj.get("num_generated_tokens"), "num_generated_tokens"),
            group=None if group is None else str(group),
        )


def _number(x: Any, field: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise RecordError(f"field '{field}' must be a number, got {x!r}")
    return float(x)


def _opt_int(x: Any, field: str) -> int | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise RecordError(f"field '{field}' must be a non-negative integer, got {x!r}")
    return x


def parse_gt_boxes(raw: Any, require_label: bool = False) -> tuple[GTBox, ...]:
    """`[{bbox_2d (or bbox), label, validity}]` -> GTBoxes; RecordError names the bad item."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RecordError("field 'gt_boxes' must be a list")
    out = []
    for i, b in enumerate(raw):
        where = f"gt_boxes[{i}]"
        if not isinstance(b, dict):
            raise RecordError(f"field '{where}' must be an object")
        bbox = b.get("bbox_2d", b.get("bbox"))
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
            raise RecordError(f"field '{where}.bbox_2d' must be 4 numbers")
        coords = tuple(_number(c, f"{where}.bbox_2d") for c in bbox)
        if not all(math.isfinite(c) for c in coords):
            raise RecordError(f"field '{where}.bbox_2d' must be finite")
        label = b.get("label", "")
        if not isinstance(label, str) or (require_label and not label.strip()):
            raise RecordError(f"field '{where}.label' must be a {'non-empty ' if require_label else ''}string")
        v = _number(b.get("validity", 1.0), f"{where}.validity")
        if not (0.0 <= v <= 1.0):
            raise RecordError(f"field '{where}.validity' must lie in [0, 1], got {v}")
        out.append(GTBox(bbox=coords, label=label, validity=v))  # type: ignore[arg-type]
    return tuple(out)


def _trace(ent: Any, off: Any, prefix: str) -> TokenTrace:
    if ent is None and off is None:
        return TokenTrace()
    if not isinstance(ent, list) or not isinstance(off, list):
        raise RecordError(f"fields '{prefix}entropies' and '{prefix}offsets' must both be lists")
    if len(ent) != len(off):
        raise RecordError(
            f"'{prefix}entropies' has {len(ent)} items but '{prefix}offsets' has {len(off)}"
        )
    entropies = []
    for i, e in enumerate(ent):
        # A missing or non-finite entropy is kept as NaN: the scorer treats it as "no information".
        if e is None:
            entropies.append(float("nan"))
            continue
        value = _number(e, f"{prefix}entropies")
        if math.isfinite(value) and abs(value) > ENTROPY_LIMIT:
            # No vocabulary comes near; such values would only overflow the trajectory sums of ProSR.
            raise RecordError(f"field '{prefix}entropies[{i}]' = {value} is no entropy in nats "
                              f"(|value| > {ENTROPY_LIMIT:g})")
        entropies.append(value)
    offsets = []
    for i, o in enumerate(off):
        if (
            not isinstance(o, (list, tuple))
            or len(o) != 2
            or not all(isinstance(c, int) and not isinstance(c, bool) for c in o)
            or not 0 <= o[0] <= o[1]
        ):
            raise RecordError(f"field '{prefix}offsets[{i}]' must be [start, end) integers, 0 <= start <= end, "
                              f"got {o!r}")
        offsets.append((int(o[0]), int(o[1])))
    return TokenTrace(entropies=tuple(entropies), offsets=tuple(offsets))


def _blank(raw: Any) -> BlankRollout | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("completion"), str):
        raise RecordError("field 'blank' must be an object with a string 'completion'")
    return BlankRollout(
        completion=raw["completion"],
        trace=_trace(raw.get("token_entropies"), raw.get("token_offsets"), "blank.token_"),
    )


def _scene(raw: Any) -> dict | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RecordError("field 'scene' must be an object")
    return raw


def parse_image_size(raw: Any) -> tuple[int, int] | None:
    if raw is None:
        return None
    if (
        not isinstance(raw, (list, tuple))
        or len(raw) != 2
        or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and 1 <= c < math.inf for c in raw)
    ):
        # Kept as whole pixels, so a size below 1 would become 0 and divide the boxes by zero.
        raise RecordError(f"field 'image_size' must be [width, height] finite numbers >= 1, got {raw!r}")
    return (int(raw[0]), int(raw[1]))
