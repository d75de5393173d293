"""A synthetic scene: objects placed (freely or one per grid cell), the distractors the question does not name,
the images made hard to read, and the rendering."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spatial_jax.data.synthetic.world import BACKGROUND, COLORS, SPLITS, SceneObject, SyntheticConfig


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
    return [SceneObject(shape=shape, color=color, bbox=_cell_box(rng, cfg, int(cell)))
            for (color, shape), cell in zip(_pick_labels(rng, cfg, n), cells)]


def _sizes(cfg: SyntheticConfig) -> tuple[int, int]:
    """(smallest, largest) side in pixels of a free or randomly placed object."""
    side = min(cfg.width, cfg.height)
    smin = max(4, int(round(cfg.min_size_frac * side)))
    return smin, max(smin, int(round(cfg.max_size_frac * side)))


def _cell_box(rng: np.random.Generator, cfg: SyntheticConfig, cell: int) -> tuple[int, int, int, int]:
    r, c = divmod(cell, cfg.grid)
    x1, x2 = c * cfg.width // cfg.grid + 2, (c + 1) * cfg.width // cfg.grid - 2
    y1, y2 = r * cfg.height // cfg.grid + 2, (r + 1) * cfg.height // cfg.grid - 2
    if cfg.cell_placement == "random":
        smin, smax = _sizes(cfg)
        s = int(rng.integers(smin, min(smax, x2 - x1, y2 - y1) + 1))
        x1 += int(rng.integers(0, x2 - x1 - s + 1))
        y1 += int(rng.integers(0, y2 - y1 - s + 1))
        x2, y2 = x1 + s, y1 + s
    return x1, y1, x2, y2


def sample_scene(rng: np.random.Generator, cfg: SyntheticConfig) -> list[SceneObject]:
    """Distinct objects placed without overlap (2 px gap), so every label names one object."""
    if cfg.grid:
        return _grid_scene(rng, cfg)
    smin, smax = _sizes(cfg)
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


# Tries to place a free distractor apart from a scene's objects before the scene counts as full.
DISTRACTOR_TRIES = 1000


def with_distractors(cfg: SyntheticConfig, split: str, index: int, objects: list[SceneObject]) -> list[SceneObject]:
    """`objects` and cfg.distractors more, drawn from a stream of the sample's own: labels no object has (nor the
    anchor's colour), in free grid cells or 2 px apart from every object."""
    if not cfg.distractors:
        return objects
    rng = np.random.default_rng([cfg.seed, SPLITS[split], index, 3])
    colors = [c for c in COLORS if c != cfg.anchor and (not cfg.distinct_colors or all(o.color != c for o in objects))]
    labels = [(c, s) for c in colors for s in cfg.shapes if all(o.label != f"{c} {s}" for o in objects)]
    out = list(objects)
    if cfg.grid:
        taken = {int(o.center[1]) * cfg.grid // cfg.height * cfg.grid + int(o.center[0]) * cfg.grid // cfg.width
                 for o in objects}
        free = [c for c in range(cfg.grid * cfg.grid) if c not in taken]
        cells = [free[int(i)] for i in rng.choice(len(free), size=cfg.distractors, replace=False)]
    smin, smax = _sizes(cfg)
    for k in range(cfg.distractors):
        color, shape = labels.pop(int(rng.integers(len(labels))))
        if cfg.distinct_colors:
            labels = [(c, s) for c, s in labels if c != color]
        if cfg.grid:
            box = _cell_box(rng, cfg, cells[k])
        else:
            for _ in range(DISTRACTOR_TRIES):
                s = int(rng.integers(smin, smax + 1))
                x1, y1 = int(rng.integers(0, cfg.width - s + 1)), int(rng.integers(0, cfg.height - s + 1))
                box = (x1, y1, x1 + s, y1 + s)
                if all(_apart(box, o.bbox, gap=2) for o in out):
                    break
            else:
                raise RuntimeError(f"{split} sample {index}: no room for distractor {k + 1} of {cfg.distractors} in "
                                   f"{DISTRACTOR_TRIES} tries; lower data.synthetic.distractors or the object sizes")
        out.append(SceneObject(shape=shape, color=color, bbox=box))
    return out


def hard_image(cfg: SyntheticConfig, split: str, index: int, image: np.ndarray) -> tuple[np.ndarray, bool]:
    """(the image, whether it is hard to read): with probability cfg.hard_rate (the sample's own coin), each pixel's
    difference from the background scaled by hard_contrast, plus Gaussian noise of std hard_noise."""
    if not cfg.hard_rate:
        return image, False
    rng = np.random.default_rng([cfg.seed, SPLITS[split], index, 4])
    if rng.random() >= cfg.hard_rate:
        return image, False
    if image.size == 0:  # not rendered: only the coin
        return image, True
    background = np.asarray(BACKGROUND, np.float64)
    faint = background + cfg.hard_contrast * (image - background) + rng.normal(0.0, cfg.hard_noise, image.shape)
    return np.clip(np.rint(faint), 0, 255).astype(np.uint8), True


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


