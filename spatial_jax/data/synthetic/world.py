"""The synthetic world's vocabulary and settings: shapes, colours, question types, the config, a scene's objects and
a question, and the geometry the answers are computed with."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

from spatial_jax.config import check_non_negative, check_range, require

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
TWO_OBJECT_QUESTIONS = ("relative_position", "distance")  # answered from the two objects they name alone
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
    things are in the form it knows; the letter's reward never reads them.
    distractors: objects the question does not name, added to every scene after its question is drawn (off at 0),
    so that SpatialThinker's over-generation (App. C.1) has something to box: each with a label no other object of
    the scene has (and not the anchor's colour), in a free grid cell or apart from the others, drawn from a stream of
    the sample's own so the named objects, question, answer and pseudo-GT stay the world's without them. They are in
    the image, in meta["objects"] and in the reference completions' observation ("The image shows N objects"), but
    not in the reference scene graph or the pseudo-GT, which hold the question's objects (SpatialThinker's count
    term counts those). Only questions about two named objects (relative position, distance) take them: the others
    read every object of the scene.
    hard_rate, hard_contrast, hard_noise: images hard to read for a share of the questions (off at 0), so that a
    language prior can pay (ProSR Table 2): in both splits, with probability hard_rate (a coin of the sample's own
    stream, independent of its scene and answer), the image keeps only hard_contrast of every pixel's difference from
    the background and gets Gaussian noise of std hard_noise (in 0-255 levels); objects, answers, pseudo-GT and
    reference completions stay true, and meta["hard"] says which images are."""

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
    distractors: int = 0
    hard_rate: float = 0.0
    hard_contrast: float = 0.2
    hard_noise: float = 24.0
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
        check_range(self, "distractors", 0, self.max_scene_objects - self.max_objects)
        require("question_types", self.question_types,
                not self.distractors or set(self.question_types) <= set(TWO_OBJECT_QUESTIONS),
                f"be within {TWO_OBJECT_QUESTIONS} with distractors (the others read every object of the scene)")
        check_range(self, "hard_rate", 0, 1)
        check_range(self, "hard_contrast", 0, 1, low_open=True)
        check_non_negative(self, "hard_noise")

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


