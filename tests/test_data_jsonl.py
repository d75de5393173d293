"""data/jsonl.py's exact words and edges: each refusal's message, line numbers over blank lines and \\r line breaks,
duplicate keys at any depth, and what write_jsonl writes where (images, folders, non-ASCII text)."""

import dataclasses
import json

import pytest

from spatial_jax.data import synthetic
from spatial_jax.data.jsonl import DuplicateKey, MalformedJSON, loads_unique, parse_line, read_jsonl, write_jsonl
from spatial_jax.data.sample import DatasetError

CFG = synthetic.SyntheticConfig(width=32, height=32)


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "a" / "b" / "data.jsonl"  # write_jsonl makes the folders
    samples = synthetic.generate(CFG, "heldout", 3)
    samples[0] = dataclasses.replace(samples[0], id="Odd id/é", question="où est le cube ?")
    assert write_jsonl(samples, path) == 3
    return path, [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _refusal(path) -> str:
    with pytest.raises(DatasetError) as err:
        read_jsonl(path)
    return str(err.value)


def test_parse_line_words():
    with pytest.raises(MalformedJSON) as err:
        parse_line('{"a": }')
    assert str(err.value) == "malformed JSON: Expecting value (column 7)"
    with pytest.raises(MalformedJSON) as err:
        parse_line("[" * 100_000 + "]" * 100_000)
    assert str(err.value) == "malformed JSON: nested too deeply"
    with pytest.raises(MalformedJSON) as err:
        parse_line("9" * 5000)
    assert str(err.value).startswith("malformed JSON: Exceeds the limit (4300 digits)") and ";" not in str(err.value)


def test_loads_unique_refuses_a_key_given_twice_at_any_depth():
    assert loads_unique('{"a": 1, "b": {"a": 2}}') == {"a": 1, "b": {"a": 2}}
    for text in ('{"a": 1, "a": 1}', '[{"k": {"a": 1, "a": 2}}]'):
        with pytest.raises(DuplicateKey) as err:
            loads_unique(text)
        assert err.value.key == "a" and str(err.value) == "key 'a' is given twice in one object"


def test_write_jsonl_writes_images_beside_and_text_as_is(dataset, tmp_path):
    path, rows = dataset
    assert rows[0]["image"] == "images/Odd_id__.png" and (path.parent / "images" / "Odd_id__.png").is_file()
    assert "où est le cube ?" in path.read_text(encoding="utf-8")  # not \\u-escaped
    assert [s.id for s in read_jsonl(path)] == ["Odd id/é", rows[1]["id"], rows[2]["id"]]
    # an image folder elsewhere: the rows hold its absolute path
    elsewhere = tmp_path / "e" / "pics"
    out = tmp_path / "c" / "other.jsonl"
    write_jsonl(synthetic.generate(CFG, "heldout", 1), out, image_dir=elsewhere)
    row = json.loads(out.read_text())
    assert row["image"] == str((elsewhere / f"{row['id']}.png").resolve())
    # a sample whose image is a path keeps it and writes no image
    back = read_jsonl(path)[1]
    assert write_jsonl([back], tmp_path / "d" / "paths.jsonl") == 1
    assert json.loads((tmp_path / "d" / "paths.jsonl").read_text())["image"] == back.image
    assert not (tmp_path / "d" / "images").exists()


def test_read_jsonl_refusals_name_the_file_and_line(dataset, tmp_path):
    path, rows = dataset
    assert _refusal(tmp_path / "none.jsonl") == f"{tmp_path / 'none.jsonl'}: dataset file does not exist"
    assert _refusal(tmp_path) == f"{tmp_path}: dataset file is a folder, not a file"
    lines = [json.dumps(r) for r in rows]
    path.write_bytes(("\r\n".join([lines[0], "", "  \t", lines[1]]) + "\r\n" + lines[1] + "\n").encode())
    assert _refusal(path) == f"{path}:5: id {rows[1]['id']!r} already used on line 4"
    path.write_bytes(lines[0].encode() + b"\r" + b'{"id": "\xff"}\n')
    assert _refusal(path) == f"{path}:2: not UTF-8 text (byte 0xff at column 9)"
    path.write_text(lines[0] + "\n" + '{"id": }\n')
    assert _refusal(path) == f"{path}:2: malformed JSON: Expecting value (column 8)"
    path.write_text(lines[0] + "\n" + json.dumps({**rows[1], "image": "images/gone.png"}) + "\n\n")
    assert "does not exist" in _refusal(path)
    back = read_jsonl(path, check_images=False)
    assert [s.id for s in back] == [rows[0]["id"], rows[1]["id"]]
    assert [s.origin for s in back] == [f"{path}:1", f"{path}:2"]  # what the pipeline's later errors lead with
