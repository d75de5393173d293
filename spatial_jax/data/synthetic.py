"""An embedded synthetic spatial world: rendered scenes of coloured shapes with exact boxes and computed answers.

Every sample is a pure function of (config, split, index): its random stream is seeded by
[seed, split code, index], so the train and held-out splits draw from disjoint streams and any sample can be
regenerated alone (random access for the data pipeline). Questions are multiple choice with 4 options (relative
position, size, nearest object, counting) or numeric (centre distance in pixels, scored by MRA). Each sample carries
pseudo-GT boxes in the [0, 1000] frame whose noise grows as their validity falls, the A.3 corruption test
(removed / relabelled / displaced to IoU < 0.6) when configured, a SpatialThinker reference scene graph in pixels,
and one reference completion per method's output format (SFT targets).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from spatial_jax.config import check_non_negative, check_range, require
from spatial_jax.data.prompts import HARNESS, SCENE_GRAPH, THINK_BOXES, THINK_LETTER
from spatial_jax.data.sample import LETTERS, Sample, format_number
from spatial_jax.records import GTBox

SHAPES = ("circle", "square", "triangle")
COLORS = {
    "red": (215, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 80, 215),
    "yellow": (225, 195, 30),
    "purple": (135, 60, 175),
    "orange": (240, 135, 30),
}
BACKGROUND = (235, 235, 235)
QUESTION_TYPES = ("relative_position", "size", "nearest", "counting", "distance")
MC_QUESTION_TYPES = QUESTION_TYPES[:4]
SPLITS = {"train": 0, "heldout": 1}
DIRECTIONS = ("left", "right", "above", "below")
PREDICATES = {"left": "left of", "right": "right of", "above": "above", "below": "below"}
CORRUPTIONS = ("removed", "relabelled", "displaced")
NORM = 1000
# Image sides in pixels: below 32 the shapes do not fit; above 4096 an image is no longer a small synthetic scene
# (and 100,000 x 100,000 would be 30 GB).
MIN_SIDE, MAX_SIDE = 32, 4096
# A grid cell narrower than 8 px leaves a shape of at most 4 px inside its 2 px border.
GRID_MIN_CELL = 8
BOX_LEAD = "We have the positions of the relevant objects. Let's think."


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """The world's knobs. Validity v ~ U[min_validity, 1] (detector scores kept above 0.3, A.3); each pseudo-GT
    coordinate is jittered with std box_noise * (1 - v) * box side; corrupt_fraction of boxes get the A.3 corruption.

    grid: 0 places objects freely; N > 0 puts each object in its own cell of an N x N grid, filling the cell but for a
    2 px border (the size fractions are then unused). With cells the size of the vision tower's merged patches (e.g. 128
    px, grid 4: 32 px cells), each object is one image token whose position embedding says where it is, so a tiny policy
    can learn its box. cell_placement (with a grid): "fill" as above, or "random": each object a square of side drawn
    from the size fractions (of the image's shorter side), placed at random inside its cell's 2 px border, so its token
    says only roughly where it is and every digit of its box is in doubt. distinct_colors: no two objects of a scene
    share a colour, so a colour alone names an object.
    shapes: the shapes objects take (one shape: a label's noun tells nothing). shuffle_options: options in random order;
    otherwise sorted (relative position: above, below, left, right), so an answer's letter follows from the answer
    alone. box_order: the order of the reference completion's box lines: "question" (the objects in the order the
    question names them) or "reading" (by box centre, top to bottom, then left to right), so a box's digits follow from
    the image alone and its label from what the box holds. anchor: a colour; every scene then holds one object of it
    (the anchor; no other object has its colour) and relative-position questions ask where another object is relative
    to the anchor, so a policy can tell the question's two objects apart by what it sees, without matching the
    question's words to the image. mirror_colors, mirror_rate: a biased annotator. With probability mirror_rate the
    reference completions (the SFT targets) of a question about an object of one of these colours describe the scene
    mirrored left to right (each box in the other column, left and right swapped in the reasoning and the answer it
    writes; meta["annotated_answer"] is the answer they give, which AlloSpatial's tool-calling targets end with too);
    the image, question, gold answer and pseudo-GT stay true. A policy trained on them writes the mirrored
    boxes where the rate is above 1/2 yet gives the true ones probability 1 - rate: errors it is unsure of, which RL
    with the gold answers and pseudo-GT can correct.
    prior_colors, prior_answer, prior_rate: a language prior that the question's text alone can exploit (ProSR's
    blank-image shortcut; off while prior_colors is empty). In the training split, a relative-position question
    naming an object of one of these colours has the gold answer prior_answer (a direction) with probability
    prior_rate: such a sample's scene and question are drawn again from its own stream until the true answer is
    (or is not) prior_answer, so image, answer, pseudo-GT and reference completions all stay true. Every other
    sample, and the whole held-out split, is the world without the prior (a balanced held-out split, where the
    prior's answer is usually wrong).
    letter_reasoning: the reasoning of the letter-only reference completion (ProSR's format: reasoning, `</think>`,
    one letter): "centres" (the objects' centres, then the argument) or "boxes" (the question's box lines and the
    argument, as the box format writes them before its `</think>`), so a policy pretrained to write boxes says where
    things are in the form it knows; the letter's reward never reads them."""

    width: int = 96
    height: int = 96
    min_objects: int = 4
    max_objects: int = 6
    min_size_frac: float = 0.12
    max_size_frac: float = 0.28
    question_types: tuple[str, ...] = MC_QUESTION_TYPES
    shapes: tuple[str, ...] = SHAPES
    min_validity: float = 0.3
    box_noise: float = 0.15
    corrupt_fraction: float = 0.0
    displace_iou: float = 0.6
    grid: int = 0
    cell_placement: Literal["fill", "random"] = "fill"
    distinct_colors: bool = False
    shuffle_options: bool = True
    box_order: Literal["question", "reading"] = "question"
    anchor: str = ""
    mirror_colors: tuple[str, ...] = ()
    mirror_rate: float = 0.0
    prior_colors: tuple[str, ...] = ()
    prior_answer: str = "left"
    prior_rate: float = 0.0
    letter_reasoning: Literal["centres", "boxes"] = "centres"
    seed: int = 0

    def __post_init__(self):
        check_range(self, "width", MIN_SIDE, MAX_SIDE)
        check_range(self, "height", MIN_SIDE, MAX_SIDE)
        check_range(self, "grid", 0, min(self.width, self.height) // GRID_MIN_CELL)
        require("cell_placement", self.cell_placement, self.cell_placement in ("fill", "random"),
                'be "fill" or "random"')
        if self.grid and self.cell_placement == "random":
            inner = min(self.width, self.height) // self.grid - 4
            require("max_size_frac", self.max_size_frac, self.max_size_frac * min(self.width, self.height) <= inner,
                    f"leave the square inside its cell (at most {inner} px with grid {self.grid})")
        require("shapes", self.shapes, bool(self.shapes) and len(set(self.shapes)) == len(self.shapes)
                and all(x in SHAPES for x in self.shapes), f"be a non-empty subset of {SHAPES} without repeats")
        check_range(self, "min_objects", 2, self.max_scene_objects)
        check_range(self, "max_objects", self.min_objects, self.max_scene_objects)
        check_range(self, "min_size_frac", 0, 0.5, low_open=True)
        check_range(self, "max_size_frac", self.min_size_frac, 0.5)
        require("question_types", self.question_types,
                bool(self.question_types) and all(q in QUESTION_TYPES for q in self.question_types),
                f"be a non-empty subset of {QUESTION_TYPES}")
        require("max_objects", self.max_objects, self.question_types != ("nearest",) or self.max_objects >= 3,
                "be >= 3 for nearest-object questions alone (a clear runner-up)")
        check_range(self, "min_validity", 0, 1)
        check_range(self, "corrupt_fraction", 0, 1)
        check_range(self, "displace_iou", 0, 1, low_open=True, high_open=True)
        check_non_negative(self, "box_noise", "seed")  # numpy seeds are non-negative
        require("anchor", self.anchor, self.anchor in ("", *COLORS), f'be "" or one of {tuple(COLORS)}')
        require("mirror_colors", self.mirror_colors,
                len(set(self.mirror_colors)) == len(self.mirror_colors) and set(self.mirror_colors) <= set(COLORS),
                f"be distinct colours of {tuple(COLORS)}")
        check_range(self, "mirror_rate", 0, 1)
        require("prior_colors", self.prior_colors,
                len(set(self.prior_colors)) == len(self.prior_colors) and set(self.prior_colors) <= set(COLORS),
                f"be distinct colours of {tuple(COLORS)}")
        require("prior_answer", self.prior_answer, self.prior_answer in DIRECTIONS, f"be one of {DIRECTIONS}")
        check_range(self, "prior_rate", 0, 1)
        require("letter_reasoning", self.letter_reasoning, self.letter_reasoning in ("centres", "boxes"),
                'be "centres" or "boxes"')
        require("question_types", self.question_types,
                not self.prior_colors or "relative_position" in self.question_types,
                "include relative_position when prior_colors is set (the prior's answer is a direction)")

    @property
    def max_scene_objects(self) -> int:
        """How many distinct objects a scene can hold: colour-shape pairs (colours alone when distinct), and cells."""
        n = len(COLORS) if self.distinct_colors else len(self.shapes) * len(COLORS)
        if self.anchor and not self.distinct_colors:  # the anchor's colour holds one object, not one per shape
            n -= len(self.shapes) - 1
        return min(n, self.grid * self.grid) if self.grid else n


@dataclasses.dataclass(frozen=True)
class SceneObject:
    """One shape; bbox = [x1, y1, x2, y2] in pixels, continuous (the shape fills columns x1..x2-1)."""

    shape: str
    color: str
    bbox: tuple[int, int, int, int]

    @property
    def label(self) -> str:
        return f"{self.color} {self.shape}"

    @property
    def center(self) -> tuple[float, float]:
        return ((self.bbox[0] + self.bbox[2]) / 2, (self.bbox[1] + self.bbox[3]) / 2)

    @property
    def area(self) -> int:
        return (self.bbox[2] - self.bbox[0]) * (self.bbox[3] - self.bbox[1])


@dataclasses.dataclass(frozen=True)
class Question:
    category: str
    text: str
    options: tuple[str, ...]
    answer: str | float
    relevant: tuple[int, ...]  # indices of scene objects the question is about (pseudo-GT, scene graph)
    relations: tuple[tuple[int, str, int], ...]
    reasoning: tuple  # (kind, payload) rendered per coordinate frame by _reasoning


# ---------------------------------------------------------------- geometry


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of continuous boxes (SPEC 7: no +1), 0 when they do not overlap or the union is empty; an inverted box has
    no area."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = max(0.0, a[2] - a[0]) * max(0.0, a[3] - a[1]) + max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def to_norm(bbox: Sequence[float], width: int, height: int) -> tuple[int, int, int, int]:
    """Pixels -> the integer [0, 1000] frame (x right, y down)."""
    x1, y1, x2, y2 = bbox
    return (
        int(round(x1 * NORM / width)),
        int(round(y1 * NORM / height)),
        int(round(x2 * NORM / width)),
        int(round(y2 * NORM / height)),
    )


def dominant_direction(a: SceneObject, b: SceneObject) -> str | None:
    """Where a lies relative to b, when one axis clearly dominates (|major| >= 2 |minor|); else None."""
    dx = a.center[0] - b.center[0]
    dy = a.center[1] - b.center[1]
    if abs(dx) >= 2 * abs(dy):
        return "left" if dx < 0 else "right"
    if abs(dy) >= 2 * abs(dx):
        return "above" if dy < 0 else "below"
    return None


def center_distance(a: SceneObject, b: SceneObject) -> float:
    return math.hypot(a.center[0] - b.center[0], a.center[1] - b.center[1])


# ---------------------------------------------------------------- scene


def _pick_labels(rng: np.random.Generator, cfg: SyntheticConfig, n: int) -> list[tuple[str, str]]:
    """n distinct (colour, shape) pairs; with distinct_colors, n distinct colours each with a random shape. With an
    anchor, the first is the anchor's and the others avoid its colour."""
    colors = [c for c in COLORS if c != cfg.anchor]
    first = [(cfg.anchor, cfg.shapes[int(rng.integers(len(cfg.shapes)))])] if cfg.anchor else []
    n -= len(first)
    if cfg.distinct_colors:
        return first + [(colors[int(c)], cfg.shapes[int(rng.integers(len(cfg.shapes)))])
                        for c in rng.choice(len(colors), size=n, replace=False)]
    combos = [(c, s) for c in colors for s in cfg.shapes]
    return first + [combos[int(p)] for p in rng.choice(len(combos), size=n, replace=False)]


def _grid_scene(rng: np.random.Generator, cfg: SyntheticConfig) -> list[SceneObject]:
    """Each object in its own cell of the cfg.grid x cfg.grid grid, inside a 2 px border: filling it, or (cell_placement
    "random") a square of random side at a random place."""
    n = int(rng.integers(cfg.min_objects, cfg.max_objects + 1))
    cells = rng.choice(cfg.grid * cfg.grid, size=n, replace=False)
    side = min(cfg.width, cfg.height)
    smin = max(4, int(round(cfg.min_size_frac * side)))
    smax = max(smin, int(round(cfg.max_size_frac * side)))
    objects = []
    for (color, shape), cell in zip(_pick_labels(rng, cfg, n), cells):
        r, c = divmod(int(cell), cfg.grid)
        x1, x2 = c * cfg.width // cfg.grid + 2, (c + 1) * cfg.width // cfg.grid - 2
        y1, y2 = r * cfg.height // cfg.grid + 2, (r + 1) * cfg.height // cfg.grid - 2
        if cfg.cell_placement == "random":
            s = int(rng.integers(smin, min(smax, x2 - x1, y2 - y1) + 1))
            x1 += int(rng.integers(0, x2 - x1 - s + 1))
            y1 += int(rng.integers(0, y2 - y1 - s + 1))
            x2, y2 = x1 + s, y1 + s
        objects.append(SceneObject(shape=shape, color=color, bbox=(x1, y1, x2, y2)))
    return objects


def sample_scene(rng: np.random.Generator, cfg: SyntheticConfig) -> list[SceneObject]:
    """Distinct objects placed without overlap (2 px gap), so every label names one object."""
    if cfg.grid:
        return _grid_scene(rng, cfg)
    side = min(cfg.width, cfg.height)
    smin = max(4, int(round(cfg.min_size_frac * side)))
    smax = max(smin, int(round(cfg.max_size_frac * side)))
    while True:
        n = int(rng.integers(cfg.min_objects, cfg.max_objects + 1))
        objects: list[SceneObject] = []
        for color, shape in _pick_labels(rng, cfg, n):
            s = int(rng.integers(smin, smax + 1))
            for _ in range(200):
                x1 = int(rng.integers(0, cfg.width - s + 1))
                y1 = int(rng.integers(0, cfg.height - s + 1))
                box = (x1, y1, x1 + s, y1 + s)
                if all(_apart(box, o.bbox, gap=2) for o in objects):
                    objects.append(SceneObject(shape=shape, color=color, bbox=box))
                    break
            else:
                break
        if len(objects) == n:
            return objects


def _apart(a: Sequence[int], b: Sequence[int], gap: int) -> bool:
    return a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1]


def render(objects: Sequence[SceneObject], width: int, height: int) -> np.ndarray:
    """RGB uint8 (H, W, 3); each shape exactly fills its box (circle inscribed, triangle apex at the top centre)."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(im)
    for o in objects:
        x1, y1, x2, y2 = o.bbox
        fill = COLORS[o.color]
        if o.shape == "circle":
            draw.ellipse((x1, y1, x2 - 1, y2 - 1), fill=fill)
        elif o.shape == "square":
            draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=fill)
        else:
            draw.polygon([(x1, y2 - 1), (x2 - 1, y2 - 1), ((x1 + x2 - 1) / 2, y1)], fill=fill)
    return np.asarray(im)


# ---------------------------------------------------------------- questions


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


# ---------------------------------------------------------------- pseudo-GT


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


def _mirrored(objects: Sequence[SceneObject], width: int) -> list[SceneObject]:
    return [dataclasses.replace(o, bbox=(width - o.bbox[2], o.bbox[1], width - o.bbox[0], o.bbox[3])) for o in objects]


def _mirrored_question(q: Question) -> Question:
    """The question as the mirrored scene answers it: only a left/right relation changes (size, nearest, counting
    and distance do not depend on the side)."""
    if q.reasoning[0] != "relative":
        return q
    i, j, d = q.reasoning[1]
    d = {"left": "right", "right": "left"}.get(d, d)
    return dataclasses.replace(q, answer=LETTERS[q.options.index(d)], relations=((i, PREDICATES[d], j),),
                               reasoning=("relative", (i, j, d)))


def _annotator_mirrors(cfg: SyntheticConfig, split: str, index: int, objects, q: Question) -> bool:
    # a stream of its own, so that the world's other draws (scenes, questions, pseudo-GT) stay as they were
    if not cfg.mirror_colors or not any(objects[i].color in cfg.mirror_colors for i in q.relevant):
        return False
    return bool(np.random.default_rng([cfg.seed, SPLITS[split], index, 1]).random() < cfg.mirror_rate)


# ---------------------------------------------------------------- the language prior (prior_colors)

# Draws allowed to find a scene whose answer the prior asks for (about 20 on average for one colour of five, "left").
PRIOR_DRAWS = 10_000


def _asks_prior(cfg: SyntheticConfig, objects: Sequence[SceneObject], q: Question) -> bool:
    return q.category == "relative_position" and any(objects[i].color in cfg.prior_colors for i in q.relevant)


def _with_prior(rng: np.random.Generator, cfg: SyntheticConfig, split: str, index: int,
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
        objects, q = _draw(rng, cfg)
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


# ---------------------------------------------------------------- samples


def _rng(cfg: SyntheticConfig, split: str, index: int) -> np.random.Generator:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {list(SPLITS)}")
    if index < 0:
        raise ValueError(f"sample index must be >= 0, got {index}")
    return np.random.default_rng([cfg.seed, SPLITS[split], index])


def _draw(rng: np.random.Generator, cfg: SyntheticConfig) -> tuple[list[SceneObject], Question]:
    while True:
        objects = sample_scene(rng, cfg)
        for _ in range(8):
            qtype = cfg.question_types[int(rng.integers(len(cfg.question_types)))]
            q = _BUILDERS[qtype](rng, objects, cfg)
            if q is not None:
                return objects, q


def make_sample(cfg: SyntheticConfig, split: str, index: int, render_image: bool = True) -> Sample:
    """Sample `index` of `split`: deterministic from (cfg, split, index). Without rendering, `image` is 0x0."""
    rng = _rng(cfg, split, index)
    objects, q = _draw(rng, cfg)
    objects, q = _with_prior(rng, cfg, split, index, objects, q)
    boxes, kinds = pseudo_gt(rng, objects, list(dict.fromkeys(q.relevant)), cfg)
    scene = scene_graph(objects, q)
    image = render(objects, cfg.width, cfg.height) if render_image else np.zeros((0, 0, 3), np.uint8)
    mirrored = _annotator_mirrors(cfg, split, index, objects, q)
    q_seen = _mirrored_question(q) if mirrored else q
    if mirrored:
        seen = _mirrored(objects, cfg.width)
        reference = reference_completions(seen, q_seen, scene_graph(seen, q_seen), cfg)
    else:
        reference = reference_completions(objects, q, scene, cfg)
    return Sample(
        id=f"{split}-{index:06d}",
        image=image,
        question=q.text,
        options=q.options,
        answer=q.answer,
        answer_type="choice" if q.options else "number",
        category=q.category,
        image_size=(cfg.width, cfg.height),
        gt_boxes=boxes,
        scene=scene,
        reference=reference,
        meta={
            "objects": [{"label": o.label, "shape": o.shape, "color": o.color, "bbox": list(o.bbox)} for o in objects],
            "relevant": [objects[i].label for i in dict.fromkeys(q.relevant)],
            "corruption": list(kinds),
            "mirrored": mirrored,
            "annotated_answer": q_seen.answer,  # the annotator's answer: the SFT targets' (true unless mirrored)
        },
    )


class SyntheticSource:
    """A random-access sequence of `num` samples of one split (a grain data source)."""

    def __init__(self, cfg: SyntheticConfig, split: str, num: int, render_image: bool = True):
        if num < 0:
            raise ValueError(f"num must be >= 0, got {num}")
        _rng(cfg, split, 0)
        self.cfg, self.split, self.num, self.render_image = cfg, split, num, render_image

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, index: int) -> Sample:
        if not -self.num <= index < self.num:
            raise IndexError(f"index {index} out of range for {self.num} samples")
        return make_sample(self.cfg, self.split, index % self.num, self.render_image)


# what one written sample may take beyond its image: its JSONL row (question, options, boxes, meta) and the PNG's
# chunks; measured rows of the default world are under 2 KiB
ROW_BYTES = 8192


def written_bytes(cfg: SyntheticConfig, num: int) -> int:
    """An upper bound of the bytes `num` samples take written as JSONL + PNG: a PNG is at most its raw pixels plus a
    filter byte per row (zlib's stored blocks cost ~5 bytes per 64 KiB more, within ROW_BYTES)."""
    return num * (cfg.height * (3 * cfg.width + 1) + ROW_BYTES)


def generate(cfg: SyntheticConfig, split: str, num: int, render_image: bool = True) -> list[Sample]:
    return [make_sample(cfg, split, i, render_image) for i in range(num)]
