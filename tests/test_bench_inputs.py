"""The benchmark readers take what JSON allows and refuse what it leaves ambiguous: text holding U+2028 (a line
separator to str.splitlines, not to JSONL) reads, a predictions object giving an id twice and options that are not
strings are errors naming the file."""

from __future__ import annotations

import json

import pytest
from test_bench_loaders import COPIES, write_copy

from spatial_jax.cli import main
from spatial_jax.suites import BenchmarkError, load
from spatial_jax.suites.runner import read_predictions

SEPARATORS = "left\u2028right\u2029up\x85down"  # raw in the text: none of them ends a JSONL line


def test_a_benchmark_jsonl_holding_unicode_line_separators_reads(tmp_path):
    writer, rows, _, _ = COPIES["mindcube-tiny"]
    root = writer(tmp_path / "copy", [dict(r) for r in rows])
    path = root / "raw" / "MindCube_tinybench.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["question"] = rows[1]["question"].replace("?", f" ({SEPARATORS})?", 1)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    records = load("mindcube-tiny", root)
    assert len(records) == len(rows) and SEPARATORS in records[1].question


def test_predictions_holding_unicode_line_separators_read(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"id": 1, "response": SEPARATORS}, ensure_ascii=False) + "\n"
                     + json.dumps({"id": 2, "response": "B"}) + "\n", encoding="utf-8")
    assert read_predictions(jsonl) == {"1": SEPARATORS, "2": "B"}


def test_a_predictions_object_giving_an_id_twice_is_refused(tmp_path, capsys):
    preds = tmp_path / "p.json"
    preds.write_text('{"mp3d_0": "A", "ai2thor_1": "A", "mp3d_0": "B"}')
    with pytest.raises(BenchmarkError, match="'mp3d_0' is given twice"):
        read_predictions(preds)
    root = write_copy("embspatial", tmp_path / "copy")
    assert main(["eval", "--benchmark", "embspatial", "--data", str(root), "--predictions", str(preds)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("spatial-jax eval: ") and "given twice" in err and err.count("\n") == 1
    row = tmp_path / "row.jsonl"
    row.write_text('{"id": "mp3d_0", "response": "A"}\n{"id": "ai2thor_1", "response": "A", "response": "B"}\n')
    with pytest.raises(BenchmarkError, match=r"row.jsonl:2: key 'response' is given twice"):
        read_predictions(row)


# benchmark -> the field holding its options' texts
OPTION_FIELDS = {"omnispatial": "options", "spatialab": "options", "embspatial": "answer_options",
                 "vsibench": "options", "cvbench": "choices"}


@pytest.mark.parametrize("name", sorted(OPTION_FIELDS))
def test_options_that_are_not_strings_are_refused(name, tmp_path, capsys):
    writer, rows, _, _ = COPIES[name]
    field = OPTION_FIELDS[name]
    rows = [{**r, field: list(range(len(r[field])))} if r.get(field) else dict(r) for r in rows]
    root = writer(tmp_path / name, rows)
    with pytest.raises(BenchmarkError, match=f"field '{field}' must be a non-empty list of strings"):
        load(name, root)
    preds = tmp_path / "p.json"
    preds.write_text("{}")
    assert main(["eval", "--benchmark", name, "--data", str(root), "--predictions", str(preds)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"spatial-jax eval: {root}") and "list of strings" in err and "Traceback" not in err
