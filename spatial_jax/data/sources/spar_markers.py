"""The markers a SPAR-7M row points at (`red_point`, `blue_bbox`, ... in a 0-1000 frame), drawn onto its pictures when
the row is read, as the authors' loader does (LogosRoboticsGroup/SPAR: datasets/toy_dataset.py, SPARDataset.draw_image,
calls datasets/draw_marker.py's DRAW_FUNCTIONS by the row's `type` on every row it loads).

Read from draw_marker.py: which task draws which markers on which picture (the first list of `point_img_idx` for
points, of `bbox_img_idx` for boxes, names the picture by the marker's place in the task's drawing order; single-view
tasks and position_matching draw on the first picture); a marker's coordinates are its first entry (`[[x, y]]`,
`[[x1, y1, x2, y2]]`) times width / 1000 and height / 1000, truncated to integers; a point is a disc of radius 20 px
filled in PIL's named colour (draw_points), a box its outline grown by 17.5 px drawn 20 px wide (draw_thick_bbox);
PIL's names give red (255, 0, 0), blue (0, 0, 255), green (0, 128, 0), yellow (255, 255, 0). Sizes are pixels
whatever the picture's size. The tasks drawn with cv2: spatial_imagination_map_mv (`bbox_list`, boxes (0, 0, 255) on
the RGB array, so blue, with `object<i>` in green (0, 255, 0) below the box's right corner, above it where that leaves
the picture), distance_infer_center_oo_video (`point_list`, blue discs of radius 20, `objectA` then `object<i>` in
green 20 px right and below), spatial_imagination_o[co]_video (green, blue, red, yellow boxes drawn in BGR, so
yellow's (225, 225, 0) is (0, 225, 225) in RGB, each labelled `object<i>` in white on a box of its colour); their boxes
are grown by 20 px, drawn with a 20 px line.

Inferred (cv2 is no dependency here): cv2's 20 px line, centred on the grown box, drawn as a PIL outline from 10 px
outside it to 10 px inside (square corners); the labels' Hershey simplex at scale 2, thickness 10, drawn in PIL's
default font at 56 px (about its height) with a 2 px stroke. A marker the row does not carry is not drawn (the
authors' code raises KeyError for some); a row with markers whose task has no drawing rule is refused, naming `type`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from spatial_jax.data.sources.rows import Row
from spatial_jax.records import brief

# the single-view tasks and position_matching: their markers on the first picture
_ON_FIRST = {
    "obj_spatial_relation_oo": ("red_bbox", "blue_bbox"),
    "depth_prediction_oc": ("red_point", "blue_point"),
    "depth_prediction_oo": ("red_point", "blue_point", "green_point"),
    "distance_prediction_oc": ("red_point",),
    "distance_prediction_oo": ("red_point", "blue_point"),
    "distance_infer_center_oo": ("red_point", "blue_point", "green_point"),
    "spatial_volume_infer": ("red_bbox",),
    "spatial_imagination_oc": ("red_bbox", "blue_bbox", "green_bbox"),
    "spatial_imagination_oo": ("red_bbox", "blue_bbox", "green_bbox", "yellow_bbox"),
    "position_matching": ("red_bbox",),
}
# task -> (marker field, its place in the picture index list) in draw_marker.py's order; None: the first picture
PIL_TASKS: dict[str, tuple[tuple[str, int | None], ...]] = {
    **{task: tuple((key, None) for key in keys) for task, keys in _ON_FIRST.items()},
    "depth_prediction_oc_mv": (("red_point", 0), ("blue_point", 1)),
    "depth_prediction_oo_mv": (("red_point", 0), ("blue_point", 1), ("green_point", 2)),
    "distance_prediction_oc_mv": (("red_point", 0),),
    "distance_prediction_oo_mv": (("red_point", 0), ("blue_point", 1)),
    "obj_spatial_relation_oc_mv": (("red_bbox", 0), ("blue_bbox", 0), ("green_bbox", 0)),
    "distance_infer_center_oo_mv": (("red_point", 0), ("green_point", 1), ("blue_point", 2)),
    "spatial_imagination_oc_mv": (("red_bbox", 2), ("green_bbox", 0), ("blue_bbox", 1)),
    "spatial_imagination_oo_mv": (("red_bbox", 2), ("green_bbox", 0), ("blue_bbox", 1), ("yellow_bbox", 3)),
    "distance_prediction_oo_video": (("red_point", 0), ("blue_point", 1)),
    "obj_frame_locate": (("red_bbox", 0),),
}
# the imagination videos' boxes in order (their place is also their label's number), colours as RGB
_TAGGED = (("green_bbox", (0, 255, 0)), ("blue_bbox", (0, 0, 255)), ("red_bbox", (255, 0, 0)),
           ("yellow_bbox", (0, 225, 225)))
CV_TASKS = {"spatial_imagination_oo_video": _TAGGED, "spatial_imagination_oc_video": _TAGGED[:3]}
# tasks whose draw function draws nothing
UNMARKED = frozenset({"distance_infer_center_oc", "view_change_infer", "distance_infer_center_oc_mv",
                      "camera_motion_infer", "spatial_imagination_oc_video_hard", "spatial_imagination_oo_video_hard",
                      "appearance_order", "room_size", "nav", "obj_count"})
BLUE, LABEL = (0, 0, 255), (0, 255, 0)
FONT_PX, TEXT_STROKE = 56, 2


@dataclasses.dataclass(frozen=True)
class Mark:
    key: str  # the row's field that holds it
    view: int  # the picture it is drawn on
    shape: str  # "point" / "box" (draw_marker's PIL drawing), "cv_point" / "cv_box" (its cv2 drawing)
    at: tuple[float, ...]  # (x, y) or (x1, y1, x2, y2) in the 0-1000 frame
    colour: Any  # a PIL colour name or an RGB triple
    label: str = ""
    tagged: bool = False  # the label in white on a box of the colour


def draw(row: Row, pictures: list, field: str) -> list:
    """The pictures with the row's markers drawn: one that gets a marker becomes an RGB uint8 array, the others stay
    as they are."""
    from PIL import ImageDraw

    marks: dict[int, list[Mark]] = {}
    for m in _marks(row, len(pictures)):
        marks.setdefault(m.view, []).append(m)
    out = list(pictures)
    for view, ms in marks.items():
        image = _open(row, pictures[view], f"{field}[{view}]")
        pen = ImageDraw.Draw(image)
        for m in ms:
            try:
                _paint(pen, image.size, m)
            except ValueError as e:  # PIL refuses a box whose corners are swapped
                raise row.error(f"field '{m.key}': cannot be drawn on picture {view} ({e})") from None
        out[view] = np.array(image)
    return out


def _marks(row: Row, count: int) -> list[Mark]:
    raw = row.get("type")
    task = raw if isinstance(raw, str) else ""  # a type that is no name has no drawing rule
    if task in PIL_TASKS:
        return [_keyed(row, key, slot, count) for key, slot in PIL_TASKS[task] if row.get(key) is not None]
    if task == "obj_spatial_relation_oo_mv":  # the two boxes it carries, in this order, on the first two places
        keys = [k for k in ("red_bbox", "blue_bbox", "green_bbox") if row.get(k) is not None]
        return [_keyed(row, key, slot, count) for slot, key in enumerate(keys)]
    if task in CV_TASKS:
        return [dataclasses.replace(_keyed(row, key, slot, count), shape="cv_box", colour=colour,
                                    label=f"object{slot}", tagged=True)
                for slot, (key, colour) in enumerate(CV_TASKS[task]) if row.get(key) is not None]
    if task == "spatial_imagination_map_mv":
        return [Mark("bbox_list", _view(row, "bbox_img_idx", i, count), "cv_box", _coords(row, "bbox_list", b, 4),
                     BLUE, f"object{i}") for i, b in enumerate(_listed(row, "bbox_list"))]
    if task == "distance_infer_center_oo_video":
        return [Mark("point_list", _view(row, "point_img_idx", i, count), "cv_point",
                     _coords(row, "point_list", p, 2), BLUE, "objectA" if i == 0 else f"object{i - 1}")
                for i, p in enumerate(_listed(row, "point_list"))]
    carried = sorted(k for k in row.data if k.endswith(("_point", "_bbox", "_list")))
    if task in UNMARKED or not carried:
        return []
    raise row.error(f"field 'type' = {brief(raw)} is no SPAR-7M task with a drawing rule for its markers {carried}")


def _keyed(row: Row, key: str, slot: int | None, count: int) -> Mark:
    point = key.endswith("_point")
    value = row.get(key)
    first = value[0] if isinstance(value, list) and value else value
    view = 0 if slot is None else _view(row, "point_img_idx" if point else "bbox_img_idx", slot, count)
    return Mark(key, view, "point" if point else "box", _coords(row, key, first, 2 if point else 4), key.split("_")[0])


def _listed(row: Row, key: str) -> list:
    value = row.get(key)
    if not (isinstance(value, list) and value and isinstance(value[0], list)):
        raise row.error(f"field '{key}' must be a list holding one list of markers, got {brief(value)}")
    return value[0]


def _coords(row: Row, key: str, value: Any, size: int) -> tuple[float, ...]:
    if not (isinstance(value, list) and len(value) == size
            and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in value)):
        shape = "[x, y]" if size == 2 else "[x1, y1, x2, y2]"
        raise row.error(f"field '{key}' must hold {shape} in the 0-1000 frame, got {brief(value)}")
    return tuple(float(c) for c in value)


def _view(row: Row, key: str, slot: int, count: int) -> int:
    value = row.get(key)
    places = value[0] if isinstance(value, list) and value and isinstance(value[0], list) else None
    view = places[slot] if places is not None and slot < len(places) else None
    if not isinstance(view, int) or isinstance(view, bool) or not 0 <= view < count:
        raise row.error(f"field '{key}' = {brief(value)} names no picture (of the row's {count}) for marker {slot}")
    return view


def _open(row: Row, ref: Any, field: str):
    from PIL import Image

    if isinstance(ref, np.ndarray):
        return Image.fromarray(ref)
    try:
        with Image.open(ref) as im:
            return im.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise row.error(f"field '{field}': image {ref} cannot be read to draw its markers ({e})") from None


def _paint(pen, size: tuple[int, int], m: Mark) -> None:
    w, h = size
    # draw_marker scales as (c / 1000) * side and truncates
    x, y, *rest = (int((c / 1000) * s) for c, s in zip(m.at, (w, h, w, h)))
    if m.shape in ("point", "cv_point"):
        pen.ellipse([x - 20, y - 20, x + 20, y + 20], fill=m.colour)
        if m.label:
            _text(pen, (x + 20, y + 20), m.label, LABEL)
    elif m.shape == "box":
        b = [(c / 1000) * s for c, s in zip(m.at, (w, h, w, h))]
        pen.rectangle([int(b[0] - 17.5), int(b[1] - 17.5), int(b[2] + 17.5), int(b[3] + 17.5)], outline=m.colour,
                      width=20)
    else:
        x2, y2 = rest
        pen.rectangle([x - 30, y - 30, x2 + 30, y2 + 30], outline=m.colour, width=20)
        _box_label(pen, m, x2, y2, h)


def _box_label(pen, m: Mark, x2: int, y2: int, h: int) -> None:
    """The label under the box's right corner (cv2's text origin is its baseline's left end)."""
    left, top, right, _ = _font().getbbox(m.label, anchor="ls", stroke_width=TEXT_STROKE)
    tw, th = right - left, -top
    if not m.tagged:
        _text(pen, (x2 - tw, y2 + th if y2 + th <= h else y2 - th), m.label, LABEL)
        return
    tx, ty = x2 - tw, y2 + th if y2 + th <= h else y2 - 5
    pen.rectangle([tx, ty - th, tx + tw, ty + 5], fill=m.colour)
    _text(pen, (tx, ty), m.label, (255, 255, 255))


def _text(pen, at: tuple[int, int], label: str, colour) -> None:
    pen.text(at, label, fill=colour, font=_font(), anchor="ls", stroke_width=TEXT_STROKE, stroke_fill=colour)


@functools.lru_cache(maxsize=1)
def _font():
    from PIL import ImageFont

    return ImageFont.load_default(size=FONT_PX)
