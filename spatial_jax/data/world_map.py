"""World2Mind's map from what a sample carries: the objects' footprints in one frame, the route grid and a rendered
top-down view; the AlloSpatial tools (rollout/tools.py) and their SFT targets (methods/harness_targets.py) both
answer from here, so a target shows exactly what the live tool returns.

The paper's World2Mind reconstructs a scene and returns an Allocentric-Spatial Tree (AST): landmark nodes with
centre, footprint and attributes in one absolute frame, plus route knowledge (a grid of traversable cells) on
request (AlloSpatial §3.2, App. D). Here the map is built from the boxes a sample carries, first found of: the
synthetic world's objects (`meta["objects"]`, pixel boxes), pseudo-GT boxes (`gt_boxes`, [0, 1000]) or a scene graph
(`scene`, pixel boxes); camera poses (`meta["camera_poses"]`) are listed when present. No sample carries depth, so
the map is the first image's plane in the normalised [0, 1000] frame (x right, y down), and the AST says so. The
route grid marks the cells an object covers. The rendered view (`landmark_vis`: the objects' footprints, each in
its own colour; `route_vis`: the route grid, occupied cells dark) comes with a text caption (a 3x3 layout of the
objects, or the grid).

Every problem (unknown value, nothing to map) is an "Error: ..." text for the model to read, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

NORM = 1000  # the normalised frame's extent (SPEC 1.1)
KNOWLEDGE_TYPES = ("landmark", "route", "both")
FOOTPRINTS = ("rectangle", "ellipse")
SCENE_TYPES = ("indoor", "outdoor")
VISUALIZATION_TYPES = ("landmark_vis", "route_vis")
ROUTE_GRID = 10  # route cells per side, as the paper's Grid_Divisions
LAYOUT_GRID = 3  # the coarse view's cells per side
_ROWS = ("top", "middle", "bottom")
_COLS = ("left", "centre", "right")
PICTURE_SIDE = 96  # pixels of a rendered view (the synthetic world's image size: 9 tokens for the tiny tower)
# Footprint colours by node order (a view cannot assume the labels name colours); the background is white.
_PALETTE = ((215, 40, 40), (40, 80, 215), (40, 160, 60), (225, 195, 30), (135, 60, 175), (240, 135, 30),
            (30, 170, 170), (120, 80, 40))
NO_MAP = ("no scene map can be built: this sample carries no object boxes (meta objects, gt_boxes or a scene graph), "
          "no depth and no camera poses; answer from the image")


def error(message: str) -> str:
    return f"Error: {message}"


def clean(value: Any, limit: int = 40) -> str:
    """A model-supplied value shown back in an error: printable, no markup, bounded length."""
    text = "".join(c for c in str(value) if c.isalnum() or c in " _.-")
    return text[:limit]


def _pixel_objects(items, size, label_of) -> list[dict]:
    width, height = (float(v) for v in size)
    out = []
    for o in items:
        x1, y1, x2, y2 = (float(v) for v in o["bbox"])
        out.append({"label": label_of(o),
                    "box": (x1 * NORM / width, y1 * NORM / height, x2 * NORM / width, y2 * NORM / height)})
    return out


def _scene_label(node: Mapping) -> str:
    """A scene-graph id `red_circle.3` names a `red circle`."""
    return str(node["id"]).rsplit(".", 1)[0].replace("_", " ")


def scene_objects(sample) -> list[dict] | str:
    """[{"label", "box"}] with boxes in the normalised frame (floats), from the first source the sample carries
    (meta objects, gt_boxes, scene graph), or an error text saying what is missing."""
    meta = getattr(sample, "meta", None) or {}
    size = getattr(sample, "image_size", None)
    scene = getattr(sample, "scene", None)
    try:
        if meta.get("objects"):
            if not size:
                return error("the sample's objects are in pixels but its image size is unknown")
            out = _pixel_objects(meta["objects"], size, lambda o: str(o["label"]))
        elif getattr(sample, "gt_boxes", ()):
            out = [{"label": str(b.label), "box": tuple(float(v) for v in b.bbox)} for b in sample.gt_boxes]
        elif isinstance(scene, Mapping) and scene.get("objects"):
            if not size:
                return error("the sample's scene graph is in pixels but its image size is unknown")
            out = _pixel_objects(scene["objects"], size, _scene_label)
        else:
            return error(NO_MAP)
        if not all(math.isfinite(v) for o in out for v in o["box"]):
            raise ValueError("non-finite box")
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError):
        return error("this sample's scene map is malformed")
    return out


def camera_views(sample) -> list[str]:
    """AST lines for `meta["camera_poses"]` ([{"image": k, "position": [x, y], "heading_deg": h}]), [] without."""
    poses = (getattr(sample, "meta", None) or {}).get("camera_poses")
    if not isinstance(poses, list) or not poses:
        return []
    lines = ["Camera_Views:"]
    try:
        for p in poses:
            x, y = (float(v) for v in p["position"])
            lines.append(f"- Image: {int(p['image'])} Position: ({x:.3f}, {y:.3f}) "
                         f"Heading_Deg: {float(p['heading_deg']):.1f}")
    except (KeyError, TypeError, ValueError):
        return ["Camera_Views: malformed in this sample"]
    return lines


def _words(text: str) -> tuple[str, ...]:
    return tuple(str(text).lower().replace("_", " ").split())


def matches(category: str, label: str) -> bool:
    """A category names an object when all its words are in the label ("circle" and "red circle" name "red circle")."""
    words = _words(category)
    return bool(words) and set(words) <= set(_words(label))


def fmt_num(v: float) -> str:
    """Whole units of the [0, 1000] frame (a tenth of a percent of the image) keep the digit tokens few."""
    return str(int(round(v)))


def _cell(v: float, n: int) -> int:
    return min(n - 1, max(0, int(v * n / NORM)))


def _covered_cells(box: Sequence[float], n: int) -> list[tuple[int, int]]:
    """(col, row) cells of an n x n grid that the box overlaps with positive area."""
    x1, y1, x2, y2 = box
    c0, c1 = _cell(x1, n), _cell(math.nextafter(x2, -math.inf), n)
    r0, r1 = _cell(y1, n), _cell(math.nextafter(y2, -math.inf), n)
    return [(c, r) for r in range(r0, r1 + 1) for c in range(c0, c1 + 1)]


def _node_ids(labels: Sequence[str]) -> list[str]:
    """`red_circle_01` style ids, numbered per label as the paper's AST numbers its nodes."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        base = "_".join(_words(label)) or "object"
        seen[base] = seen.get(base, 0) + 1
        out.append(f"{base}_{seen[base]:02d}")
    return out


def landmark_text(objects: Sequence[dict], footprint: str, cameras: Sequence[str] = ()) -> str:
    """The AST: metadata then one node per object (centre, footprint, area in the normalised frame)."""
    fmt = "Rectangle (center, width, height)" if footprint == "rectangle" else "Ellipse (center, semi_axes)"
    lines = [
        "Map_Metadata:",
        f"  Coordinate_System: 2D normalised image grid [0, {NORM}], x right, y down",
        "  Note: no depth in this sample, so positions are in the first image's plane, not metric",
        f"  AST_Format: {fmt}",
        *cameras,
        "Spatial_Hierarchy:",
    ]
    for node, o in zip(_node_ids([o["label"] for o in objects]), objects):
        x1, y1, x2, y2 = o["box"]
        w, h = x2 - x1, y2 - y1
        lines.append(f"- Node_ID: {node}")
        lines.append(f"  Center: ({fmt_num((x1 + x2) / 2)}, {fmt_num((y1 + y2) / 2)})")
        if footprint == "rectangle":
            lines.append(f"  Width: {fmt_num(w)} Height: {fmt_num(h)} Area: {fmt_num(w * h)}")
        else:
            lines.append(f"  Semi_Axes: ({fmt_num(w / 2)}, {fmt_num(h / 2)}) Area: {fmt_num(math.pi * w * h / 4)}")
    return "\n".join(lines)


def route_grid(objects: Sequence[dict]) -> list[str]:
    """The route grid's rows, top first: '#' a cell some object covers, '.' a traversable one."""
    occupied = {cell for o in objects for cell in _covered_cells(o["box"], ROUTE_GRID)}
    return ["".join("#" if (c, r) in occupied else "." for c in range(ROUTE_GRID)) for r in range(ROUTE_GRID)]


def route_text(objects: Sequence[dict]) -> str:
    """Route knowledge: the grid's size, the count of traversable cells and the grid itself."""
    rows = route_grid(objects)
    return "\n".join([
        "Route_Knowledge_Metadata:",
        f"  Grid_Divisions: {ROUTE_GRID} Cell_Size: {NORM // ROUTE_GRID}",
        f"  Total_Traversable_Cells: {sum(row.count('.') for row in rows)}",
        "Traversable_Grid: (row 0 at the top, '#' occupied, '.' traversable)",
        *rows,
    ])


def render_view(objects: Sequence[dict], kind: str, side: int = PICTURE_SIDE) -> np.ndarray:
    """The top-down picture: `landmark_vis` fills each object's footprint with its node colour (later nodes on
    top) on white, with a light 3x3 guide grid; `route_vis` paints the route grid's occupied cells dark."""
    image = Image.new("RGB", (side, side), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    scale = side / NORM
    if kind == "landmark_vis":
        for k in range(1, LAYOUT_GRID):
            at = round(k * side / LAYOUT_GRID)
            draw.line([(at, 0), (at, side - 1)], fill=(200, 200, 200))
            draw.line([(0, at), (side - 1, at)], fill=(200, 200, 200))
        for i, o in enumerate(objects):
            x1, y1, x2, y2 = (v * scale for v in o["box"])
            draw.rectangle([x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)], fill=_PALETTE[i % len(_PALETTE)])
    else:
        cell = side / ROUTE_GRID
        for r, row in enumerate(route_grid(objects)):
            for c, mark in enumerate(row):
                if mark == "#":
                    draw.rectangle([c * cell, r * cell, (c + 1) * cell - 1, (r + 1) * cell - 1], fill=(40, 40, 40))
    return np.asarray(image, np.uint8)


def _choice(arguments: Mapping[str, Any], key: str, allowed: Sequence[str]) -> str | None:
    value = str(arguments[key]).strip().lower()
    return value if value in allowed else None


def world2mind(arguments: Mapping[str, Any], sample) -> str:
    """World2Mind(C, k, f, s) (AlloSpatial §3.2) on arguments holding every required key: the requested categories'
    landmark AST and/or route knowledge."""
    categories = arguments["categories"]
    if isinstance(categories, str):
        categories = [categories]
    if not isinstance(categories, (list, tuple)) or not all(isinstance(c, str) for c in categories):
        return error("categories must be a list of category names")
    checks = {"knowledge_type": KNOWLEDGE_TYPES, "output_format": FOOTPRINTS, "scene_type": SCENE_TYPES}
    values = {}
    for key, allowed in checks.items():
        values[key] = _choice(arguments, key, allowed)
        if values[key] is None:
            return error(f"{key} {clean(arguments[key])!r} is not one of {', '.join(allowed)}")
    objects = scene_objects(sample)
    if isinstance(objects, str):
        return objects
    chosen = [o for o in objects if any(matches(c, o["label"]) for c in categories)]
    if not chosen:
        return error("none of the requested categories was found in the scene")
    parts = []
    if values["knowledge_type"] in ("landmark", "both"):
        parts.append(landmark_text(chosen, values["output_format"], camera_views(sample)))
    if values["knowledge_type"] in ("route", "both"):
        parts.append(route_text(objects))  # every object blocks a route, asked for or not
    return "\n".join(parts)


def layout_text(objects: Sequence[dict]) -> str:
    """The 3x3 layout caption: the objects in each cell (an object belongs to the cell of its centre)."""
    cells: dict[tuple[int, int], list[str]] = {}
    for o in objects:
        x1, y1, x2, y2 = o["box"]
        key = (_cell((y1 + y2) / 2, LAYOUT_GRID), _cell((x1 + x2) / 2, LAYOUT_GRID))
        cells.setdefault(key, []).append(o["label"])
    lines = ["Top-down landmark layout (3x3):"]
    for r, row in enumerate(_ROWS):
        for c, col in enumerate(_COLS):
            lines.append(f"{row}-{col}: {', '.join(cells.get((r, c), [])) or 'empty'}")
    return "\n".join(lines)


def view(arguments: Mapping[str, Any], sample) -> tuple[str, np.ndarray | None]:
    """The rendered view on arguments holding `visualization_type`: (caption, picture), or (error text, None)."""
    kind = _choice(arguments, "visualization_type", VISUALIZATION_TYPES)
    if kind is None:
        return error(f"visualization_type {clean(arguments['visualization_type'])!r} is not one of "
                     f"{', '.join(VISUALIZATION_TYPES)}"), None
    objects = scene_objects(sample)
    if isinstance(objects, str):
        return objects, None
    if kind == "landmark_vis":
        caption = layout_text(objects)
    else:
        caption = "\n".join([f"Top-down route map ({ROUTE_GRID}x{ROUTE_GRID}, row 0 at the top):",
                             *route_grid(objects)])
    return caption, render_view(objects, kind)
