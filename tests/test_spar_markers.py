"""SPAR-7M's markers (data/sources/spar_markers.py) against the authors' drawing code, LogosRoboticsGroup/SPAR
datasets/draw_marker.py: which task marks which points and boxes on which picture (DRAW_FUNCTIONS, every task in it),
and the painted pictures pixel by pixel: a point a disc of radius 20 px, a box's outline grown by 17.5 px and 20 px
wide (draw_thick_bbox), the cv2 tasks' boxes grown by 20 px with a 20 px line and their `object<i>` labels below the
box's right corner (above it where that leaves the picture), the imagination videos' labels white on a box of the
marker's colour. Each expected picture is built here from the pinned pixel positions (numpy discs and bands; the
labels drawn at their pinned places in the 56 px default font the module documents), not from the module's sums.
Rows are written as the dataset holds them (`type`, `image`, `red_point` [[x, y]] in a 0-1000 frame, `point_img_idx`
[[...]]), and every refusal is checked as the one line a user reads."""

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from spatial_jax.data.sample import DatasetError
from spatial_jax.data.sources.rows import Row
from spatial_jax.data.sources.spar_markers import _marks, draw

W, H = 640, 480
GREY = (90, 90, 90)
WHERE = "spar/scannet/qa_jsonl/train/t/fill/fill_1.jsonl:1"
# PIL's named colours (draw_marker.py passes names to ImageDraw); the cv2 tasks' colours as they land in RGB
RED, BLUE, GREEN, YELLOW = (255, 0, 0), (0, 0, 255), (0, 128, 0), (255, 255, 0)
CV_GREEN, CV_YELLOW, WHITE = (0, 255, 0), (0, 225, 225), (255, 255, 255)

# markers as rows carry them: [[x, y]] / [[x1, y1, x2, y2]] in the 0-1000 frame
RP, BP, GP = [[512, 384]], [[500, 875]], [[880, 90]]
RB, BB, GB, YB = [[100, 150, 300, 420]], [[450, 200, 900, 650]], [[50, 600, 250, 950]], [[720, 80, 980, 330]]


def row(task, **fields) -> Row:
    return Row({"id": "scene0000_00_7", "type": task, **fields}, WHERE)


def marks(r: Row, count: int) -> list[tuple]:
    return [(m.key, m.view, m.shape, m.at, m.colour, m.label, m.tagged) for m in _marks(r, count)]


def P(key, view, at, colour):  # a PIL point / box as draw_points / draw_thick_bbox draw it
    return (key, view, "point", tuple(float(c) for c in at[0]), colour, "", False)


def B(key, view, at, colour):
    return (key, view, "box", tuple(float(c) for c in at[0]), colour, "", False)


def TAG(key, view, at, colour, label):  # the imagination videos' boxes, labelled white on their colour
    return (key, view, "cv_box", tuple(float(c) for c in at[0]), colour, label, True)


# draw_marker.py's DRAW_FUNCTIONS, one realistic row per task: (task, its row's fields, pictures, expected markers)
MV = {"point_img_idx": [[3, 1, 4]], "bbox_img_idx": [[2, 4, 1, 3]]}
TABLE = [
    # single view: all on the one picture, in the draw function's order
    ("obj_spatial_relation_oo", {"red_bbox": RB, "blue_bbox": BB}, 1,
     [B("red_bbox", 0, RB, "red"), B("blue_bbox", 0, BB, "blue")]),
    ("depth_prediction_oc", {"red_point": RP, "blue_point": BP}, 1,
     [P("red_point", 0, RP, "red"), P("blue_point", 0, BP, "blue")]),
    ("depth_prediction_oo", {"red_point": RP, "blue_point": BP, "green_point": GP}, 1,
     [P("red_point", 0, RP, "red"), P("blue_point", 0, BP, "blue"), P("green_point", 0, GP, "green")]),
    ("distance_prediction_oc", {"red_point": RP}, 1, [P("red_point", 0, RP, "red")]),
    ("distance_prediction_oo", {"red_point": RP, "blue_point": BP}, 1,
     [P("red_point", 0, RP, "red"), P("blue_point", 0, BP, "blue")]),
    ("distance_infer_center_oo", {"red_point": RP, "blue_point": BP, "green_point": GP}, 1,
     [P("red_point", 0, RP, "red"), P("blue_point", 0, BP, "blue"), P("green_point", 0, GP, "green")]),
    ("spatial_volume_infer", {"red_bbox": RB}, 1, [B("red_bbox", 0, RB, "red")]),
    ("spatial_imagination_oc", {"red_bbox": RB, "blue_bbox": BB, "green_bbox": GB}, 1,
     [B("red_bbox", 0, RB, "red"), B("blue_bbox", 0, BB, "blue"), B("green_bbox", 0, GB, "green")]),
    ("spatial_imagination_oo", {"red_bbox": RB, "blue_bbox": BB, "green_bbox": GB, "yellow_bbox": YB}, 1,
     [B("red_bbox", 0, RB, "red"), B("blue_bbox", 0, BB, "blue"), B("green_bbox", 0, GB, "green"),
      B("yellow_bbox", 0, YB, "yellow")]),
    # multi-view: images[0] for position_matching, else the marker's place in point_img_idx / bbox_img_idx
    ("position_matching", {"red_bbox": RB}, 2, [B("red_bbox", 0, RB, "red")]),
    ("depth_prediction_oc_mv", {"red_point": RP, "blue_point": BP, **MV}, 5,
     [P("red_point", 3, RP, "red"), P("blue_point", 1, BP, "blue")]),
    ("depth_prediction_oo_mv", {"red_point": RP, "blue_point": BP, "green_point": GP, **MV}, 5,
     [P("red_point", 3, RP, "red"), P("blue_point", 1, BP, "blue"), P("green_point", 4, GP, "green")]),
    ("distance_prediction_oc_mv", {"red_point": RP, **MV}, 5, [P("red_point", 3, RP, "red")]),
    ("distance_prediction_oo_mv", {"red_point": RP, "blue_point": BP, **MV}, 5,
     [P("red_point", 3, RP, "red"), P("blue_point", 1, BP, "blue")]),
    ("obj_spatial_relation_oc_mv", {"red_bbox": RB, "blue_bbox": BB, "green_bbox": GB, **MV}, 5,
     [B("red_bbox", 2, RB, "red"), B("blue_bbox", 2, BB, "blue"), B("green_bbox", 2, GB, "green")]),
    ("obj_spatial_relation_oc_mv", {"blue_bbox": BB, **MV}, 5, [B("blue_bbox", 2, BB, "blue")]),
    # the two boxes it carries, the first on image_idx[0], the second on image_idx[1]
    ("obj_spatial_relation_oo_mv", {"red_bbox": RB, "blue_bbox": BB, **MV}, 5,
     [B("red_bbox", 2, RB, "red"), B("blue_bbox", 4, BB, "blue")]),
    ("obj_spatial_relation_oo_mv", {"red_bbox": RB, "green_bbox": GB, **MV}, 5,
     [B("red_bbox", 2, RB, "red"), B("green_bbox", 4, GB, "green")]),
    ("obj_spatial_relation_oo_mv", {"blue_bbox": BB, "green_bbox": GB, **MV}, 5,
     [B("blue_bbox", 2, BB, "blue"), B("green_bbox", 4, GB, "green")]),
    ("distance_infer_center_oo_mv", {"red_point": RP, "blue_point": BP, "green_point": GP, **MV}, 5,
     [P("red_point", 3, RP, "red"), P("green_point", 1, GP, "green"), P("blue_point", 4, BP, "blue")]),
    ("spatial_imagination_oc_mv", {"red_bbox": RB, "blue_bbox": BB, "green_bbox": GB, **MV}, 5,
     [B("red_bbox", 1, RB, "red"), B("green_bbox", 2, GB, "green"), B("blue_bbox", 4, BB, "blue")]),
    ("spatial_imagination_oo_mv", {"red_bbox": RB, "blue_bbox": BB, "green_bbox": GB, "yellow_bbox": YB, **MV}, 5,
     [B("red_bbox", 1, RB, "red"), B("green_bbox", 2, GB, "green"), B("blue_bbox", 4, BB, "blue"),
      B("yellow_bbox", 3, YB, "yellow")]),
    ("spatial_imagination_map_mv", {"bbox_list": [RB + BB + GB], "bbox_img_idx": [[2, 4, 2]]}, 5,
     [("bbox_list", 2, "cv_box", (100.0, 150.0, 300.0, 420.0), BLUE, "object0", False),
      ("bbox_list", 4, "cv_box", (450.0, 200.0, 900.0, 650.0), BLUE, "object1", False),
      ("bbox_list", 2, "cv_box", (50.0, 600.0, 250.0, 950.0), BLUE, "object2", False)]),
    # video frames
    ("distance_prediction_oo_video", {"red_point": RP, "blue_point": BP, "point_img_idx": [[3, 8]]}, 12,
     [P("red_point", 3, RP, "red"), P("blue_point", 8, BP, "blue")]),
    ("obj_frame_locate", {"red_bbox": RB, "bbox_img_idx": [[7]]}, 12, [B("red_bbox", 7, RB, "red")]),
    ("distance_infer_center_oo_video", {"point_list": [RP + BP + GP], "point_img_idx": [[0, 6, 11]]}, 12,
     [("point_list", 0, "cv_point", (512.0, 384.0), BLUE, "objectA", False),
      ("point_list", 6, "cv_point", (500.0, 875.0), BLUE, "object0", False),
      ("point_list", 11, "cv_point", (880.0, 90.0), BLUE, "object1", False)]),
    ("spatial_imagination_oo_video",
     {"green_bbox": GB, "blue_bbox": BB, "red_bbox": RB, "yellow_bbox": YB, "bbox_img_idx": [[0, 3, 7, 11]]}, 12,
     [TAG("green_bbox", 0, GB, CV_GREEN, "object0"), TAG("blue_bbox", 3, BB, BLUE, "object1"),
      TAG("red_bbox", 7, RB, RED, "object2"), TAG("yellow_bbox", 11, YB, CV_YELLOW, "object3")]),
    ("spatial_imagination_oc_video", {"green_bbox": GB, "blue_bbox": BB, "red_bbox": RB, "bbox_img_idx": [[0, 3, 7]]},
     12, [TAG("green_bbox", 0, GB, CV_GREEN, "object0"), TAG("blue_bbox", 3, BB, BLUE, "object1"),
          TAG("red_bbox", 7, RB, RED, "object2")]),
    # draw functions that `pass`: nothing drawn, whatever markers the row carries
    ("distance_infer_center_oc", {}, 1, []),
    ("view_change_infer", {}, 2, []),
    ("distance_infer_center_oc_mv", {}, 5, []),
    ("camera_motion_infer", {}, 5, []),
    ("spatial_imagination_oc_video_hard",
     {"green_bbox": GB, "blue_bbox": BB, "red_bbox": RB, "bbox_img_idx": [[0, 3, 7]]}, 12, []),
    ("spatial_imagination_oo_video_hard",
     {"green_bbox": GB, "blue_bbox": BB, "red_bbox": RB, "yellow_bbox": YB, "bbox_img_idx": [[0, 3, 7, 11]]}, 12, []),
    ("appearance_order", {}, 12, []),
    ("room_size", {}, 12, []),
    ("nav", {}, 12, []),
    ("obj_count", {}, 1, []),
]


@pytest.mark.parametrize(("task", "fields", "count", "want"), TABLE, ids=[f"{t[0]}-{i}" for i, t in enumerate(TABLE)])
def test_each_task_marks_what_draw_marker_draws_where_it_draws_it(task, fields, count, want):
    assert marks(row(task, **fields), count) == want


def test_every_draw_marker_task_has_a_rule():
    """The 35 keys of DRAW_FUNCTIONS, as draw_marker.py lists them: a row of each is read, none refused."""
    tasks = {
        "obj_spatial_relation_oo", "depth_prediction_oc", "depth_prediction_oo", "distance_prediction_oc",
        "distance_prediction_oo", "distance_infer_center_oc", "distance_infer_center_oo", "spatial_volume_infer",
        "spatial_imagination_oc", "spatial_imagination_oo", "position_matching", "view_change_infer",
        "depth_prediction_oc_mv", "depth_prediction_oo_mv", "distance_prediction_oc_mv", "distance_prediction_oo_mv",
        "obj_spatial_relation_oc_mv", "obj_spatial_relation_oo_mv", "distance_infer_center_oc_mv",
        "distance_infer_center_oo_mv", "spatial_imagination_oc_mv", "spatial_imagination_oo_mv",
        "spatial_imagination_map_mv", "camera_motion_infer", "distance_prediction_oo_video",
        "distance_infer_center_oo_video", "spatial_imagination_oo_video", "spatial_imagination_oc_video",
        "spatial_imagination_oc_video_hard", "spatial_imagination_oo_video_hard", "obj_frame_locate",
        "appearance_order", "room_size", "obj_count", "nav"}
    assert len(tasks) == 35 and {t[0] for t in TABLE} == tasks


def test_a_marked_task_missing_a_marker_draws_the_others():
    """draw_obj_spatial_relation_oc_mv draws only the boxes present; elsewhere the authors' code raises KeyError for
    an absent one, and the module draws the rest (its docstring)."""
    assert marks(row("spatial_imagination_oo_video", red_bbox=RB, bbox_img_idx=[[0, 3, 7, 11]]), 12) == [
        TAG("red_bbox", 7, RB, RED, "object2")]  # its label keeps its place in the drawing order
    assert marks(row("depth_prediction_oc", blue_point=BP, red_point=None), 1) == [P("blue_point", 0, BP, "blue")]


# --- rows whose markers cannot be drawn: one line naming file, row and field


def refusal(r: Row, count: int) -> str:
    with pytest.raises(DatasetError) as e:
        _marks(r, count)
    return str(e.value)


@pytest.mark.parametrize(("raw", "fields", "shown"), [
    ("depth_estimation", {"red_point": RP, "blue_point": BP}, "'depth_estimation'"),
    (["depth_prediction_oc"], {"red_point": RP}, "['depth_prediction_oc']"),  # a type that is no name
    ("my_task", {"blue_bbox": BB}, "'my_task'"),
    ("my_task", {"bbox_list": [RB], "point_img_idx": [[0]]}, "'my_task'"),
])
def test_markers_of_a_task_with_no_drawing_rule_are_refused_naming_type(raw, fields, shown):
    carried = sorted(k for k in fields if not k.endswith("_idx"))
    assert refusal(Row({"type": raw, **fields}, WHERE), 1) == (
        f"{WHERE}: field 'type' = {shown} is no SPAR-7M task with a drawing rule for its markers {carried}")


@pytest.mark.parametrize("data", [
    {"type": "my_task", "image": ["a.jpg"]},  # a task of another copy, carrying no marker
    {"image": ["a.jpg"], "point_img_idx": [[0]], "points": [[1, 2]]},  # no type, nothing named *_point/_bbox/_list
    {"type": 7, "image": ["a.jpg"]},
])
def test_a_row_with_no_markers_needs_no_rule(data):
    assert marks(Row(data, WHERE), 1) == []


@pytest.mark.parametrize(("task", "fields", "count", "message"), [
    # a marker that is no [[x, y]] / [[x1, y1, x2, y2]]
    ("depth_prediction_oc", {"red_point": [512, 384]}, 1,
     "field 'red_point' must hold [x, y] in the 0-1000 frame, got 512"),
    ("depth_prediction_oc", {"red_point": []}, 1, "field 'red_point' must hold [x, y] in the 0-1000 frame, got []"),
    ("depth_prediction_oc", {"red_point": "512, 384"}, 1,
     "field 'red_point' must hold [x, y] in the 0-1000 frame, got '512, 384'"),
    ("depth_prediction_oc", {"red_point": [[512, 384, 0]]}, 1,
     "field 'red_point' must hold [x, y] in the 0-1000 frame, got [512, 384, 0]"),
    ("depth_prediction_oc", {"red_point": [["512", "384"]]}, 1,
     "field 'red_point' must hold [x, y] in the 0-1000 frame, got ['512', '384']"),
    ("depth_prediction_oc", {"red_point": [[True, 384]]}, 1,
     "field 'red_point' must hold [x, y] in the 0-1000 frame, got [True, 384]"),
    ("spatial_volume_infer", {"red_bbox": [[512, 384]]}, 1,
     "field 'red_bbox' must hold [x1, y1, x2, y2] in the 0-1000 frame, got [512, 384]"),
    ("spatial_imagination_map_mv", {"bbox_list": [[[100, 150, 300]]], "bbox_img_idx": [[0]]}, 1,
     "field 'bbox_list' must hold [x1, y1, x2, y2] in the 0-1000 frame, got [100, 150, 300]"),
    ("distance_infer_center_oo_video", {"point_list": [[[512, 384, 7]]], "point_img_idx": [[0]]}, 12,
     "field 'point_list' must hold [x, y] in the 0-1000 frame, got [512, 384, 7]"),
    # the lists of the cv2 tasks
    ("spatial_imagination_map_mv", {"bbox_img_idx": [[0]]}, 1,
     "field 'bbox_list' must be a list holding one list of markers, got None"),
    ("spatial_imagination_map_mv", {"bbox_list": [], "bbox_img_idx": [[0]]}, 1,
     "field 'bbox_list' must be a list holding one list of markers, got []"),
    ("distance_infer_center_oo_video", {"point_list": [512, 384], "point_img_idx": [[0]]}, 12,
     "field 'point_list' must be a list holding one list of markers, got [512, 384]"),
    ("distance_infer_center_oo_video", {"point_list": "[[512, 384]]", "point_img_idx": [[0]]}, 12,
     "field 'point_list' must be a list holding one list of markers, got '[[512, 384]]'"),
    # the picture a marker is drawn on
    ("depth_prediction_oc_mv", {"red_point": RP, "blue_point": BP}, 3,
     "field 'point_img_idx' = None names no picture (of the row's 3) for marker 0"),
    ("depth_prediction_oc_mv", {"red_point": RP, "blue_point": BP, "point_img_idx": [0, 2]}, 3,
     "field 'point_img_idx' = [0, 2] names no picture (of the row's 3) for marker 0"),
    ("depth_prediction_oc_mv", {"red_point": RP, "blue_point": BP, "point_img_idx": []}, 3,
     "field 'point_img_idx' = [] names no picture (of the row's 3) for marker 0"),
    ("depth_prediction_oc_mv", {"red_point": RP, "blue_point": BP, "point_img_idx": [[0]]}, 3,
     "field 'point_img_idx' = [[0]] names no picture (of the row's 3) for marker 1"),
    ("depth_prediction_oc_mv", {"red_point": RP, "blue_point": BP, "point_img_idx": [[0, 3]]}, 3,
     "field 'point_img_idx' = [[0, 3]] names no picture (of the row's 3) for marker 1"),
    ("depth_prediction_oc_mv", {"red_point": RP, "blue_point": BP, "point_img_idx": [[-1, 2]]}, 3,
     "field 'point_img_idx' = [[-1, 2]] names no picture (of the row's 3) for marker 0"),
    ("depth_prediction_oc_mv", {"red_point": RP, "blue_point": BP, "point_img_idx": [[True, 2]]}, 3,
     "field 'point_img_idx' = [[True, 2]] names no picture (of the row's 3) for marker 0"),
    ("depth_prediction_oc_mv", {"red_point": RP, "blue_point": BP, "point_img_idx": [[0, 1.0]]}, 3,
     "field 'point_img_idx' = [[0, 1.0]] names no picture (of the row's 3) for marker 1"),
    ("obj_frame_locate", {"red_bbox": RB, "bbox_img_idx": [["7"]]}, 12,
     "field 'bbox_img_idx' = [['7']] names no picture (of the row's 12) for marker 0"),
    ("obj_spatial_relation_oo_mv", {"red_bbox": RB, "green_bbox": GB, "bbox_img_idx": [[0, 2]]}, 2,
     "field 'bbox_img_idx' = [[0, 2]] names no picture (of the row's 2) for marker 1"),
    ("spatial_imagination_map_mv", {"bbox_list": [RB + BB], "bbox_img_idx": [[0, 1]]}, 1,
     "field 'bbox_img_idx' = [[0, 1]] names no picture (of the row's 1) for marker 1"),
    ("distance_infer_center_oo_video", {"point_list": [RP + BP], "point_img_idx": [[0]]}, 12,
     "field 'point_img_idx' = [[0]] names no picture (of the row's 12) for marker 1"),
    ("spatial_imagination_oc_video", {"green_bbox": GB, "blue_bbox": BB, "red_bbox": RB, "bbox_img_idx": [[0, 3]]},
     12, "field 'bbox_img_idx' = [[0, 3]] names no picture (of the row's 12) for marker 2"),
])
def test_a_marker_that_cannot_be_placed_is_one_line_naming_its_field(task, fields, count, message):
    assert refusal(row(task, **fields), count) == f"{WHERE}: {message}"


# --- the painted pictures, built here from pinned pixel positions

YY, XX = np.mgrid[:H, :W]
TW, TH, TW_A = 194, 44, 198  # "object<i>" ink in the 56 px default font, 2 px stroke: 194 wide, 44 above the baseline


def grey() -> np.ndarray:
    return np.full((H, W, 3), GREY, np.uint8)


def disc(a: np.ndarray, x: int, y: int, colour) -> None:
    """PIL's ellipse over [x - 20, y - 20, x + 20, y + 20]: the pixels within 20.5 px of (x, y)."""
    a[(XX - x) ** 2 + (YY - y) ** 2 <= 20.5**2] = colour


def inside(x0, y0, x1, y1) -> np.ndarray:
    return (XX >= x0) & (XX <= x1) & (YY >= y0) & (YY <= y1)


def band(a: np.ndarray, x0: int, y0: int, x1: int, y1: int, colour, width: int = 20) -> None:
    """PIL's rectangle outline over [x0, y0, x1, y1] (corners included): the `width` px inside the edge."""
    a[inside(x0, y0, x1, y1) & ~inside(x0 + width, y0 + width, x1 - width, y1 - width)] = colour


def label(a: np.ndarray, at: tuple[int, int], text: str, colour) -> None:
    """The label as the module documents it (PIL's default font at 56 px, 2 px stroke, `at` the baseline's left)."""
    im = Image.fromarray(a)
    ImageDraw.Draw(im).text(at, text, fill=colour, font=ImageFont.load_default(size=56), anchor="ls",
                            stroke_width=2, stroke_fill=colour)
    a[:] = np.asarray(im)


def assert_picture(got, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray) and got.dtype == np.uint8 and got.shape == (H, W, 3)
    np.testing.assert_array_equal(got, want)


def test_points_are_discs_at_the_truncated_scaled_place():
    """draw_points: (c / 1000) * side, truncated, a disc of radius 20 in PIL's named colour, drawn in order."""
    r = row("depth_prediction_oo", red_point=[[512, 384]], blue_point=[[500, 875]], green_point=[[999, 1]])
    (got,) = draw(r, [grey()], "image")
    want = grey()
    disc(want, 327, 184, RED)  # 327.68, 184.32 truncated
    disc(want, 320, 420, BLUE)
    disc(want, 639, 0, GREEN)  # 639.36, 0.48: clipped at the corner
    assert_picture(got, want)


def test_boxes_are_grown_by_17_5_px_and_drawn_20_px_wide():
    """draw_thick_bbox: the scaled box grown by 20 * 7 / 8 each way, truncated, outline width 20 (PIL's inside)."""
    r = row("obj_spatial_relation_oo", red_bbox=[[100, 150, 300, 420]], blue_bbox=[[450, 200, 900, 650]])
    (got,) = draw(r, [grey()], "image")
    want = grey()
    band(want, 46, 54, 209, 219, RED)  # 64 - 17.5, 72 - 17.5, 192 + 17.5, 201.6 + 17.5
    band(want, 270, 78, 593, 329, BLUE)  # 288 - 17.5, 96 - 17.5, 576 + 17.5, 312 + 17.5
    assert_picture(got, want)


def test_a_box_over_the_whole_picture_is_clipped_and_truncated_towards_zero():
    (got,) = draw(row("spatial_volume_infer", red_bbox=[[0, 0, 1000, 1000]]), [grey()], "image")
    want = grey()
    band(want, -17, -17, 657, 497, RED)  # int(-17.5) is -17: 3 px of the band inside on the left and top
    assert_picture(got, want)
    assert got[240, :4].tolist() == [list(RED)] * 3 + [list(GREY)]  # the left edge's band, 3 px


def test_the_marked_pictures_become_arrays_the_others_stay_as_they_are(tmp_path):
    """distance_prediction_oo_video: frames 3 and 8 drawn, the rest left as the paths (or arrays) they were."""
    frames = [str(tmp_path / f"{k}.jpg") for k in range(12)]
    for f in frames:
        Image.fromarray(grey()).save(f, quality=95)
    frames[5] = grey()
    r = row("distance_prediction_oo_video", red_point=[[500, 500]], blue_point=[[500, 875]],
            point_img_idx=[[3, 8]])
    out = draw(r, list(frames), "image")
    assert [k for k, f in enumerate(out) if f is not frames[k]] == [3, 8]
    with Image.open(frames[3]) as im:
        want = np.asarray(im.convert("RGB")).copy()  # the JPEG's own pixels around the disc
    disc(want, 320, 240, RED)
    assert_picture(out[3], want)


def test_a_decoded_picture_is_drawn_on_a_copy():
    """Embedded bytes arrive decoded (read-only RGB arrays); the marked one is a new array, the row's own untouched."""
    picture = np.asarray(Image.fromarray(grey()))
    picture.flags.writeable = False
    (got,) = draw(row("distance_prediction_oc", red_point=[[500, 500]]), [picture], "image")
    want = grey()
    disc(want, 320, 240, RED)
    assert_picture(got, want)
    assert (picture == GREY).all()


def test_a_greyscale_or_transparent_file_is_drawn_in_colour(tmp_path):
    """The picture is converted to RGB before drawing, as toy_dataset.py opens every image with .convert('RGB')."""
    Image.new("L", (W, H), 90).save(tmp_path / "grey.png")
    Image.new("RGBA", (W, H), (90, 90, 90, 128)).save(tmp_path / "alpha.png")
    r = row("depth_prediction_oc_mv", red_point=[[500, 500]], blue_point=[[500, 875]], point_img_idx=[[0, 1]])
    red, blue = draw(r, [str(tmp_path / "grey.png"), str(tmp_path / "alpha.png")], "image")
    want = grey()
    disc(want, 320, 240, RED)
    assert_picture(red, want)
    want = grey()
    disc(want, 320, 420, BLUE)
    assert_picture(blue, want)


def test_the_map_boxes_are_blue_with_green_labels_under_or_over_their_corner():
    """draw_spatial_imagination_map_mv: each box on its picture, grown by 20 and drawn 20 wide (cv2: 10 px each side
    of the line), `object<i>` in green with its baseline th below the box's bottom right, th above it where the
    label's baseline would fall below the picture."""
    pictures = [grey(), grey(), grey()]
    r = row("spatial_imagination_map_mv", bbox_img_idx=[[2, 0, 2]],
            bbox_list=[[[400, 150, 700, 420], [450, 200, 900, 909], [350, 600, 550, 950]]])
    out = draw(r, pictures, "image")
    assert out[1] is pictures[1]
    want0, want2 = grey(), grey()
    band(want2, 226, 42, 478, 231, BLUE)  # (256, 72, 448, 201) grown by 30 out, 20 wide
    label(want2, (448 - TW, 201 + TH), "object0", CV_GREEN)
    band(want0, 258, 66, 606, 466, BLUE)  # (288, 96, 576, 436): 436 + 44 is the picture's height, still below
    label(want0, (576 - TW, 480), "object1", CV_GREEN)
    band(want2, 194, 258, 382, 486, BLUE)  # (224, 288, 352, 456): 456 + 44 > 480, so above
    label(want2, (352 - TW, 456 - TH), "object2", CV_GREEN)
    assert_picture(out[0], want0)
    assert_picture(out[2], want2)
    assert (out[0][470:480, 382:576] == CV_GREEN).any()  # the label below the box is on the picture


def test_the_imagination_video_boxes_are_labelled_white_on_their_colour():
    """draw_spatial_imagination_oo_video: green, blue, red, yellow (cv2's BGR (225, 225, 0) is (0, 225, 225) in RGB)
    boxes, each `object<i>` in white on a filled box of its colour from th above the baseline to 5 px below it; where
    the label would leave the picture its baseline is 5 px above the box's bottom."""
    frames = [grey() for _ in range(12)]
    r = row("spatial_imagination_oo_video", green_bbox=[[400, 150, 700, 420]], blue_bbox=[[350, 600, 550, 950]],
            red_bbox=[[450, 200, 900, 909]], yellow_bbox=[[100, 50, 400, 300]], bbox_img_idx=[[0, 3, 7, 3]])
    out = draw(r, frames, "image")
    assert [k for k, f in enumerate(out) if f is not frames[k]] == [0, 3, 7]
    want = {0: grey(), 3: grey(), 7: grey()}
    band(want[0], 226, 42, 478, 231, CV_GREEN)  # (256, 72, 448, 201)
    want[0][inside(254, 201, 448, 250)] = CV_GREEN
    label(want[0], (254, 245), "object0", WHITE)
    band(want[3], 194, 258, 382, 486, BLUE)  # (224, 288, 352, 456): 500 > 480, baseline at 456 - 5
    want[3][inside(158, 407, 352, 456)] = BLUE
    label(want[3], (158, 451), "object1", WHITE)
    band(want[7], 258, 66, 606, 466, RED)  # (288, 96, 576, 436): 480 fits, below
    want[7][inside(382, 436, 576, 485)] = RED
    label(want[7], (382, 480), "object2", WHITE)
    band(want[3], 34, -6, 286, 174, CV_YELLOW)  # (64, 24, 256, 144)
    want[3][inside(62, 144, 256, 193)] = CV_YELLOW
    label(want[3], (62, 188), "object3", WHITE)
    for k, w in want.items():
        assert_picture(out[k], w)
    assert (out[0] == WHITE).all(-1).sum() > 500  # the white label is there, not hidden by its box


def test_the_center_video_points_are_blue_discs_labelled_in_green():
    """draw_distance_infer_center_oo_video: a blue disc of radius 20, `objectA` then `object<i>` in green with the
    baseline's left 20 px right of and below the point."""
    frames = [grey() for _ in range(12)]
    r = row("distance_infer_center_oo_video", point_list=[[[512, 384], [500, 875], [100, 100]]],
            point_img_idx=[[0, 5, 5]])
    out = draw(r, frames, "image")
    assert [k for k, f in enumerate(out) if f is not frames[k]] == [0, 5]
    want0, want5 = grey(), grey()
    disc(want0, 327, 184, BLUE)
    label(want0, (347, 204), "objectA", CV_GREEN)
    disc(want5, 320, 420, BLUE)
    label(want5, (340, 440), "object0", CV_GREEN)
    disc(want5, 64, 48, BLUE)
    label(want5, (84, 68), "object1", CV_GREEN)
    assert_picture(out[0], want0)
    assert_picture(out[5], want5)
    assert ((out[0] == CV_GREEN).all(-1) & inside(347, 204 - TH, 347 + TW_A, 204 + 14)).sum() > 500


def test_the_label_ink_lies_in_the_pinned_box():
    """TW, TH, TW_A are the font's box of a label with its 2 px stroke (from 2 px left of the origin, 44 px above the
    baseline to 14 below): the drawn ink stays inside it, from the baseline's left end to its right edge."""
    for text, right in (("object0", 290), ("objectA", 296)):
        a = grey()
        label(a, (100, 200), text, CV_GREEN)
        ys, xs = np.nonzero((a != GREY).any(-1))
        assert (xs.min(), xs.max() + 1, ys.min(), ys.max() + 1) == (100, right, 200 - TH, 200 + 14)
        assert right <= 100 - 2 + (TW if text != "objectA" else TW_A)


def test_a_box_with_its_corners_swapped_is_refused_naming_field_and_picture():
    r = row("spatial_imagination_oc_mv", red_bbox=[[300, 150, 100, 420]], green_bbox=GB, blue_bbox=BB,
            bbox_img_idx=[[0, 1, 2]])
    with pytest.raises(DatasetError) as e:
        draw(r, [grey(), grey(), grey()], "image")
    assert str(e.value) == (f"{WHERE}: field 'red_bbox': cannot be drawn on picture 2 "
                            "(x1 must be greater than or equal to x0)")
