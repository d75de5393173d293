"""SpatialThinker output parser (SPEC 1.2, 4 F): tags, scene-graph JSON, answer; never raises on any string.

`<observe>...</observe><scene>{JSON}</scene><think>...</think><answer>(B) behind</answer>`; the scene lists objects
`{"id": "car.1", "bbox": [x1, y1, x2, y2]}` (pixels of the image size the prompt states) and relationships
`{"subject": "car.1", "predicate": "left of", "object": "tree.2"}`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

TAGS = ("observe", "scene", "think", "answer")
ID_PATTERN = re.compile(r"[a-zA-Z_]+\.\d+")
_IMAGE_SIZE = re.compile(
    r"image\s*size\s*:?\s*\(?\s*(\d+(?:\.\d+)?)\s*(?:x|×|\*|,)\s*(\d+(?:\.\d+)?)\s*\)?", re.IGNORECASE
)
_LETTER_OPTION = re.compile(r"^\(\s*([A-Za-z])\s*\)\s*(.*)$", re.DOTALL)
_BARE_LETTER = re.compile(r"^\(?\s*([a-z])\s*\)?\.?$")


@dataclasses.dataclass(frozen=True)
class SceneObject:
    """One scene-graph object; `label` is the id's category ("traffic_light.2" -> "traffic light")."""

    id: str
    bbox: tuple[float, float, float, float]
    label: str


@dataclasses.dataclass(frozen=True)
class Relation:
    subject: str
    predicate: str
    object: str


@dataclasses.dataclass(frozen=True)
class ParsedScene:
    """Everything F, C, A and S need from one completion.

    `objects`/`relationships` hold the entries that passed their checks; `errors` names every failed check, so
    `format_ok` (F = 1) is simply "no errors".
    """

    tag_counts: tuple[tuple[str, int, int], ...]
    observe: str | None
    scene_text: str | None
    think: str | None
    answer: str | None
    objects: tuple[SceneObject, ...]
    relationships: tuple[Relation, ...]
    errors: tuple[str, ...]

    @property
    def format_ok(self) -> bool:
        return not self.errors


def id_label(object_id: str) -> str:
    """The category part of an id, underscores read as spaces: "traffic_light.2" -> "traffic light"."""
    head = object_id.rsplit(".", 1)[0] if "." in object_id else object_id
    return " ".join(head.replace("_", " ").lower().split())


def _tag_content(text: str, tag: str) -> str | None:
    """Text between the first `<tag>` and the next `</tag>`; None when either is missing."""
    start = text.find(f"<{tag}>")
    if start < 0:
        return None
    start += len(tag) + 2
    end = text.find(f"</{tag}>", start)
    return None if end < 0 else text[start:end]


def _tag_errors(text: str) -> tuple[tuple[tuple[str, int, int], ...], list[str]]:
    counts = []
    errors = []
    positions = []
    for tag in TAGS:
        n_open, n_close = text.count(f"<{tag}>"), text.count(f"</{tag}>")
        counts.append((tag, n_open, n_close))
        if n_open != 1 or n_close != 1:
            errors.append(f"<{tag}> appears {n_open} time(s) and </{tag}> {n_close} time(s); need once each")
        else:
            positions += [text.find(f"<{tag}>"), text.find(f"</{tag}>")]
    if not errors and positions != sorted(positions):
        errors.append("tags are not in the order observe, scene, think, answer")
    return tuple(counts), errors


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _load_json(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text, parse_constant=_reject_constant), None
    except (ValueError, RecursionError) as e:
        return None, f"scene is not valid JSON ({type(e).__name__})"


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        f = float(x)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _bbox(raw: Any) -> tuple[float, float, float, float] | None:
    """4 finite numbers with x2 > x1 and y2 > y1 (SPEC 4 F), else None."""
    if not isinstance(raw, list) or len(raw) != 4:
        return None
    nums = [_number(c) for c in raw]
    if any(c is None for c in nums):
        return None
    x1, y1, x2, y2 = nums  # type: ignore[misc]
    if not (x2 > x1 and y2 > y1):
        return None
    return (x1, y1, x2, y2)


def _objects(raw: Any, errors: list[str]) -> tuple[SceneObject, ...]:
    if not isinstance(raw, list):
        errors.append("scene 'objects' is not a list")
        return ()
    out = []
    seen: set[str] = set()
    for i, obj in enumerate(raw):
        if not isinstance(obj, dict) or "id" not in obj or "bbox" not in obj:
            errors.append(f"objects[{i}] is not an object with keys id and bbox")
            continue
        oid = obj["id"]
        if not isinstance(oid, str) or not ID_PATTERN.fullmatch(oid):
            errors.append(f"objects[{i}].id {oid!r} does not match {ID_PATTERN.pattern}")
            continue
        if oid in seen:
            errors.append(f"objects[{i}].id {oid!r} is repeated")
            continue
        seen.add(oid)
        box = _bbox(obj["bbox"])
        if box is None:
            errors.append(f"objects[{i}].bbox is not 4 numbers with x2 > x1 and y2 > y1")
            continue
        out.append(SceneObject(id=oid, bbox=box, label=id_label(oid)))
    return tuple(out)


def _relations(raw: Any, ids: set[str], errors: list[str]) -> tuple[Relation, ...]:
    if not isinstance(raw, list):
        errors.append("scene 'relationships' is not a list")
        return ()
    out = []
    for i, rel in enumerate(raw):
        fields = [rel.get(k) for k in ("subject", "predicate", "object")] if isinstance(rel, dict) else []
        if len(fields) != 3 or not all(isinstance(f, str) for f in fields):
            errors.append(f"relationships[{i}] needs string subject, predicate and object")
            continue
        missing = [f for f in (fields[0], fields[2]) if f not in ids]
        if missing:
            errors.append(f"relationships[{i}] refers to unknown id(s) {missing}")
            continue
        out.append(Relation(subject=fields[0], predicate=fields[1], object=fields[2]))
    return tuple(out)


def parse(completion: Any) -> ParsedScene:
    """Parses one SpatialThinker completion; a non-string is read as an empty completion."""
    text = completion if isinstance(completion, str) else ""
    counts, errors = _tag_errors(text)
    scene_text = _tag_content(text, "scene")
    objects: tuple[SceneObject, ...] = ()
    relations: tuple[Relation, ...] = ()
    if scene_text is None:
        errors.append("no <scene>...</scene> block")
    else:
        data, err = _load_json(scene_text.strip())
        if err is not None:
            errors.append(err)
        elif not isinstance(data, dict):
            errors.append("scene JSON is not an object")
        else:
            objects = _objects(data.get("objects"), errors)
            # Relations may only name ids that exist and passed their own checks.
            relations = _relations(data.get("relationships"), {o.id for o in objects}, errors)
    return ParsedScene(
        tag_counts=counts,
        observe=_tag_content(text, "observe"),
        scene_text=scene_text,
        think=_tag_content(text, "think"),
        answer=_tag_content(text, "answer"),
        objects=objects,
        relationships=relations,
        errors=tuple(errors),
    )


_OPTION_LABEL = re.compile(r"\(([A-Za-z]|\d+)\)")


def final_answer(completion: str) -> str | None:
    """SpatialThinker's final answer (SPEC 1.2): its `<answer>` tag, stripped, where an option written `(B) behind`
    is its label `B` (the label alone is what a benchmark asked for); None without the tag or with it empty."""
    text = _tag_content(completion if isinstance(completion, str) else "", "answer")
    text = text.strip() if text is not None else ""
    label = _OPTION_LABEL.match(text)
    return (label.group(1) if label else text) or None


def parse_image_size(prompt: Any) -> tuple[float, float] | None:
    """(W, H) from the prompt's "Image size: (W x H)"; None when absent or not positive."""
    if not isinstance(prompt, str):
        return None
    m = _IMAGE_SIZE.search(prompt)
    if m is None:
        return None
    w, h = float(m.group(1)), float(m.group(2))
    return (w, h) if w > 0 and h > 0 and math.isfinite(w) and math.isfinite(h) else None


def normalise_answer(text: str) -> str:
    """SPEC 4 A: stripped, lower-cased, whitespace runs collapsed to one space."""
    return " ".join(text.lower().split())


def gold_option(answer: Any, options: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """(letter, "(x) option text") of the gold answer, both lower-case; None when it cannot be read.

    The gold may be "(B) behind", a bare letter "B" or "(B)" (its text then comes from `options`, which may
    themselves start with "(B)"), or an option's text.
    """
    if not isinstance(answer, str) or not answer.strip():
        return None
    gold = normalise_answer(answer)
    opts = [normalise_answer(o) for o in options if isinstance(o, str)]
    # A bare letter first: "(B)" names option B, whose text comes from `options`, as "B" does.
    bare = _BARE_LETTER.match(gold)
    if bare:
        letter = bare.group(1)
        index = ord(letter) - ord("a")
        if 0 <= index < len(opts):
            return letter, _with_letter(opts[index], letter)
        return letter, f"({letter})"
    m = _LETTER_OPTION.match(gold)
    if m:
        return m.group(1), f"({m.group(1)}) {m.group(2)}".strip()
    for i, opt in enumerate(opts):
        om = _LETTER_OPTION.match(opt)
        text_only = om.group(2).strip() if om else opt
        if gold in (opt, text_only) and i < 26:
            letter = om.group(1) if om else chr(ord("a") + i)
            return letter, _with_letter(opt, letter)
    return None


def _with_letter(option: str, letter: str) -> str:
    return option if _LETTER_OPTION.match(option) else f"({letter}) {option}".strip()


def answer_matches(predicted: str | None, gold: tuple[str, str] | None) -> bool:
    """SPEC 4 A: exact match with the gold "(x) text", or a bare letter ("b", "(b)", "b.") naming the gold."""
    if predicted is None or gold is None:
        return False
    pred = normalise_answer(predicted)
    if pred == gold[1]:
        return True
    bare = _BARE_LETTER.match(pred)
    return bare is not None and bare.group(1) == gold[0]
