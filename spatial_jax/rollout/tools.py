"""AlloSpatial's tools for the synthetic world: World2Mind maps and a top-down view, computed from the sample itself.

The paper's World2Mind reconstructs a scene and returns an Allocentric-Spatial Tree (AST): landmark nodes with
centre, footprint and attributes in one absolute frame, plus route knowledge (a grid of traversable cells) on
request (AlloSpatial §3.2, App. D). The synthetic world already knows its objects (`sample.meta["objects"]`, pixel
boxes), so these tools are exact, deterministic analogues: the AST lists the requested objects in the normalised
[0, 1000] image frame (x right, y down) and the route grid marks the cells an object covers. `view_image` stands for
the rendered top-down visualisation with a text description (a 3x3 occupancy layout or the route grid).

A tool is called as `tool(arguments, sample) -> str`; every problem (unknown value, no map for this sample) comes
back as an "Error: ..." text for the model to read, never as an exception.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from typing import Any

from spatial_jax.rewards.parse_harness import VIEW_IMAGE, WORLD2MIND, ToolCall, ToolSchema

NORM = 1000  # the normalised frame's extent (SPEC 1.1)
KNOWLEDGE_TYPES = ("landmark", "route", "both")
FOOTPRINTS = ("rectangle", "ellipse")
SCENE_TYPES = ("indoor", "outdoor")
VISUALIZATION_TYPES = ("landmark_vis", "route_vis")
ROUTE_GRID = 10  # route cells per side, as the paper's Grid_Divisions
LAYOUT_GRID = 3  # the coarse view's cells per side
_ROWS = ("top", "middle", "bottom")
_COLS = ("left", "centre", "right")


def error(message: str) -> str:
    return f"Error: {message}"


def _clean(value: Any, limit: int = 40) -> str:
    """A model-supplied value shown back in an error: printable, no markup, bounded length."""
    text = "".join(c for c in str(value) if c.isalnum() or c in " _.-")
    return text[:limit]


def scene_objects(sample) -> list[dict] | str:
    """[{"label", "box"}] with boxes in the normalised frame (floats), or an error text when the sample has no map."""
    meta = getattr(sample, "meta", None) or {}
    objects = meta.get("objects")
    size = getattr(sample, "image_size", None)
    if not objects or not size:
        return error("no scene map is available for this sample")
    try:
        width, height = (float(v) for v in size)
        out = []
        for o in objects:
            x1, y1, x2, y2 = (float(v) for v in o["bbox"])
            out.append({"label": str(o["label"]),
                        "box": (x1 * NORM / width, y1 * NORM / height, x2 * NORM / width, y2 * NORM / height)})
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return error("this sample's scene map is malformed")
    return out


def _words(text: str) -> tuple[str, ...]:
    return tuple(str(text).lower().replace("_", " ").split())


def matches(category: str, label: str) -> bool:
    """A category names an object when all its words are in the label ("circle" and "red circle" name "red circle")."""
    words = _words(category)
    return bool(words) and set(words) <= set(_words(label))


def _num(v: float) -> str:
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


def landmark_text(objects: Sequence[dict], footprint: str) -> str:
    """The AST: metadata then one node per object (centre, footprint, area in the normalised frame)."""
    fmt = "Rectangle (center, width, height)" if footprint == "rectangle" else "Ellipse (center, semi_axes)"
    lines = [
        "Map_Metadata:",
        f"  Coordinate_System: 2D normalised image grid [0, {NORM}], x right, y down",
        f"  AST_Format: {fmt}",
        "Spatial_Hierarchy:",
    ]
    for node, o in zip(_node_ids([o["label"] for o in objects]), objects):
        x1, y1, x2, y2 = o["box"]
        w, h = x2 - x1, y2 - y1
        lines.append(f"- Node_ID: {node}")
        lines.append(f"  Center: ({_num((x1 + x2) / 2)}, {_num((y1 + y2) / 2)})")
        if footprint == "rectangle":
            lines.append(f"  Width: {_num(w)} Height: {_num(h)} Area: {_num(w * h)}")
        else:
            lines.append(f"  Semi_Axes: ({_num(w / 2)}, {_num(h / 2)}) Area: {_num(math.pi * w * h / 4)}")
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


class Tool(abc.ABC):
    """A callable tool with the harness schema's name and required arguments; subclasses implement `run` on
    arguments that hold every required key."""

    schema: ToolSchema

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def required(self) -> tuple[str, ...]:
        return self.schema.required

    def __call__(self, arguments: Mapping[str, Any], sample) -> str:
        if not isinstance(arguments, Mapping):
            return error(f"{self.name} takes a JSON object of arguments")
        missing = [k for k in self.required if arguments.get(k) in (None, "", [], {})]
        if missing:
            return error(f"{self.name} is missing required argument(s): {', '.join(missing)}")
        return self.run(arguments, sample)

    @abc.abstractmethod
    def run(self, arguments: Mapping[str, Any], sample) -> str:
        """The tool's text output (or an `error(...)` text)."""


def _choice(arguments: Mapping[str, Any], key: str, allowed: Sequence[str]) -> str | None:
    value = str(arguments[key]).strip().lower()
    return value if value in allowed else None


class World2Mind(Tool):
    """World2Mind(C, k, f, s) (AlloSpatial §3.2): the requested categories' landmark AST and/or route knowledge."""

    schema = WORLD2MIND

    def run(self, arguments: Mapping[str, Any], sample) -> str:
        categories = arguments["categories"]
        if isinstance(categories, str):
            categories = [categories]
        if not isinstance(categories, (list, tuple)) or not all(isinstance(c, str) for c in categories):
            return error("categories must be a list of category names")
        checks = {
            "knowledge_type": KNOWLEDGE_TYPES, "output_format": FOOTPRINTS, "scene_type": SCENE_TYPES,
        }
        values = {}
        for key, allowed in checks.items():
            values[key] = _choice(arguments, key, allowed)
            if values[key] is None:
                return error(f"{key} {_clean(arguments[key])!r} is not one of {', '.join(allowed)}")
        objects = scene_objects(sample)
        if isinstance(objects, str):
            return objects
        chosen = [o for o in objects if any(matches(c, o["label"]) for c in categories)]
        if not chosen:
            return error("none of the requested categories was found in the scene")
        parts = []
        if values["knowledge_type"] in ("landmark", "both"):
            parts.append(landmark_text(chosen, values["output_format"]))
        if values["knowledge_type"] in ("route", "both"):
            parts.append(route_text(objects))  # every object blocks a route, asked for or not
        return "\n".join(parts)


class ViewImage(Tool):
    """The top-down visualisation as text: `landmark_vis` names the objects in each cell of a 3x3 layout (an object
    belongs to the cell of its centre); `route_vis` draws the route grid ('#' occupied, '.' traversable)."""

    schema = VIEW_IMAGE

    def run(self, arguments: Mapping[str, Any], sample) -> str:
        kind = _choice(arguments, "visualization_type", VISUALIZATION_TYPES)
        if kind is None:
            return error(f"visualization_type {_clean(arguments['visualization_type'])!r} is not one of "
                         f"{', '.join(VISUALIZATION_TYPES)}")
        objects = scene_objects(sample)
        if isinstance(objects, str):
            return objects
        if kind == "landmark_vis":
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
        return "\n".join([f"Top-down route map ({ROUTE_GRID}x{ROUTE_GRID}, row 0 at the top):", *route_grid(objects)])


def default_tools() -> dict[str, Tool]:
    """The registry: tool name -> tool, one per harness schema."""
    return {tool.name: tool for tool in (World2Mind(), ViewImage())}


def run_call(call: ToolCall | None, tools: Mapping[str, Tool], sample) -> str:
    """The text a parsed `<tool_call>` gets back: the tool's output, or an error for a call that cannot run."""
    if call is None:
        return error("no complete tool call was found in this turn")
    if call.name is None or call.arguments is None:
        return error("the tool call is not valid JSON of the form {\"name\": ..., \"arguments\": {...}}")
    tool = tools.get(call.name)
    if tool is None:
        return error(f"unknown tool {_clean(call.name)!r}; available: {', '.join(sorted(tools))}")
    return tool(call.arguments, sample)
