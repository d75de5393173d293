"""The rollout record every scorer takes: one completion plus whatever its method needs to score it.

Built by the trainer from sampler output, or by `spatial-jax score` from a JSONL line (`Rollout.from_json`).
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import sys
from typing import Any

# Entropies are nats over a vocabulary: ln(V) < 30 for any real V; beyond this bound a value is a unit or data error.
ENTROPY_LIMIT = 1e6
# Entropies computed in float32 as lse - E[logit], logits tens of nats, miss by ~1e-5; below -this it is no rounding.
ENTROPY_ROUNDING = 1e-4
INT64_MAX = 2**63 - 1
FLOAT_MAX = sys.float_info.max
# Boxes one record may hold, given (gt_boxes) or predicted (box lines in its completion). Matching them costs about
# the product of the two counts (20,000 each: minutes for one line); a scene holds tens.
MAX_BOXES = 1024


class RecordError(ValueError):
    """A rollout record that cannot be scored; the message names the field."""


def brief(x: Any) -> str:
    """A bounded repr of input data for error messages: a giant string or a deeply nested list stays one short line."""
    return reprlib.repr(x)


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
    # "text": the gold is a short text scored by a normalised exact match (SPEC section 10); otherwise ("choice",
    # "number" or "" unstated) the scorers read the gold as a letter, an option index or a number (SPEC 2, 5)
    answer_type: str = ""

    @staticmethod
    def from_json(obj: Any) -> Rollout:
        """Validates one parsed JSON object; raises RecordError naming the bad field."""
        if not isinstance(obj, dict):
            raise RecordError(f"expected a JSON object, got {type(obj).__name__}")
        if "completion" not in obj or not isinstance(obj["completion"], str):
            raise RecordError("field 'completion' must be a string")
        rid = _key(obj.get("id"), "id")
        options = obj.get("options") or ()
        if not isinstance(options, (list, tuple)) or not all(isinstance(o, str) for o in options):
            raise RecordError("field 'options' must be a list of strings")
        question = obj.get("question", "")
        if not isinstance(question, str):
            raise RecordError("field 'question' must be a string")
        group = _key(obj.get("group"), "group")
        predicted = obj["completion"].count('"bbox_2d"')
        if predicted > MAX_BOXES:
            raise RecordError(f"field 'completion' holds {predicted} boxes, more than the {MAX_BOXES} a record may "
                              "hold")
        return Rollout(
            id=rid or "",
            completion=obj["completion"],
            question=question,
            options=tuple(options),
            answer=_answer(obj.get("answer")),
            gt_boxes=parse_gt_boxes(obj.get("gt_boxes")),
            trace=_trace(obj.get("token_entropies"), obj.get("token_offsets"), "token_", obj["completion"]),
            blank=_blank(obj.get("blank")),
            scene=parse_scene(obj.get("scene")),
            image_size=parse_image_size(obj.get("image_size")),
            num_generated_tokens=_opt_int(obj.get("num_generated_tokens"), "num_generated_tokens"),
            group=group,
            answer_type=_answer_type(obj.get("answer_type"), obj.get("answer")),
        )


def _key(x: Any, field: str) -> str | None:
    """An id or group: a string or an integer (kept as its decimal string), None when absent."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (str, int)):
        raise RecordError(f"field '{field}' must be a string or an integer, got {brief(x)}")
    return str(x)


def _answer(x: Any) -> str | int | float | None:
    """The gold as the scorers read it: a letter or text, an option index or a number (SPEC 2, 5), or null."""
    if x is None or isinstance(x, str):
        return x
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise RecordError(f"field 'answer' must be a string, a number or null, got {brief(x)}")
    if not math.isfinite(_number(x, "answer")):
        raise RecordError(f"field 'answer' must be finite, got {x}")
    return x


def _answer_type(x: Any, answer: Any) -> str:
    if x is None or x in ("choice", "number"):
        return x or ""
    if x != "text":
        raise RecordError(f"field 'answer_type' must be 'choice', 'number' or 'text', got {brief(x)}")
    if not isinstance(answer, str) or not answer.strip():
        raise RecordError(f"a text answer must be a non-empty string, got {brief(answer)}")
    return "text"


def _number(x: Any, field: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise RecordError(f"field '{field}' must be a number, got {brief(x)}")
    try:
        return float(x)
    except OverflowError:  # JSON integers have no size limit; floats end near 1.8e308
        raise RecordError(f"field '{field}' = {brief(x)} is beyond the range of a float") from None


def _opt_int(x: Any, field: str) -> int | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= INT64_MAX:
        raise RecordError(f"field '{field}' must be an integer in [0, 2**63 - 1], got {brief(x)}")
    return x


def parse_gt_boxes(raw: Any, require_label: bool = False) -> tuple[GTBox, ...]:
    """`[{bbox_2d (or bbox), label, validity}]` -> GTBoxes; RecordError names the bad item."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RecordError("field 'gt_boxes' must be a list")
    if len(raw) > MAX_BOXES:
        raise RecordError(f"field 'gt_boxes' holds {len(raw)} boxes, more than the {MAX_BOXES} a record may hold")
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


def _trace(ent: Any, off: Any, prefix: str, completion: str) -> TokenTrace:
    """Validates a token trace against its completion, so a trace no tokenizer emits cannot steer a reward.

    Offsets: 0 <= start <= end <= len(completion), in text order without overlap (start >= the previous end).
    Tokenizers do emit zero-width spans [k, k] (special tokens, the first bytes of a character split over byte
    tokens), and Hugging Face gives each byte token of a split character that character's one-character span, so a
    token may repeat the previous span when it is one character wide. Entropies: null (missing, kept as NaN: "no
    information"), else finite, >= 0 and <= ENTROPY_LIMIT; values in [-ENTROPY_ROUNDING, 0) are rounding and read 0.
    """
    if ent is None and off is None:
        return TokenTrace()
    if not isinstance(ent, list) or not isinstance(off, list):
        raise RecordError(f"fields '{prefix}entropies' and '{prefix}offsets' must both be lists")
    if len(ent) != len(off):
        raise RecordError(
            f"'{prefix}entropies' has {len(ent)} items but '{prefix}offsets' has {len(off)}"
        )
    # Traces run to thousands of tokens per line, so the common case is one cheap pass; from the first value that
    # fails it on, the full check runs, and says what is wrong.
    bad = next((i for i, e in enumerate(ent)
                if not (e is None or (type(e) in (float, int) and -ENTROPY_ROUNDING <= e <= ENTROPY_LIMIT))), None)
    for i in range(len(ent) if bad is None else bad, len(ent)):
        _check_entropy(ent[i], f"{prefix}entropies[{i}]")
    entropies = tuple(math.nan if e is None else 0.0 if e < 0 else float(e) for e in ent)
    n, last = len(completion), (0, 0)
    for i, o in enumerate(off):
        if type(o) not in (list, tuple) or len(o) != 2 or type(o[0]) is not int or type(o[1]) is not int:
            raise RecordError(f"field '{prefix}offsets[{i}]' must be [start, end) integers, got {brief(o)}")
        start, end = o
        if not 0 <= start <= end <= n:
            raise RecordError(f"field '{prefix}offsets[{i}]' = {brief(o)} must satisfy 0 <= start <= end <= {n} "
                              "(the completion's length)")
        if start < last[1] and not (start == last[0] and end == last[1] and end - start == 1):
            raise RecordError(f"field '{prefix}offsets[{i}]' = {brief(o)} overlaps or precedes the previous token's "
                              f"{list(last)}; tokens follow each other in the text")
        last = (start, end)
    return TokenTrace(entropies=entropies, offsets=tuple((o[0], o[1]) for o in off))


def _check_entropy(e: Any, field: str) -> None:
    if e is None:
        return
    value = _number(e, field)
    if not math.isfinite(value):
        raise RecordError(f"field '{field}' must be finite (null marks a missing entropy), got {value}")
    if value < -ENTROPY_ROUNDING:
        raise RecordError(f"field '{field}' = {value} is negative; an entropy is >= 0")
    if value > ENTROPY_LIMIT:
        # No vocabulary comes near; such values would only overflow the trajectory sums of ProSR.
        raise RecordError(f"field '{field}' = {value} is no entropy in nats (> {ENTROPY_LIMIT:g})")


def _blank(raw: Any) -> BlankRollout | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("completion"), str):
        raise RecordError("field 'blank' must be an object with a string 'completion'")
    return BlankRollout(
        completion=raw["completion"],
        trace=_trace(raw.get("token_entropies"), raw.get("token_offsets"), "blank.token_", raw["completion"]),
    )


def parse_scene(raw: Any) -> dict | None:
    """SpatialThinker's reference scene graph (SPEC 1.2), kept as given once its boxes are known to be usable:
    `objects` (default []) a list of objects whose `bbox` is 4 finite numbers, `relationships` (default []) a list."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RecordError("field 'scene' must be an object")
    objects, relations = raw.get("objects", []), raw.get("relationships", [])
    if not isinstance(objects, list) or not isinstance(relations, list):
        raise RecordError("fields 'scene.objects' and 'scene.relationships' must be lists")
    for i, obj in enumerate(objects):
        where = f"scene.objects[{i}]"
        if not isinstance(obj, dict):
            raise RecordError(f"field '{where}' must be an object")
        bbox = obj.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4:
            raise RecordError(f"field '{where}.bbox' must be 4 numbers, got {brief(bbox)}")
        if not all(math.isfinite(_number(c, f"{where}.bbox")) for c in bbox):
            raise RecordError(f"field '{where}.bbox' must be finite, got {brief(bbox)}")
    return raw


def parse_image_size(raw: Any) -> tuple[int, int] | None:
    if raw is None:
        return None
    # Kept as whole pixels, so a size below 1 would become 0 and divide the boxes by zero; scorers divide by it as
    # floats, so it must be one.
    if not isinstance(raw, (list, tuple)) or len(raw) != 2 or not all(
        isinstance(c, (int, float)) and not isinstance(c, bool) and 1 <= c <= FLOAT_MAX for c in raw
    ):
        raise RecordError(f"field 'image_size' must be [width, height] finite numbers >= 1, got {brief(raw)}")
    return (int(raw[0]), int(raw[1]))
