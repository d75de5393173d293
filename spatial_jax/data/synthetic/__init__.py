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

import numpy as np

from spatial_jax.data.sample import Sample
from spatial_jax.data.synthetic.annotations import (
    annotator_mirrors,
    displace,
    mirrored_question,
    mirrored_scene,
    names_prior,
    prior_is_wrong,
    pseudo_gt,
    reference_completions,
    scene_graph,
    with_prior,
)
from spatial_jax.data.synthetic.questions import draw
from spatial_jax.data.synthetic.scene import hard_image, render, with_distractors
from spatial_jax.data.synthetic.world import (
    BACKGROUND,
    BOX_LEAD,
    COLORS,
    CORRUPTIONS,
    PREDICATES,
    QUESTION_TYPES,
    SHAPES,
    SPLITS,
    Question,
    SceneObject,
    SyntheticConfig,
    iou,
    to_norm,
)

# the world's public face: what the pipeline, the commands, the benchmarks and the tests read
__all__ = [
    "BACKGROUND", "BOX_LEAD", "COLORS", "CORRUPTIONS", "PREDICATES", "QUESTION_TYPES", "ROW_BYTES", "SHAPES", "SPLITS",
    "Question", "SceneObject", "SyntheticConfig", "SyntheticSource", "displace", "generate", "iou", "make_sample",
    "names_prior", "prior_is_wrong", "render", "to_norm", "written_bytes",
]


def _rng(cfg: SyntheticConfig, split: str, index: int) -> np.random.Generator:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {list(SPLITS)}")
    if index < 0:
        raise ValueError(f"sample index must be >= 0, got {index}")
    return np.random.default_rng([cfg.seed, SPLITS[split], index])


def make_sample(cfg: SyntheticConfig, split: str, index: int, render_image: bool = True) -> Sample:
    """Sample `index` of `split`: deterministic from (cfg, split, index). Without rendering, `image` is 0x0."""
    rng = _rng(cfg, split, index)
    objects, q = draw(rng, cfg)
    objects, q = with_prior(rng, cfg, split, index, objects, q)
    objects = with_distractors(cfg, split, index, objects)
    boxes, kinds = pseudo_gt(rng, objects, list(dict.fromkeys(q.relevant)), cfg)
    scene = scene_graph(objects, q)
    image = render(objects, cfg.width, cfg.height) if render_image else np.zeros((0, 0, 3), np.uint8)
    image, hard = hard_image(cfg, split, index, image)
    mirrored = annotator_mirrors(cfg, split, index, objects, q)
    q_seen = mirrored_question(q) if mirrored else q
    if mirrored:
        seen = mirrored_scene(objects, cfg.width)
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
            **({"hard": hard} if cfg.hard_rate else {}),  # only where the world has hard images: the others' unchanged
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
