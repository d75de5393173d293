"""What a sample says about its scene beyond the image: pseudo-GT boxes (noise growing as validity falls, and the
A.3 corruptions), the reference scene graph and completions (one per method's output format), the biased annotator
(mirror_colors) and the language prior (prior_colors)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np

from spatial_jax.data.prompts import HARNESS, SCENE_GRAPH, THINK_BOXES, THINK_LETTER
from spatial_jax.data.sample import LETTERS, Sample, format_number
from spatial_jax.data.synthetic.questions import draw
from spatial_jax.data.synthetic.world import (
    BOX_LEAD,
    CORRUPTIONS,
    NORM,
    PREDICATES,
    SPLITS,
    Question,
    SceneObject,
    SyntheticConfig,
    iou,
    to_norm,
)
from spatial_jax.records import GTBox


def pseudo_gt(
    rng: np.random.Generator, objects: Sequence[SceneObject], relevant: Sequence[int], cfg: SyntheticConfig
) -> tuple[tuple[GTBox, ...], tuple[dict, ...]]:
    """Noisy normalised boxes for the relevant objects, then the A.3 corruption.

    Returns (boxes, one record per relevant object: its label, its box before corruption and the corruption kind)."""
    boxes: list[GTBox] = []
    kinds: list[dict] = []
    for i in relevant:
        o = objects[i]
        clean = to_norm(o.bbox, cfg.width, cfg.height)
        v = float(rng.uniform(cfg.min_validity, 1.0))
        box = _jitter(rng, clean, cfg.box_noise * (1.0 - v))
        box_before = box
        label = o.label
        kind = "none"
        if rng.random() < cfg.corrupt_fraction:
            kind = CORRUPTIONS[int(rng.integers(len(CORRUPTIONS)))]
            others = [p.label for p in objects if p.label != label]
            if kind == "relabelled" and not others:
                kind = "displaced"
            if kind == "relabelled":
                label = others[int(rng.integers(len(others)))]
            elif kind == "displaced":
                box = displace(rng, box, cfg.displace_iou)
        kinds.append({"label": o.label, "box": list(box_before), "kind": kind})
        if kind != "removed":
            boxes.append(GTBox(bbox=tuple(float(c) for c in box), label=label, validity=round(v, 4)))  # type: ignore[arg-type]
    return tuple(boxes), tuple(kinds)


def _jitter(rng: np.random.Generator, box: Sequence[int], scale: float) -> tuple[int, int, int, int]:
    """Each coordinate moved by N(0, (scale * side)^2), kept inside the frame with x2 > x1 and y2 > y1."""
    x1, y1, x2, y2 = box
    sx = scale * (x2 - x1)
    sy = scale * (y2 - y1)
    n = rng.normal(size=4)
    x1, x2 = _ordered(x1 + n[0] * sx, x2 + n[2] * sx)
    y1, y2 = _ordered(y1 + n[1] * sy, y2 + n[3] * sy)
    return (x1, y1, x2, y2)


def _ordered(lo: float, hi: float) -> tuple[int, int]:
    a = min(max(int(round(lo)), 0), NORM)
    b = min(max(int(round(hi)), 0), NORM)
    if b <= a:
        a, b = (a, a + 1) if a < NORM else (NORM - 1, NORM)
    return a, b


def displace(rng: np.random.Generator, box: Sequence[int], max_iou: float) -> tuple[int, int, int, int]:
    """The same-size box moved inside the frame until its IoU with the original is below max_iou (A.3)."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1, y2 - y1
    for _ in range(1000):
        nx = int(rng.integers(0, NORM - w + 1))
        ny = int(rng.integers(0, NORM - h + 1))
        moved = (nx, ny, nx + w, ny + h)
        if iou(moved, box) < max_iou:
            return moved
    raise RuntimeError(f"cannot displace box {box} to IoU < {max_iou} inside the [0, {NORM}] frame")


# ---------------------------------------------------------------- scene graph and reference completions


def object_id(objects: Sequence[SceneObject], i: int) -> str:
    """SpatialThinker id `red_circle.3`: the label with `_` for spaces, then the object's 1-based scene index."""
    return f"{objects[i].label.replace(' ', '_')}.{i + 1}"


def scene_graph(objects: Sequence[SceneObject], q: Question) -> dict:
    """The SpatialThinker reference: the question's objects (pixel boxes) and the relations its answer rests on."""
    present = list(dict.fromkeys(q.relevant))
    return {
        "objects": [{"id": object_id(objects, i), "bbox": list(objects[i].bbox)} for i in present],
        "relationships": [
            {"subject": object_id(objects, s), "predicate": p, "object": object_id(objects, o)}
            for s, p, o in q.relations
        ],
    }


def _fmt_center(o: SceneObject, frame) -> str:
    x1, y1, x2, y2 = frame(o.bbox)
    return f"({int(round((x1 + x2) / 2))}, {int(round((y1 + y2) / 2))})"


def _reasoning(objects: Sequence[SceneObject], q: Question, frame) -> str:
    """A short correct argument from the scene, coordinates written in `frame` (normalised or pixels): each answer
    follows from the positions or sizes it quotes, which the boxes written before it give."""
    kind, p = q.reasoning
    if kind == "relative":
        i, j, d = p
        a, b = objects[i], objects[j]
        axis = "x" if d in ("left", "right") else "y"
        return (f"Centres: {a.label} {_fmt_center(a, frame)}, {b.label} {_fmt_center(b, frame)}. "
                f"The {axis} gap dominates: the {a.label} is {PREDICATES[d]} the {b.label}.")
    if kind == "size":
        chosen, which, best = p
        parts = ", ".join(f"{objects[i].label} {_side(objects[i], frame)}" for i in chosen)
        return f"Widths: {parts}. The {which} is the {objects[best].label}."
    if kind == "nearest":
        ref, present, nearest = p
        r = objects[ref]
        parts = ", ".join(f"{objects[i].label} {_fmt_center(objects[i], frame)}" for i in present)
        return f"Centres: {r.label} {_fmt_center(r, frame)}; {parts}. The closest is the {objects[nearest].label}."
    if kind == "counting":
        members, count = p
        names = ", ".join(objects[i].label for i in members)
        return f"Matching: {names}. Count: {count}."
    i, j, answer = p
    a, b = objects[i], objects[j]
    (ax, ay), (bx, by) = a.center, b.center
    return (
        f"In pixels the {a.label} is centred at ({format_number(ax)}, {format_number(ay)}) and the {b.label} at "
        f"({format_number(bx)}, {format_number(by)}). The distance is about {format_number(answer)} pixels."
    )


def _side(o: SceneObject, frame) -> int:
    x1, _, x2, _ = frame(o.bbox)
    return int(x2 - x1)


def _observation(objects: Sequence[SceneObject]) -> str:
    names = ", ".join(f"{'an' if o.label[0] in 'aeiou' else 'a'} {o.label}" for o in objects)
    return f"The image shows {len(objects)} objects: {names}."


def reference_completions(
    objects: Sequence[SceneObject], q: Question, scene: dict, cfg: SyntheticConfig
) -> dict[str, str]:
    """One target completion per method's output format (SPEC 1.1-1.3), from the clean scene."""
    norm = lambda b: to_norm(b, cfg.width, cfg.height)
    pix = lambda b: b
    final = q.answer if isinstance(q.answer, str) else format_number(q.answer)
    boxed = list(dict.fromkeys(q.relevant))
    if cfg.box_order == "reading":
        boxed.sort(key=lambda i: objects[i].center[::-1])
    box_lines = "".join(
        json.dumps({"bbox_2d": list(norm(objects[i].bbox)), "label": objects[i].label}) + "\n" for i in boxed
    )
    core = f"{box_lines}{BOX_LEAD}\n{_reasoning(objects, q, norm)}\n</think>\n{final}"
    # ProSR: reasoning, then one letter; boxes only as text of the reasoning when the world asks for them
    letter_only = core if cfg.letter_reasoning == "boxes" else f"{_reasoning(objects, q, norm)}\n</think>\n{final}"
    if isinstance(q.answer, str):
        answer_text = f"({q.answer}) {q.options[LETTERS.index(q.answer)]}"
    else:
        answer_text = final
    thinker = (
        f"<observe>\n{_observation(objects)}\n</observe>\n"
        f"<scene>\n{json.dumps(scene)}\n</scene>\n"
        f"<think>\n{_reasoning(objects, q, pix)}\n</think>\n"
        f"<answer>{answer_text}</answer>"
    )
    allo = (
        f"Step1: Visual Clues\n{_observation(objects)} {_reasoning(objects, q, pix)}\n"
        f"Step5: Final Answer\n<Answer>{final}</Answer>"
    )
    return {THINK_BOXES.reference_key: core, THINK_LETTER.reference_key: letter_only,
            SCENE_GRAPH.reference_key: thinker, HARNESS.reference_key: allo}


# ---------------------------------------------------------------- the biased annotator (mirror_colors)


def mirrored_scene(objects: Sequence[SceneObject], width: int) -> list[SceneObject]:
    return [dataclasses.replace(o, bbox=(width - o.bbox[2], o.bbox[1], width - o.bbox[0], o.bbox[3])) for o in objects]


def mirrored_question(q: Question) -> Question:
    """The question as the mirrored scene answers it: only a left/right relation changes (size, nearest, counting
    and distance do not depend on the side)."""
    if q.reasoning[0] != "relative":
        return q
    i, j, d = q.reasoning[1]
    d = {"left": "right", "right": "left"}.get(d, d)
    return dataclasses.replace(q, answer=LETTERS[q.options.index(d)], relations=((i, PREDICATES[d], j),),
                               reasoning=("relative", (i, j, d)))


def annotator_mirrors(cfg: SyntheticConfig, split: str, index: int, objects, q: Question) -> bool:
    # a stream of its own, so that the world's other draws (scenes, questions, pseudo-GT) stay as they were
    if not cfg.mirror_colors or not any(objects[i].color in cfg.mirror_colors for i in q.relevant):
        return False
    return bool(np.random.default_rng([cfg.seed, SPLITS[split], index, 1]).random() < cfg.mirror_rate)


# ---------------------------------------------------------------- the language prior (prior_colors)

# Draws allowed to find a scene whose answer the prior asks for (about 20 on average for one colour of five, "left").
PRIOR_DRAWS = 10_000


def _asks_prior(cfg: SyntheticConfig, objects: Sequence[SceneObject], q: Question) -> bool:
    return q.category == "relative_position" and any(objects[i].color in cfg.prior_colors for i in q.relevant)


def with_prior(rng: np.random.Generator, cfg: SyntheticConfig, split: str, index: int,
                objects: list[SceneObject], q: Question) -> tuple[list[SceneObject], Question]:
    """The drawn (scene, question), or, for a training question naming a prior colour, the first one drawn from
    here on that names a prior colour and whose true answer is prior_answer exactly when a coin of the sample's own
    stream says so (rate prior_rate): the skew comes from which scenes are kept, never from relabelling."""
    if split != "train" or not _asks_prior(cfg, objects, q):
        return objects, q
    want = bool(np.random.default_rng([cfg.seed, SPLITS[split], index, 2]).random() < cfg.prior_rate)
    for _ in range(PRIOR_DRAWS):
        if _asks_prior(cfg, objects, q) and (q.reasoning[1][2] == cfg.prior_answer) == want:
            return objects, q
        objects, q = draw(rng, cfg)
    raise RuntimeError(f"no scene in {PRIOR_DRAWS} draws whose answer is{'' if want else ' not'} "
                       f"{cfg.prior_answer!r} for a question naming one of {cfg.prior_colors}")


def names_prior(cfg: SyntheticConfig, sample: Sample) -> bool:
    """Whether `sample` is a relative-position question naming an object of a prior colour (read from the sample's
    objects, not from the generator, so a written dataset answers it too)."""
    if sample.category != "relative_position":
        return False
    colours = {o["label"]: o["color"] for o in sample.meta["objects"]}
    return any(colours[label] in cfg.prior_colors for label in sample.meta["relevant"])


def prior_is_wrong(cfg: SyntheticConfig, sample: Sample) -> bool:
    """Whether text alone gets `sample` wrong: it names a prior colour and its true answer is not the prior's."""
    return names_prior(cfg, sample) and sample.options[LETTERS.index(sample.answer)] != cfg.prior_answer


