"""SPAR-7M read as the authors' readme extracts it: a tiny copy of the tree (two sources, select / fill / judge rows,
multi-view rows with point and box markers, a video_color frames row) written here; `data show` gives every row's
question, options, gold and pictures; the root, `spar/` and `spar/<source>` read the same rows; the split is the
`qa_jsonl/<split>/` folder; the markers are drawn in the authors' colours where their code draws them.

Sources of the layout (LogosRoboticsGroup/SPAR): readme.md (the tree `spar/<source>/{images,qa_jsonl}`, the row's
fields: `conversations`, `image` a list, `type`, `red_point` [[x, y]]), datasets/generate_data_josn.py (files at
`qa_jsonl/train/<task>/<format>/<format>_<N>.jsonl`, image root `spar/<source>/images`), datasets/toy_dataset.py
(paths joined to that root; more than 10 pictures are a video's frames), datasets/draw_marker.py (markers, colours,
sizes). Question wording, answers and scene names are inferred (the card shows no select or judge row)."""

import json
from pathlib import Path

import layout_copies as L
import numpy as np
import pytest
from PIL import Image

from spatial_jax.cli import main
from spatial_jax.data.sources import open_spec

W, H = 320, 240
GREY = 90
RED, BLUE, PIL_GREEN = (255, 0, 0), (0, 0, 255), (0, 128, 0)  # PIL's named colours, as draw_marker.py passes them


def _talk(question: str, answer: str) -> list[dict]:
    return [{"from": "human", "value": "<image>\n" + question}, {"from": "gpt", "value": answer}]


# source -> split -> task -> format -> rows (file name <format>_<N>.jsonl: generate_data_josn.py reads N as the count)
ROWS = {
    "scannet": {
        "train": {
            "obj_spatial_relation_oo": {"select": [{
                "id": "scene0000_00_1", "type": "obj_spatial_relation_oo",
                "image": ["scene0000_00/image_color/0.jpg"],
                "conversations": _talk("Where is the chair (red box) relative to the table (blue box)?\nA. left\n"
                                       "B. right\nC. above\nD. below", "B"),
                "red_bbox": [[100, 100, 300, 400]], "blue_bbox": [[600, 500, 900, 900]]}]},
            "depth_prediction_oc_mv": {"fill": [{
                "id": "scene0000_00_2", "type": "depth_prediction_oc_mv",
                "image": [f"scene0000_00/image_color/{k}.jpg" for k in range(3)],
                "conversations": _talk("The lamp (red point) is 1.2 m deep; how deep is the bed (blue point)?", "1.5"),
                "red_point": [[500, 500]], "blue_point": [[250, 750]], "point_img_idx": [[0, 2]]}]},
            "distance_prediction_oo_video": {"fill": [{  # video_color frames (readme's tree), 12 > 10 of them
                "id": "scene0000_00_3", "type": "distance_prediction_oo_video",
                "image": [f"scene0000_00/video_color/{k}.jpg" for k in range(12)],
                "conversations": _talk("How far is the lamp (red point) from the bed (blue point)?", "2.1"),
                "red_point": [[400, 400]], "blue_point": [[600, 600]], "point_img_idx": [[3, 8]]}]},
        },
        "val": {
            "depth_prediction_oc": {"fill": [{
                "id": "scene0001_00_1", "type": "depth_prediction_oc", "image": ["scene0001_00/image_color/0.jpg"],
                "conversations": _talk("How deep is the sofa (blue point)?", "0.8"),
                "red_point": [[200, 200]], "blue_point": [[800, 800]]}]},
        },
    },
    "structured3d": {
        "train": {
            "spatial_imagination_oc_mv": {"select": [{
                "id": "scene_00000_1", "type": "spatial_imagination_oc_mv",
                "image": [f"scene_00000/image_color/{k}.jpg" for k in range(3)],
                "conversations": _talk("Standing at the sofa (green box), where is the desk (red box)?\nA. front\n"
                                       "B. behind\nC. left\nD. right", "C. left"),
                "red_bbox": [[300, 300, 700, 700]], "green_bbox": [[300, 300, 700, 700]],
                "blue_bbox": [[300, 300, 700, 700]], "bbox_img_idx": [[1, 2, 0]]}]},
            "obj_count": {"judge": [{
                "id": "scene_00000_2", "type": "obj_count", "image": ["scene_00000/image_color/1.jpg"],
                "conversations": _talk("Are there two chairs in the room?", "Yes")}]},
        },
    },
}


def write_tree(root: Path) -> Path:
    """The tree as `cat spar-*.tar.gz | tar -xzf -` leaves it (readme), with ROWS and a grey picture per path."""
    for source, splits in ROWS.items():
        for split, tasks in splits.items():
            for task, formats in tasks.items():
                for fmt, rows in formats.items():
                    f = root / "spar" / source / "qa_jsonl" / split / task / fmt / f"{fmt}_{len(rows)}.jsonl"
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
                    for r in rows:
                        for name in r["image"]:
                            _picture(root / "spar" / source / "images" / name)
    return root


def _picture(path: Path) -> None:
    if not path.exists():  # flat grey: a drawn marker is the only colour on it
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((H, W, 3), GREY, np.uint8)).save(path, quality=95)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return write_tree(tmp_path_factory.mktemp("spar7m"))


def _show(spec: str, capsys) -> list[dict]:
    assert main(["data", "show", spec, "-n", "100", "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _undrawn(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_show_gives_every_row_of_every_source_and_task(root, capsys):
    rows = _show(f"spar7m:{root}", capsys)
    view = [{"w": W, "h": H}]
    got = [(r["id"], r["question"], r["options"], r["answer"],
            [{"w": i["width"], "h": i["height"]} for i in r["images"]], r["video"]) for r in rows]
    # sources, then tasks, in name order
    assert got == [
        ("scene0000_00_2", "The lamp (red point) is 1.2 m deep; how deep is the bed (blue point)?", [], 1.5,
         view * 3, None),
        ("scene0000_00_3", "How far is the lamp (red point) from the bed (blue point)?", [], 2.1, [],
         {"frames": 12, "fps": 2.0}),
        ("scene0000_00_1", "Where is the chair (red box) relative to the table (blue box)?",
         ["left", "right", "above", "below"], "B", view, None),
        ("scene_00000_2", "Are there two chairs in the room?", [], "Yes", view, None),  # judge: a text gold
        ("scene_00000_1", "Standing at the sofa (green box), where is the desk (red box)?",
         ["front", "behind", "left", "right"], "C", view * 3, None),
    ]


def _wheres(spec: str) -> list[str]:
    rows = open_spec(spec).rows
    return [rows[i].where for i in range(len(rows))]


def test_root_spar_and_one_source_read_the_same_rows(root):
    everything = _wheres(f"spar7m:{root}")
    assert len(everything) == 5
    assert _wheres(f"spar7m:{root / 'spar'}") == everything
    for source in ("scannet", "structured3d"):
        mine = [w for w in everything if w.startswith(f"{root / 'spar' / source}/")]
        assert _wheres(f"spar7m:{root / 'spar' / source}") == mine and mine


def test_pictures_resolve_under_the_source_images_folder(root):
    """toy_dataset.py joins a row's paths to `spar/<source>/images`, also for one of the tree's files read alone."""
    images = root / "spar/scannet/images"
    f = root / "spar/scannet/qa_jsonl/train/depth_prediction_oc_mv/fill/fill_1.jsonl"
    for spec in (f"spar7m:{root}", f"spar7m:{f}"):
        sample = open_spec(spec)[0]
        assert sample.images[1] == str(images / "scene0000_00/image_color/1.jpg")  # no marker: still a path


def test_split_is_the_qa_jsonl_folder(root, capsys):
    assert len(open_spec(f"spar7m:{root}")) == len(open_spec(f"spar7m:{root}:train")) == 5
    rows = _show(f"spar7m:{root}:val", capsys)
    assert [(r["id"], r["answer"], len(r["images"])) for r in rows] == [("scene0001_00_1", 0.8, 1)]


def test_an_unknown_split_is_refused_naming_the_splits(root, capsys):
    assert main(["data", "show", f"spar7m:{root / 'spar'}:test"]) == 1
    err = capsys.readouterr().err
    assert "no split 'test'" in err and "train, val" in err and len(err.strip().splitlines()) == 1


def test_markers_are_drawn_where_and_as_the_authors_draw_them(root):
    samples = {s.id: s for s in open_spec(f"spar7m:{root}")}
    scannet = root / "spar/scannet/images/scene0000_00"
    # depth_prediction_oc_mv: red point on picture point_img_idx[0][0], blue on [0][1] (draw_points, radius 20)
    mv = samples["scene0000_00_2"]
    plain = _undrawn(scannet / "image_color/0.jpg")
    assert isinstance(mv.images[0], np.ndarray) and mv.images[0].shape == (H, W, 3)
    assert tuple(mv.images[0][H // 2, W // 2]) == RED != tuple(plain[H // 2, W // 2])
    assert tuple(mv.images[0][H // 2, W // 2 + 19]) == RED and tuple(mv.images[0][H // 2, W // 2 + 25]) == (GREY,) * 3
    assert tuple(mv.images[2][int(0.75 * H), int(0.25 * W)]) == BLUE
    # obj_spatial_relation_oo: red box outline grown by 17.5 px, 20 px wide (draw_thick_bbox)
    box = samples["scene0000_00_1"].image
    left, mid = int(0.1 * W - 17.5), int(0.25 * H)
    assert tuple(box[mid, left + 10]) == RED and tuple(box[mid, left + 30]) == (GREY,) * 3
    # spatial_imagination_oc_mv: green box on picture bbox_img_idx[0][0], PIL's green
    s3d = samples["scene_00000_1"]
    assert tuple(s3d.images[1][H // 2, int(0.3 * W - 17.5) + 10]) == PIL_GREEN
    assert tuple(s3d.images[0][H // 2, int(0.3 * W - 17.5) + 10]) == RED
    # distance_prediction_oo_video: frames 3 and 8 drawn, the others left as files
    frames = samples["scene0000_00_3"].video.frames
    assert tuple(frames[3][int(0.4 * H), int(0.4 * W)]) == RED and tuple(frames[8][int(0.6 * H), int(0.6 * W)]) == BLUE
    assert frames[0] == str(scannet / "video_color/0.jpg")


def test_a_marker_naming_no_picture_is_one_line_naming_file_row_and_field(tmp_path, capsys):
    root = write_tree(tmp_path)
    f = root / "spar/scannet/qa_jsonl/train/depth_prediction_oc_mv/fill/fill_1.jsonl"
    row = json.loads(f.read_text())
    f.write_text(json.dumps({**row, "point_img_idx": [[0, 5]]}) + "\n")
    assert main(["data", "show", f"spar7m:{root}", "-n", "1"]) == 1
    assert capsys.readouterr().err.strip().endswith(
        f"{f}:1: field 'point_img_idx' = [[0, 5]] names no picture (of the row's 3) for marker 1")


# Rows as users hold them besides the tree: a file or folder of them alone (the LLaVA layout the module doc names),
# renamed fields, rows with faults. Each message is checked in full, since it is what the user reads.



FLAT = [
    {"id": "q1", "type": "obj_spatial_relation_oo", "image": ["img/a.jpg"],
     "conversations": _talk("Where is the chair?\nA. left\nB. right", "right")},
    {"image": ["img/a.jpg", "img/b.jpg"], "conversations": _talk("How far apart are the chairs?", "2.5")},
]


@pytest.fixture
def flat(tmp_path) -> Path:
    """A folder of rows outside any `spar/<source>` tree, its pictures beside them."""
    for name in ("a", "b"):
        _picture(tmp_path / "copy" / "img" / f"{name}.jpg")
    L._jsonl(FLAT, tmp_path / "copy" / "rows.jsonl")
    return tmp_path / "copy"


def test_a_file_or_folder_outside_the_tree_reads_as_llava_rows_beside_their_pictures(flat, monkeypatch):
    for spec in (f"spar7m:{flat / 'rows.jsonl'}", f"spar7m:{flat}"):
        first, second = open_spec(spec)
        # no folder names the format: the question's options are split off, the gold read as the option it names
        assert (first.id, first.question, first.options, first.answer, first.answer_type) == (
            "q1", "Where is the chair?", ("left", "right"), "B", "choice")
        assert first.image == str(flat / "img/a.jpg") and first.category == "obj_spatial_relation_oo"
        assert set(first.reference.values()) == {"right"} and first.reference  # the reply, as the SFT target
        # a row with no id is named by its place, one with no type has no category
        assert (second.id, second.category, second.answer, second.answer_type) == ("spar7m-1", "", 2.5, "number")
        assert second.images == (str(flat / "img/a.jpg"), str(flat / "img/b.jpg"))
    monkeypatch.chdir(flat)  # a relative file with fewer than four folders above it
    assert open_spec("spar7m:rows.jsonl")[0].image == "img/a.jpg"


def test_a_tree_file_named_by_a_relative_path_resolves_against_its_source(root, monkeypatch):
    monkeypatch.chdir(root / "spar/scannet")
    sample = open_spec("spar7m:qa_jsonl/train/depth_prediction_oc_mv/fill/fill_1.jsonl")[0]
    assert sample.images[1] == "images/scene0000_00/image_color/1.jpg"


def test_a_folder_of_split_files_outside_the_tree_reads_the_split_named(flat):
    L._jsonl(FLAT[:1], flat / "train.jsonl")
    L._jsonl(FLAT[1:], flat / "val.jsonl")
    (flat / "rows.jsonl").unlink()
    assert [s.id for s in open_spec(f"spar7m:{flat}:val")] == ["spar7m-0"]
    assert [s.id for s in open_spec(f"spar7m:{flat}:train")] == ["q1"]


def test_renamed_fields_are_read_from_their_columns(flat):
    row = {"qid": "r1", "task": "depth", "pics": ["img/a.jpg"], "why": "The chair is nearer.",
           "messages": [{"from": "human", "value": "Which is nearer?\nA. chair\nB. desk"},
                        {"from": "gpt", "value": "A"}]}
    f = L._jsonl([row], flat / "renamed.jsonl")
    sample = open_spec(f"spar7m:{f}?conversations=messages&id=qid&category=task&image=pics&reference=why")[0]
    assert (sample.id, sample.category, sample.options, sample.answer) == ("r1", "depth", ("chair", "desk"), "A")
    assert set(sample.reference.values()) == {"The chair is nearer."} and sample.image == str(flat / "img/a.jpg")


def test_a_gold_naming_no_option_is_refused_naming_the_reply(flat):
    f = L._jsonl([{**FLAT[0], "conversations": _talk("Where?\nA. left\nB. right", "E")}], flat / "bad.jsonl")
    assert L.row_error(f"spar7m:{f}").startswith(f"{f}:1: field 'conversations[gpt]' = 'E'")


def test_a_select_row_without_options_is_refused_in_the_tree_and_read_alone(tmp_path):
    root = write_tree(tmp_path)
    f = root / "spar/scannet/qa_jsonl/train/obj_spatial_relation_oo/select/select_1.jsonl"
    L._jsonl([{**ROWS["scannet"]["train"]["obj_spatial_relation_oo"]["select"][0],
               "conversations": _talk("Where is the chair (red box)?", "B")}], f)
    want = f"{f}:1: field 'conversations[human]': a select row lists no options"
    assert L.row_error(f"spar7m:{root}", 2) == want and L.row_error(f"spar7m:{f}") == want


def test_a_split_folder_missing_or_empty_is_one_line_naming_the_path(tmp_path):
    (tmp_path / "spar/scannet/qa_jsonl").mkdir(parents=True)
    spar = tmp_path / "spar"
    assert L.row_error(f"spar7m:{spar}") == (
        f"{spar}: SPAR-7M has no split 'train' here; its qa_jsonl folders hold no split")
    (tmp_path / "spar/scannet/qa_jsonl/train/obj_count/judge").mkdir(parents=True)
    assert L.row_error(f"spar7m:{spar}") == f"{spar}: no qa_jsonl/train/<task>/<format>/*.jsonl file"


def test_a_missing_picture_names_file_row_and_field_unless_pictures_go_unchecked(tmp_path):
    root = write_tree(tmp_path)
    images = root / "spar/scannet/images/scene0000_00"
    (images / "image_color/1.jpg").unlink()
    (images / "video_color/5.jpg").unlink()
    mv = root / "spar/scannet/qa_jsonl/train/depth_prediction_oc_mv/fill/fill_1.jsonl"
    video = root / "spar/scannet/qa_jsonl/train/distance_prediction_oo_video/fill/fill_1.jsonl"
    for spec, i in ((f"spar7m:{root}", 0), (f"spar7m:{mv}", 0)):
        assert L.row_error(spec, i) == f"{mv}:1: field 'image[1]': image {images / 'image_color/1.jpg'} does not exist"
    assert L.row_error(f"spar7m:{root}", 1) == (
        f"{video}:1: field 'image[5]': video frame {images / 'video_color/5.jpg'} does not exist")
    for spec in (f"spar7m:{root}", f"spar7m:{mv}"):
        assert open_spec(spec, check_images=False)[0].images[1] == str(images / "image_color/1.jpg")


def test_a_picture_to_draw_on_that_cannot_be_read_names_its_field(tmp_path):
    root = write_tree(tmp_path)
    images = root / "spar/scannet/images/scene0000_00"
    (images / "image_color/2.jpg").write_bytes(b"not a jpeg")  # the blue point's picture
    (images / "video_color/8.jpg").write_bytes(b"not a jpeg")  # a marked frame
    mv = root / "spar/scannet/qa_jsonl/train/depth_prediction_oc_mv/fill/fill_1.jsonl"
    video = root / "spar/scannet/qa_jsonl/train/distance_prediction_oo_video/fill/fill_1.jsonl"
    assert L.row_error(f"spar7m:{root}", 0).startswith(
        f"{mv}:1: field 'image[2]': image {images / 'image_color/2.jpg'} cannot be read to draw its markers (")
    assert L.row_error(f"spar7m:{root}", 1).startswith(
        f"{video}:1: field 'image[8]': image {images / 'video_color/8.jpg'} cannot be read to draw its markers (")


@pytest.mark.parametrize(("count", "kind", "video"), [(10, "views", False), (11, "views", True), (1, "nav", False),
                                                      (2, "nav", True), (3, "nav", True)])
def test_pictures_are_views_up_to_ten_and_a_nav_rows_are_frames(flat, count, kind, video):
    """toy_dataset.py: more than 10 pictures are a video's frames, and so are a `nav` row's (here: more than one)."""
    names = [f"img/{k}.jpg" for k in range(count)]
    for name in names:
        _picture(flat / name)
    f = L._jsonl([{"type": kind, "image": names, "conversations": _talk("How far?", "3")}], flat / "n.jsonl")
    sample = open_spec(f"spar7m:{f}")[0]
    pictures = tuple(str(flat / n) for n in names)
    if video:
        assert (sample.video.frames, sample.images, sample.image) == (pictures, (), None)
    elif count == 1:
        assert (sample.video, sample.images, sample.image) == (None, (), pictures[0])
    else:
        assert (sample.video, sample.images) == (None, pictures)


def test_a_video_file_row_reads_as_the_llava_layout_names_it(flat):
    (flat / "clip.mp4").write_bytes(b"\0")  # read only when the row is encoded
    f = L._jsonl([{"video": "clip.mp4", "conversations": _talk("How many chairs?", "2")},
                  {"video": "gone.mp4", "conversations": _talk("How many chairs?", "2")}], flat / "v.jsonl")
    assert open_spec(f"spar7m:{f}")[0].video.path == str(flat / "clip.mp4")
    assert L.row_error(f"spar7m:{f}", 1) == f"{f}:2: field 'video': video {flat / 'gone.mp4'} does not exist"


@pytest.mark.parametrize("fps", ["0", "-1", "nan", "two"])
def test_a_frame_rate_that_is_no_positive_number_is_refused_naming_the_setting(flat, fps):
    names = [f"img/{k}.jpg" for k in range(11)]
    for name in names:
        _picture(flat / name)
    f = L._jsonl([{"image": names, "conversations": _talk("How far?", "3")}], flat / "n.jsonl")
    assert open_spec(f"spar7m:{f}?video_fps=0.5")[0].video.fps == 0.5
    assert L.row_error(f"spar7m:{f}?video_fps={fps}") == (
        f"{f}:1: field 'image' lists frames, and data.columns video_fps = '{fps}' is no positive number of frames a "
        "second")
