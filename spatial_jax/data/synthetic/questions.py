"""The questions a scene is asked: relative position, size, nearest object, counting (multiple choice) and centre
distance (numeric), each with the objects it is about, their relations and the reasoning its answer rests on."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spatial_jax.data.sample import LETTERS
from spatial_jax.data.synthetic.scene import sample_scene
from spatial_jax.data.synthetic.world import (
    COLORS,
    DIRECTIONS,
    PREDICATES,
    Question,
    SceneObject,
    SyntheticConfig,
    center_distance,
    dominant_direction,
)


def _letter_options(rng: np.random.Generator, items: list, correct, cfg: SyntheticConfig) -> tuple[list, str]:
    if cfg.shuffle_options:
        order = [items[int(i)] for i in rng.permutation(len(items))]
    else:
        order = sorted(items, key=str)
    return order, LETTERS[order.index(correct)]


def _absent_labels(objects: Sequence[SceneObject], cfg: SyntheticConfig) -> list[str]:
    present = {o.label for o in objects}
    return [f"{c} {s}" for c in COLORS for s in cfg.shapes if f"{c} {s}" not in present]


def _q_relative(rng, objects, cfg) -> Question | None:
    min_gap = 0.15 * min(cfg.width, cfg.height)
    pairs = []
    for i, a in enumerate(objects):
        for j, b in enumerate(objects):
            if i == j or (cfg.anchor and j != 0):  # object 0 is the anchor (_pick_labels)
                continue
            d = dominant_direction(a, b)
            major = max(abs(a.center[0] - b.center[0]), abs(a.center[1] - b.center[1]))
            if d is not None and major >= min_gap:
                pairs.append((i, j, d))
    if not pairs:
        return None
    i, j, d = pairs[int(rng.integers(len(pairs)))]
    options, letter = _letter_options(rng, list(DIRECTIONS), d, cfg)
    a, b = objects[i], objects[j]
    return Question(
        category="relative_position",
        text=f"Where is the {a.label} relative to the {b.label}?",
        options=tuple(options),
        answer=letter,
        relevant=(i, j),
        relations=((i, PREDICATES[d], j),),
        reasoning=("relative", (i, j, d)),
    )


def _q_size(rng, objects, cfg) -> Question | None:
    k = min(4, len(objects))
    chosen = [int(c) for c in rng.choice(len(objects), size=k, replace=False)]
    which = "largest" if rng.random() < 0.5 else "smallest"
    ranked = sorted(chosen, key=lambda i: objects[i].area, reverse=(which == "largest"))
    first, second = objects[ranked[0]].area, objects[ranked[1]].area
    if max(first, second) < 1.25 * min(first, second):
        return None
    labels = [objects[i].label for i in chosen]
    distractors = _absent_labels(objects, cfg)
    extra = [distractors[int(i)] for i in rng.choice(len(distractors), size=4 - k, replace=False)]
    options, letter = _letter_options(rng, labels + extra, objects[ranked[0]].label, cfg)
    pred = "larger than" if which == "largest" else "smaller than"
    return Question(
        category="size",
        text=f"Which of these objects is the {which}?",
        options=tuple(options),
        answer=letter,
        relevant=tuple(chosen),
        relations=tuple((ranked[0], pred, i) for i in chosen if i != ranked[0]),
        reasoning=("size", (tuple(chosen), which, ranked[0])),
    )


def _q_nearest(rng, objects, cfg) -> Question | None:
    ref = int(rng.integers(len(objects)))
    others = sorted((i for i in range(len(objects)) if i != ref),
                    key=lambda i: center_distance(objects[i], objects[ref]))
    if len(others) < 2:
        return None
    d1 = center_distance(objects[others[0]], objects[ref])
    d2 = center_distance(objects[others[1]], objects[ref])
    if d2 < 1.2 * d1:
        return None
    nearest = others[0]
    rest = others[1:]
    picked = [rest[int(i)] for i in rng.choice(len(rest), size=min(3, len(rest)), replace=False)]
    present = [nearest] + picked
    distractors = _absent_labels(objects, cfg)
    extra = [distractors[int(i)] for i in rng.choice(len(distractors), size=4 - len(present), replace=False)]
    options, letter = _letter_options(rng, [objects[i].label for i in present] + extra, objects[nearest].label, cfg)
    return Question(
        category="nearest",
        text=f"Which object is closest to the {objects[ref].label}?",
        options=tuple(options),
        answer=letter,
        relevant=(ref, *present),
        relations=((nearest, "closest to", ref),),
        reasoning=("nearest", (ref, tuple(present), nearest)),
    )


def _q_counting(rng, objects, cfg) -> Question | None:
    if rng.random() < 0.5:
        values = sorted({o.shape for o in objects})
        value = values[int(rng.integers(len(values)))]
        members = tuple(i for i, o in enumerate(objects) if o.shape == value)
        text = f"How many {value}s are there in the image?"
    else:
        values = sorted({o.color for o in objects})
        value = values[int(rng.integers(len(values)))]
        members = tuple(i for i, o in enumerate(objects) if o.color == value)
        text = f"How many {value} objects are there in the image?"
    count = len(members)
    pool = [c for c in range(0, max(count + 4, 6)) if c != count]
    wrong = [pool[int(i)] for i in rng.choice(len(pool), size=3, replace=False)]
    options, letter = _letter_options(rng, [str(c) for c in [count, *wrong]], str(count), cfg)
    return Question(
        category="counting",
        text=text,
        options=tuple(options),
        answer=letter,
        relevant=members,
        relations=(),
        reasoning=("counting", (members, count)),
    )


def _q_distance(rng, objects, cfg) -> Question | None:
    i, j = (int(x) for x in rng.choice(len(objects), size=2, replace=False))
    d = center_distance(objects[i], objects[j])
    answer = float(max(1, int(round(d))))
    return Question(
        category="distance",
        text=(
            f"What is the distance in pixels between the centres of the {objects[i].label} "
            f"and the {objects[j].label}? Answer with a number."
        ),
        options=(),
        answer=answer,
        relevant=(i, j),
        relations=(),
        reasoning=("distance", (i, j, answer)),
    )


_BUILDERS = {
    "relative_position": _q_relative,
    "size": _q_size,
    "nearest": _q_nearest,
    "counting": _q_counting,
    "distance": _q_distance,
}


def draw(rng: np.random.Generator, cfg: SyntheticConfig) -> tuple[list[SceneObject], Question]:
    """A scene and a question about it, drawn from `rng` (a question type with no question for the scene is tried
    again, up to 8 times, before a new scene is drawn)."""
    while True:
        objects = sample_scene(rng, cfg)
        for _ in range(8):
            qtype = cfg.question_types[int(rng.integers(len(cfg.question_types)))]
            q = _BUILDERS[qtype](rng, objects, cfg)
            if q is not None:
                return objects, q
