"""MindCube's training split (data/sources/mindcube_train.py) in each form a user may hold it besides the Hub's
data.zip (test_layout_archives.py): the training file alone, in or out of its `raw/` folder; zips laid out
otherwise (the file at the top, inside a further folder, beside a README and macOS's twins); the setting each id
names, as the authors' get_setting_from_id reads it; and every broken row or copy, the whole message checked."""

import json
from pathlib import Path

import layout_copies as L
import numpy as np
import pytest

from spatial_jax.data.sources import open_spec

QUESTION = "Which object is nearer? A. the cube B. the ball"
VIEWS = ["other_all_image/around/0_0.png", "other_all_image/around/0_1.png"]


def _record(**kw) -> dict:
    return {"id": "around_0", "question": QUESTION, "gt_answer": "B", "images": VIEWS, **kw}


def _lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _folder(data: Path, rows: list[dict], file: str = "raw/MindCube_train.jsonl") -> Path:
    for v in VIEWS:
        L._save(L.BLANK, data / v)
    return L._jsonl(rows, data / file)


def test_the_training_file_alone_resolves_views_in_its_data_folder(tmp_path):
    f = _folder(tmp_path / "data", [_record()])
    s = open_spec(f"mindcube-train:{f}")[0]
    assert (s.id, s.category, s.question, s.options, s.answer) == (
        "around_0", "around", "Which object is nearer?", ("the cube", "the ball"), "B")
    assert s.images == tuple(str(tmp_path / "data" / v) for v in VIEWS)  # data/, above raw/
    flat = _folder(tmp_path / "flat", [_record()], file="MindCube_train.jsonl")  # no raw/: the file's own folder
    assert open_spec(f"mindcube-train:{flat}")[0].images == tuple(str(tmp_path / "flat" / v) for v in VIEWS)
    assert open_spec(f"mindcube-train:{tmp_path / 'flat'}")[0].images[0] == str(tmp_path / "flat" / VIEWS[0])


@pytest.mark.parametrize("top", ["", "MindCube/data/"])
def test_a_zip_laid_out_otherwise_is_read_from_its_own_folder(tmp_path, top):
    """The training file at the zip's top, or two folders down with macOS's twin of it nearer the top and a README
    beside it: the right file is found, its views read from beside it."""
    members = {f"{top}{v}": L.png(L.BLANK) for v in VIEWS}
    members[f"{top}raw/MindCube_train.jsonl"] = _lines([_record()])
    members["__MACOSX/raw/MindCube_train.jsonl"] = b"\0\5\26\7"  # shorter than the real path, and not the file
    members["README.md"] = "MindCube"
    members[f"A_backup/{top}raw/MindCube_train.jsonl"] = "not JSON"  # a longer path, first by name: not read
    s = open_spec(f"mindcube-train:{L.write_zip(tmp_path / 'data.zip', members)}")[0]
    assert (s.id, s.answer, len(s.images)) == ("around_0", "B", 2)
    assert all(isinstance(v, np.ndarray) and v.shape == (8, 8, 3) for v in s.images)  # decoded from members


def test_a_zip_without_the_training_file_or_with_a_view_outside_it(tmp_path):
    empty = L.write_zip(tmp_path / "data.zip", {"README.md": "MindCube", "__MACOSX/MindCube_train.jsonl": b"\0"})
    assert L.row_error(f"mindcube-train:{empty}") == (
        f"{empty}: the archive holds none of ['raw/MindCube_train.jsonl', 'MindCube_train.jsonl'] (MindCube's "
        "training split)")
    climbing = L.write_zip(tmp_path / "up.zip",
                           {"data/raw/MindCube_train.jsonl": _lines([_record(images=["../x.png"])])})
    assert L.row_error(f"mindcube-train:{climbing}") == (
        f"{climbing}:data/raw/MindCube_train.jsonl:1: field 'images[0]': image path '../x.png' leaves the folder it "
        f"is relative to ({tmp_path}); give an absolute path or data.columns image_dir")


def test_a_folder_with_no_copy_names_what_it_looked_for(tmp_path):
    assert L.row_error(f"mindcube-train:{tmp_path}") == (
        f"{tmp_path}: none of ['raw/MindCube_train.jsonl', 'MindCube_train.jsonl', '*/raw/MindCube_train.jsonl', "
        "'data.zip'] (MindCube's training split)")


@pytest.mark.parametrize(("rid", "setting"), [("rotation_12", "rotation"), ("among_group3_7", "among"),
                                              ("Translation_4", "translation"), (1742, "other"), ("view_9", "other")])
def test_the_category_is_the_setting_the_id_names(tmp_path, rid, setting):
    s = open_spec(f"mindcube-train:{_folder(tmp_path / 'data', [_record(id=rid)])}")[0]
    assert (s.id, s.category) == (str(rid), setting)


def test_broken_rows_name_file_row_and_field(tmp_path):
    f = _folder(tmp_path / "data", [
        _record(id=["a"]), _record(question="Which object is nearer?"), _record(gt_answer=1),
        _record(gt_answer="E"), _record(images=[VIEWS[0], "gone.png"])])
    assert [L.row_error(f"mindcube-train:{f}", k) for k in range(5)] == [
        f"{f}:1: field 'id' must be a string or an integer, got ['a']",
        f"{f}:2: field 'question' lists no options (`A. ...`)",
        f"{f}:3: field 'gt_answer' must be a string, got 1",
        f"{f}:4: field 'gt_answer' = 'E' is none of the 2 options ['the cube', 'the ball']",
        f"{f}:5: field 'images[1]': image {tmp_path / 'data' / 'gone.png'} does not exist"]
    assert open_spec(f"mindcube-train:{f}", check_images=False)[4].images[1] == str(tmp_path / "data" / "gone.png")
    zipped = L.write_zip(tmp_path / "data.zip", {"data/raw/MindCube_train.jsonl": _lines([_record()])})
    assert L.row_error(f"mindcube-train:{zipped}") == (
        f"{zipped}:data/raw/MindCube_train.jsonl:1: field 'images[0]': {zipped} has no member "
        f"data/{VIEWS[0]}")
