"""OmniSpatial's training split (data/sources/omnispatial_train.py) in forms beyond the zip of test_layout_archives.py:
a zip laid out otherwise (data.json at the top or deeper, beside lookalikes), an unzipped folder, and each broken
copy or record, the whole message checked."""

import json

import layout_copies as L
import numpy as np
import pytest

from spatial_jax.data.sources import open_spec


def _record(**kw) -> dict:
    return {"id": "3_1", "question": "Which side is the door on?", "options": ["left", "right"], "answer": 1,
            "task_type": "Perspective_Taking", "sub_task_type": "Allocentric", **kw}




@pytest.mark.parametrize("top", ["", "deep/er/"])
def test_the_shortest_data_json_of_a_zip_is_read_beside_its_images(tmp_path, top):
    members = {f"{top}data.json": json.dumps([_record()]), f"{top}Perspective_Taking/3.png": L.png(L.BLANK),
               f"A_copy/{top}old/data.json": "[]", "notes/mydata.json": "[]",
               "__MACOSX/data.json": b"\0\5\26\7", "__MACOSX/._data.json": b"\0\5\26\7"}
    (s,) = open_spec(f"omnispatial-train:{L.write_zip(tmp_path / 'OmniSpatial-train.zip', members)}")
    assert (s.id, s.category, s.question, s.options, s.answer) == (
        "Perspective_Taking_3_1", "Allocentric", "Which side is the door on?", ("left", "right"), "B")
    assert isinstance(s.image, np.ndarray) and s.image.shape == (8, 8, 3)


def test_a_broken_zip_is_one_line_naming_archive_and_member(tmp_path):
    z = tmp_path / "OmniSpatial-train.zip"
    for members, why in [
            ({"readme.txt": "x", "x/mydata.json": "[]"}, "the archive holds no data.json"),
            ({"a/data.json": "{", "ab/data.json": "[]"}, "a/data.json: not valid JSON (Expecting property name "
                                                         "enclosed in double quotes: line 1 column 2 (char 1))"),
            ({"a/data.json": '{"id": 1}', "ab/data.json": "[]"}, "a/data.json: expected a JSON list of records")]:
        spec = f"omnispatial-train:{L.write_zip(z, members)}"
        assert L.row_error(spec) == f"{z}{':' if '/' in why[:3] else ': '}{why}"
    escaping = L.write_zip(z, {"data.json": json.dumps([_record(task_type="../Outside")])})
    assert L.row_error(f"omnispatial-train:{escaping}") == (
        f"{z}:data.json record 0: field 'id': image path '../Outside/3.png' leaves the folder it is relative to "
        f"({tmp_path}); give an absolute path or data.columns image_dir")


def test_an_unzipped_copy_resolves_images_beside_data_json(tmp_path):
    (tmp_path / "Perspective_Taking").mkdir()
    (tmp_path / "Perspective_Taking" / "3.png").write_bytes(L.png(L.BLANK))
    data = tmp_path / "data.json"
    data.write_text(json.dumps([_record(), _record(id="4_0")]))
    samples = open_spec(f"omnispatial-train:{data}", check_images=False)
    assert [(s.id, s.image) for s in samples] == [
        ("Perspective_Taking_3_1", str(tmp_path / "Perspective_Taking/3.png")),
        ("Perspective_Taking_4_0", str(tmp_path / "Perspective_Taking/4.png"))]
    assert L.row_error(f"omnispatial-train:{tmp_path}", 1) == (
        f"{data} record 1: field 'id': image {tmp_path / 'Perspective_Taking/4.png'} does not exist")


def test_broken_records_name_file_record_and_field(tmp_path):
    (tmp_path / "Perspective_Taking").mkdir()
    (tmp_path / "Perspective_Taking" / "3.png").write_bytes(L.png(L.BLANK))
    data = tmp_path / "data.json"
    records = [_record(id=["3"]), _record(task_type=7), _record(options="left, right"), _record(answer=2),
               _record(answer=1.0), _record(question=[]), _record(question=["Look.", 1]), _record(question=5),
               _record(answer="up"), _record(sub_task_type=None, question=["Look.", "Which side?"])]
    data.write_text(json.dumps(records))
    spec = f"omnispatial-train:{data}"
    assert [L.row_error(spec, k) for k in range(9)] == [
        f"{data} record 0: field 'id' must be a string or an integer, got ['3']",
        f"{data} record 1: field 'task_type' must be a string, got 7",
        f"{data} record 2: field 'options' must be a list of option texts, got 'left, right'",
        f"{data} record 3: field 'answer' = 2 is no 0-based index of the 2 options ['left', 'right']",
        f"{data} record 4: field 'answer' must be an integer or a string, got 1.0",
        f"{data} record 5: field 'question' must be a text or a list of texts, got []",
        f"{data} record 6: field 'question' must be a text or a list of texts, got ['Look.', 1]",
        f"{data} record 7: field 'question' must be a string or a list, got 5",
        f"{data} record 8: field 'answer' = 'up' is none of the 2 options ['left', 'right']"]
    last = open_spec(spec)[9]
    assert (last.question, last.category) == ("Look. Which side?", "")
