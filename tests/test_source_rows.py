"""Row tables (data/sources/rows.py) as published copies hold them: a row's dotted fields and the one-line message of
a field missing or of the wrong kind; parquet files of several row groups, datasets' Arrow streams and files, JSON
lines with blank lines, CRLF, a byte-order mark, a last line without its break and lines across the 1 MiB chunks,
JSON lists, zip members, a Hub folder's splits; each row named by file and line or row, by index from either end."""

import json
import os
import pickle
from pathlib import Path

import layout_copies as L
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spatial_jax.data.sample import DatasetError
from spatial_jax.data.sources import rows as R


def refusal(fn, *args) -> str:
    with pytest.raises(DatasetError) as e:
        fn(*args)
    return str(e.value)


def rows_of(table) -> list[tuple]:
    """Every row as (data, where, index), read from the front."""
    return [(r.data, r.where, r.index) for r in (table[i] for i in range(len(table)))]


def parquet(path: Path, ids: range, group: int) -> Path:
    pq.write_table(pa.Table.from_pylist([{"id": i} for i in ids]), path, row_group_size=group)
    return path


# --- a row's fields ------------------------------------------------------------------------------------------------

VERL = {"prompt": [{"role": "user", "content": "Which is nearer?"}], "data_source": "geo3k",
        "reward_model": {"style": "rule", "ground_truth": "B", "extra": None},
        "extra_info": {"index": 0, "answer": "", "split": "train", "flag": False}}


def test_a_field_is_read_by_its_dotted_path_and_a_missing_or_null_step_gives_the_default():
    row = R.Row(VERL, "train.parquet row 4", 4)
    assert row.get("reward_model.ground_truth") == "B"
    assert row.get("reward_model") == {"style": "rule", "ground_truth": "B", "extra": None}
    assert (row.get("extra_info.index", 9), row.get("extra_info.answer", "x"), row.get("extra_info.flag", 1)) == (
        0, "", False)  # falsy values are values
    assert row.get("reward_model.extra", "none") == "none"
    assert row.get("reward_model.ground_truth.text", "-") == "-"  # a step into a string
    assert row.get("images", ()) == ()
    assert row.get("prompt.0.content", "-") == "-"  # lists are not walked
    assert row.get("", "-") == "-" and row.get("") is None
    assert R.Row(["a"], "x.json record 0").get("a", 5) == 5
    assert R.Row(VERL, "x").index == 0


def test_a_needed_field_is_there_and_of_its_kind_or_named_in_one_line():
    row = R.Row(VERL, "train.parquet row 4", 4)
    assert row.need("reward_model.ground_truth", str) == "B"
    assert row.need("extra_info.index", int) == 0
    assert row.need("extra_info.flag", bool) is False
    assert row.need("prompt", (str, list)) == VERL["prompt"]
    assert row.need("reward_model") is VERL["reward_model"]
    messages = [
        (("reward_model.extra", str), "missing field 'reward_model.extra'"),
        (("answer",), "missing field 'answer'"),
        (("extra_info.flag", int), "field 'extra_info.flag' must be an integer, got False"),
        (("extra_info.index", (float, str)), "field 'extra_info.index' must be a number or a string, got 0"),
        (("data_source", list), "field 'data_source' must be a list, got 'geo3k'"),
        (("prompt", dict), "field 'prompt' must be an object, got [{'content': 'Which is nearer?', 'role': 'user'}]"),
        (("data_source", bytes), "field 'data_source' must be bytes, got 'geo3k'"),
        (("extra_info.answer", (int, bool)), "field 'extra_info.answer' must be an integer or bool, got ''"),
    ]
    for args, message in messages:
        assert refusal(row.need, *args) == "train.parquet row 4: " + message
    assert refusal(R.Row([1, 2], "a.jsonl:7").need, "prompt") == "a.jsonl:7: expected an object, got list"
    assert refusal(R.Row("text", "a.jsonl:8").need, "prompt", str) == "a.jsonl:8: expected an object, got str"
    assert R.Row(VERL, "x").error("bad").args == ("x: bad",)


# --- tables --------------------------------------------------------------------------------------------------------


def test_a_json_list_names_each_record_from_zero(tmp_path):
    path = tmp_path / "train.json"
    path.write_text("\ufeff" + json.dumps([{"id": "a"}, {"id": "b"}, {"id": "c"}]), encoding="utf-8")
    rows = R.json_list(path)
    assert rows.files == (str(path),) and len(rows) == 3
    assert rows_of(rows) == [({"id": k}, f"{path} record {n}", n) for n, k in enumerate("abc")]
    assert (rows[-1].data, rows[-1].where, rows[-1].index) == ({"id": "c"}, f"{path} record 2", 2)
    with pytest.raises(IndexError):
        rows[3]
    named = R.ListRows([{"q": 1}], Path("qa.json"), "question")
    assert (named[0].where, named[0].index) == ("qa.json question 0", 0)


def test_a_json_file_that_is_no_list_of_records_is_refused(tmp_path):
    (tmp_path / "obj.json").write_text('{"data": []}')
    (tmp_path / "bad.json").write_text('[{"id": 1},]')
    (tmp_path / "latin.json").write_bytes(b'[{"q": "caf\xe9"}]')
    assert refusal(R.json_list, tmp_path / "obj.json") == (
        f"{tmp_path / 'obj.json'}: expected a JSON list of records, got dict")
    assert refusal(R.json_list, tmp_path / "bad.json") == (
        f"{tmp_path / 'bad.json'}: malformed JSON: Expecting value (column 12)")
    assert refusal(R.json_list, tmp_path / "latin.json").startswith(
        f"{tmp_path / 'latin.json'}: cannot read the dataset file ('utf-8' codec can't decode byte 0xe9")
    assert refusal(R.json_list, tmp_path / "none.json") == (
        f"{tmp_path / 'none.json'}: cannot read the dataset file ([Errno 2] No such file or directory: "
        f"'{tmp_path / 'none.json'}')")


def test_parquet_rows_are_named_by_file_and_row_across_row_groups_and_files(tmp_path):
    a, b = parquet(tmp_path / "a.parquet", range(5), 2), parquet(tmp_path / "b.parquet", range(5, 8), 2)
    rows = R.ParquetRows([a, b])
    assert rows.files == (str(a), str(b)) and len(rows) == 8
    assert rows_of(rows) == [({"id": i}, f"{a if i < 5 else b} row {i if i < 5 else i - 5}", i) for i in range(8)]
    # the last two row groups read stay cached, the first read leaving first
    assert list(rows._cache) == [3, 4]
    assert (rows[-1].data, rows[-1].where, rows[-1].index) == ({"id": 7}, f"{b} row 2", 7)
    assert (rows[-8].data, rows[-8].where, rows[-8].index) == ({"id": 0}, f"{a} row 0", 0)
    assert list(rows._cache) == [4, 0]
    for i in (8, -9):
        with pytest.raises(IndexError, match=f"^{i}$"):
            rows[i]
    rows[7], rows[2]
    assert list(rows._cache) == [0, 1]
    # a worker process gets the index without the open files and reads its own
    # what a worker process is sent: the index, not the cached row groups, the open files or the lock
    assert sorted(rows.__getstate__()) == ["_file_starts", "files", "groups", "starts"]
    copy = pickle.loads(pickle.dumps(rows))
    assert (copy._cache, copy._handles) == ({}, {}) and rows_of(copy) == rows_of(rows)
    assert R.ParquetRows([]).__len__() == 0


def test_a_damaged_parquet_file_is_named(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not parquet")
    message = refusal(R.ParquetRows, [tmp_path / "bad.parquet"])
    assert message.startswith(f"{tmp_path / 'bad.parquet'}: cannot read the parquet file (") and message.endswith(")")
    path = parquet(tmp_path / "a.parquet", range(4), 2)
    rows = R.ParquetRows([path])
    path.write_bytes(b"replaced")  # the copy changed after its footer was read
    message = refusal(rows.__getitem__, 3)
    assert message.startswith(f"{path}: cannot read row group 1 (") and message.endswith(")"), message


def arrow(path: Path, ids: range, stream: bool = True) -> Path:
    table = pa.Table.from_pylist([{"id": i} for i in ids])
    with pa.OSFile(str(path), "wb") as sink:
        with (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema) as w:
            w.write_table(table)
    return path


def test_arrow_rows_read_streams_and_files_named_by_file_and_row(tmp_path):
    a, b = arrow(tmp_path / "data-0.arrow", range(3)), arrow(tmp_path / "data-1.arrow", range(3, 5), stream=False)
    rows = R.ArrowRows([a, b])
    assert rows.files == (str(a), str(b)) and len(rows) == 5
    assert rows_of(rows) == [({"id": i}, f"{a if i < 3 else b} row {i if i < 3 else i - 3}", i) for i in range(5)]
    assert (rows[-2].data, rows[-2].where, rows[-2].index) == ({"id": 3}, f"{b} row 0", 3)
    assert (rows[-5].data, rows[-5].where, rows[-5].index) == ({"id": 0}, f"{a} row 0", 0)
    for i in (5, -6):
        with pytest.raises(IndexError, match=f"^{i}$"):
            rows[i]
    copy = pickle.loads(pickle.dumps(rows))
    assert copy._tables == [None, None] and rows_of(copy) == rows_of(rows)
    (tmp_path / "bad.arrow").write_bytes(b"ARROW1 nothing")
    message = refusal(R.ArrowRows, [tmp_path / "bad.arrow"])
    assert message.startswith(f"{tmp_path / 'bad.arrow'}: cannot read the Arrow file (") and message.endswith(")")


def test_json_lines_name_each_row_by_its_line_past_blank_lines(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": 1}\r\n\r\n  \t\n{"id": 2}\n\n{"id": 3}  \n \n{"id": 4}')
    rows = R.JsonLines(path)
    assert rows.files == (str(path),) and len(rows) == 4
    assert rows_of(rows) == [({"id": 1}, f"{path}:1", 0), ({"id": 2}, f"{path}:4", 1), ({"id": 3}, f"{path}:6", 2),
                             ({"id": 4}, f"{path}:8", 3)]
    assert (rows[-4].data, rows[-4].where, rows[-4].index) == ({"id": 1}, f"{path}:1", 0)
    for i in (4, -5):
        with pytest.raises(IndexError, match=f"^{i}$"):
            rows[i]
    copy = pickle.loads(pickle.dumps(rows))
    assert copy._fd is None and rows._fd is not None and rows_of(copy) == rows_of(rows)
    (tmp_path / "blank.jsonl").write_bytes(b"\n \r\n\t")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "one.jsonl").write_bytes(b'\n\n{"id": 9}')
    assert len(R.JsonLines(tmp_path / "blank.jsonl")) == 0 and len(R.JsonLines(tmp_path / "empty.jsonl")) == 0
    assert rows_of(R.JsonLines(tmp_path / "one.jsonl")) == [({"id": 9}, f"{tmp_path / 'one.jsonl'}:3", 0)]
    (tmp_path / "two.jsonl").write_bytes(b'{"id": 8}\n{"id": 9}')  # the last row right after the "}" and break
    assert rows_of(R.JsonLines(tmp_path / "two.jsonl")) == [({"id": 8}, f"{tmp_path / 'two.jsonl'}:1", 0),
                                                            ({"id": 9}, f"{tmp_path / 'two.jsonl'}:2", 1)]


def test_a_pretty_printed_object_given_as_json_lines_is_refused_at_its_first_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{\n  "id": 1\n}\n')
    rows = R.JsonLines(path)
    assert (len(rows), list(rows.lines)) == (3, [1, 2, 3])
    assert refusal(rows.__getitem__, 0) == f"{path}:1: malformed JSON: Expecting property name enclosed in double " \
                                           "quotes (column 1)"
    (tmp_path / "one.jsonl").write_text("7")  # one byte, no line break: still a row
    assert rows_of(R.JsonLines(tmp_path / "one.jsonl")) == [(7, f"{tmp_path / 'one.jsonl'}:1", 0)]


def test_a_dropped_table_closes_its_file_and_a_failed_one_leaves_nothing_to_close(tmp_path, monkeypatch):
    """grain's workers open a copy's files again and again: each table's descriptor goes with it."""
    import gc
    import sys

    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)  # an error in __del__ would only be printed
    path = L._jsonl([{"id": 0}], tmp_path / "train.jsonl")
    rows = R.JsonLines(path)
    assert rows[0].data == {"id": 0}
    fd = rows._fd
    assert os.readlink(f"/proc/self/fd/{fd}") == str(path)
    del rows
    gc.collect()
    assert not (os.path.exists(f"/proc/self/fd/{fd}") and os.readlink(f"/proc/self/fd/{fd}") == str(path))
    try:
        R.JsonLines(tmp_path / "none.jsonl")
    except DatasetError:
        pass
    gc.collect()
    assert ignored == []


def test_json_lines_across_the_read_chunks_keep_their_line_numbers(tmp_path):
    # lines of 100 000 bytes: chunk boundaries fall inside rows, inside a blank run and right after a break
    text = "x" * 99_988
    lines = []
    for k in range(25):
        lines.append(json.dumps({"id": k, "t": text}))  # 100 000 bytes with its break
        if k % 4 == 1:
            lines += [" " * 300, ""]
    raw = ("\n".join(lines) + "\n").encode()
    assert len(raw) > 2 * R._CHUNK
    path = tmp_path / "big.jsonl"
    path.write_bytes(raw)
    rows = R.JsonLines(path)
    expected = [n + 1 for n, line in enumerate(lines) if line.strip()]
    assert list(rows.lines) == expected and len(rows) == 25
    for i in (0, 10, 11, 24):
        assert (rows[i].data["id"], rows[i].where, rows[i].index) == (i, f"{path}:{expected[i]}", i)
    # a blank run from the end of one chunk into the next is no row, nor is a break alone at a chunk's start
    for gap in (R._CHUNK - 5, R._CHUNK - 1, R._CHUNK):
        body = b'{"id": 0}' + b" " * (gap - 10) + b"\n"
        path.write_bytes(body + b"   \n\n" + b'{"id": 1}\n  ')
        assert rows_of(R.JsonLines(path)) == [({"id": 0}, f"{path}:1", 0), ({"id": 1}, f"{path}:4", 1)], gap
    path.write_bytes(b" " * (R._CHUNK - 1) + b'{"id": 5}')  # the row's first byte is the chunk's last
    assert rows_of(R.JsonLines(path)) == [({"id": 5}, f"{path}:1", 0)]
    # a chunk ending with a row's line break: the next row starts the next chunk, right after that row's "}"
    first = b'{"id": 0, "t": "' + b"x" * (R._CHUNK - 19) + b'"}\n'
    assert len(first) == R._CHUNK
    path.write_bytes(first + b'{"id": 1}\n{"id": 2}')
    assert [(r.data["id"], r.where) for r in rows_of_rows(R.JsonLines(path))] == [
        (0, f"{path}:1"), (1, f"{path}:2"), (2, f"{path}:3")]


def test_a_json_line_that_is_not_utf8_or_no_json_names_its_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"id": 1}\n{"q": "caf\xe9"}\n{"id": 3,}\n')
    rows = R.JsonLines(path)
    assert refusal(rows.__getitem__, 1) == f"{path}:2: not UTF-8 text (byte 0xe9 at column 11)"
    assert refusal(rows.__getitem__, 2) == f"{path}:3: malformed JSON: Expecting property name enclosed in double " \
                                           "quotes (column 10)"
    row = R.line_row(b'\xef\xbb\xbf{"id": 1}', "a.jsonl:1", 5)
    assert (row.data, row.where, row.index) == ({"id": 1}, "a.jsonl:1", 5)
    assert refusal(R.line_row, b"\xff", "a.jsonl:2", 0) == "a.jsonl:2: not UTF-8 text (byte 0xff at column 1)"
    assert refusal(R.JsonLines, tmp_path / "none.jsonl") == f"{tmp_path / 'none.jsonl'}: dataset file does not exist"
    assert refusal(R.JsonLines, tmp_path) == f"{tmp_path}: cannot read the dataset file: Is a directory"


def test_a_folder_names_its_splits_by_its_files_and_parquet_subfolders(tmp_path):
    for name in ("train.parquet", "val.jsonl", "eval.json", "data/test-00000-of-00001.parquet",
                 "validation/part-0.parquet", "notes.txt", "other.parquet", "dev.csv", "data/readme.md",
                 "training-00000-of-00002.parquet", "evaluation/readme.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "valid").mkdir()
    assert R.splits_in(tmp_path) == ["eval", "test", "train", "training", "val", "validation"]
    assert R.splits_in(tmp_path / "evaluation") == []


def test_a_folder_reads_the_split_asked_for_by_the_hubs_patterns(tmp_path):
    hub = tmp_path / "hub"
    parquet((hub / "data").mkdir(parents=True) or hub / "data" / "train-00000-of-00002.parquet", range(2), 5)
    parquet(hub / "data" / "train-00001-of-00002.parquet", range(2, 3), 5)
    parquet(hub / "data" / "test-00000-of-00001.parquet", range(10, 11), 5)
    L._jsonl([{"id": 20}], hub / "train.jsonl")  # a later pattern: the data/ files win
    rows = R.table(hub, "train")
    assert [r.data["id"] for r in rows_of_rows(rows)] == [0, 1, 2]
    assert [r.data["id"] for r in rows_of_rows(R.table(hub, "", "test"))] == [10]
    assert [r.data["id"] for r in rows_of_rows(R.table(hub, "test", "train"))] == [10]
    flat = tmp_path / "flat"
    L._jsonl([{"id": 1}], flat / "val.jsonl")
    (flat / "train.json").write_text(json.dumps([{"id": 2}]))
    parquet(flat / "test.parquet", range(3, 4), 5)
    parquet((flat / "dev").mkdir() or flat / "dev" / "0.parquet", range(4, 5), 5)
    parquet(flat / "eval-00000-of-00001.parquet", range(5, 6), 5)
    assert [(s, [r.data["id"] for r in rows_of_rows(R.table(flat, s))]) for s in ("val", "train", "test", "dev",
                                                                                    "eval")] == [
        ("val", [1]), ("train", [2]), ("test", [3]), ("dev", [4]), ("eval", [5])]
    assert refusal(R.table, flat, "validation") == (
        f"{flat}: no split 'validation'; the copy's files name the splits ['dev', 'eval', 'test', 'train', 'val']: "
        "give one as FORMAT:PATH:<split>")
    assert refusal(R.table, flat) == (
        f"{flat}: no split ''; the copy's files name the splits ['dev', 'eval', 'test', 'train', 'val']: give one as "
        "FORMAT:PATH:<split>")


def rows_of_rows(table) -> list:
    return [table[i] for i in range(len(table))]


def test_a_folder_without_splits_reads_its_one_kind_of_rows(tmp_path):
    (tmp_path / "a").mkdir()
    parquet(tmp_path / "a" / "part-1.parquet", range(2, 3), 5)
    parquet(tmp_path / "a" / "part-0.parquet", range(2), 5)
    L._jsonl([{"id": 9}], tmp_path / "a" / "data" / "skipped.jsonl")
    assert [r.data["id"] for r in rows_of_rows(R.table(tmp_path / "a"))] == [0, 1, 2]
    assert [r.data["id"] for r in rows_of_rows(R.table(tmp_path / "a", "", "train"))] == [0, 1, 2]  # no train files
    parquet((tmp_path / "b" / "data").mkdir(parents=True) or tmp_path / "b" / "data" / "x.parquet", range(7, 8), 5)
    assert [r.data["id"] for r in rows_of_rows(R.table(tmp_path / "b"))] == [7]
    L._jsonl([{"id": 1}], tmp_path / "c" / "b.jsonl")
    L._jsonl([{"id": 0}], tmp_path / "c" / "a.jsonl")
    c = R.table(tmp_path / "c")
    assert [(r.data, r.where, r.index) for r in rows_of_rows(c)] == [
        ({"id": 0}, f"{tmp_path / 'c' / 'a.jsonl'}:1", 0), ({"id": 1}, f"{tmp_path / 'c' / 'b.jsonl'}:1", 1)]
    assert refusal(R.table, tmp_path / "c", "train") == (
        f"{tmp_path / 'c'}: no split 'train'; the copy's files name no split: give the folder without one, or a file")
    L._jsonl([{"id": 1}], tmp_path / "d" / "rows.jsonl")
    parquet(tmp_path / "d" / "more.parquet", range(1), 5)
    assert refusal(R.table, tmp_path / "d") == (
        f"{tmp_path / 'd'}: holds both parquet (more.parquet, ...) and JSON-lines (rows.jsonl, ...) files, and one "
        "kind would be ignored: name the file")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "rows.csv").write_text("id\n1\n")
    assert refusal(R.table, tmp_path / "e") == f"{tmp_path / 'e'}: no parquet or JSON-lines files"


def test_a_file_is_read_by_its_suffix(tmp_path):
    lines = L._jsonl([{"id": 1}, {"id": 2}], tmp_path / "rows.json")  # JSON lines under .json
    assert type(R.table(lines)) is R.JsonLines and [r.data["id"] for r in rows_of_rows(R.table(lines))] == [1, 2]
    listed = tmp_path / "list.json"
    listed.write_bytes(b"\xef\xbb\xbf \r\n\t[" + b" " * 80 + b'{"id": 3}]')
    assert type(R.table(listed)) is R.ListRows and rows_of(R.table(listed)) == [({"id": 3}, f"{listed} record 0", 0)]
    # a list indented by a pretty-printer's worth of blank lines, past any one read block, is still a list
    padded = tmp_path / "padded.json"
    padded.write_bytes(b"\xef\xbb\xbf" + b" \n" * 40000 + b'[{"id": 5}]')
    assert type(R.table(padded)) is R.ListRows and rows_of(R.table(padded)) == [({"id": 5}, f"{padded} record 0", 0)]
    assert type(R.table(lines)) is R.JsonLines  # and JSON lines stay JSON lines
    assert type(R.table(L._jsonl([{"id": 4}], tmp_path / "rows.txt"))) is R.JsonLines
    assert type(R.table(parquet(tmp_path / "p.parquet", range(1), 5))) is R.ParquetRows
    assert type(R.table(arrow(tmp_path / "s.arrow", range(1)))) is R.ArrowRows
    two = R.table_of([tmp_path / "rows.json", tmp_path / "list.json"])
    assert type(two) is R.Concat and rows_of(two) == [
        ({"id": 1}, f"{lines}:1", 0), ({"id": 2}, f"{lines}:2", 1), ({"id": 3}, f"{listed} record 0", 2)]
    assert refusal(R.table, tmp_path / "none.jsonl") == f"{tmp_path / 'none.jsonl'}: dataset file does not exist"
    assert refusal(R.table_of, [lines, tmp_path / "none.jsonl"]) == (
        f"{tmp_path / 'none.jsonl'}: dataset file does not exist")


@pytest.mark.parametrize("lead", [b"\x0b", b"\x0c", b"X"], ids=["vertical tab", "form feed", "a letter"])
@pytest.mark.parametrize("pad", [0, 70000], ids=["at the start", "past the first read block"])
def test_a_json_file_whose_first_byte_past_json_white_space_is_no_bracket_is_json_lines(tmp_path, lead, pad):
    """Only JSON's own white space (space, tab, CR, LF) is skipped to find the '[' of a list: a file that opens with
    another byte (Python's wider white space, a stray letter) is read as JSON lines, so its error names the line."""
    bad = tmp_path / "bad.json"
    bad.write_bytes(b" " * pad + lead + b'[{"id": 1}]\n{"id": 2}\n')
    table = R.table(bad)
    assert type(table) is R.JsonLines and len(table) == 2
    assert refusal(table.__getitem__, 0) == f"{bad}:1: malformed JSON: Expecting value (column {pad + 1})"
    assert table[1].data == {"id": 2}


def test_concatenated_tables_index_from_either_end_and_list_their_files(tmp_path):
    a = L._jsonl([{"id": 0}, {"id": 1}], tmp_path / "a.jsonl")
    b = L._jsonl([{"id": 2}], tmp_path / "b.jsonl")
    c = L._jsonl([{"id": 3}, {"id": 4}], tmp_path / "c.jsonl")
    rows = R.Concat([R.JsonLines(a), R.JsonLines(b), R.JsonLines(c)])
    assert rows.files == (str(a), str(b), str(c)) and len(rows) == 5
    assert rows_of(rows) == [({"id": 0}, f"{a}:1", 0), ({"id": 1}, f"{a}:2", 1), ({"id": 2}, f"{b}:1", 2),
                             ({"id": 3}, f"{c}:1", 3), ({"id": 4}, f"{c}:2", 4)]
    assert (rows[-3].data, rows[-3].where, rows[-3].index) == ({"id": 2}, f"{b}:1", 2)
    assert (rows[-5].data, rows[-5].where, rows[-5].index) == ({"id": 0}, f"{a}:1", 0)
    for i in (5, -6):
        with pytest.raises(IndexError, match=f"^{i}$"):
            rows[i]


# --- archives ------------------------------------------------------------------------------------------------------


def test_zip_members_are_read_by_name_and_its_lines_named_by_member_and_line(tmp_path):
    archive = L.write_zip(tmp_path / "MindCube.zip", {
        "raw/train.jsonl": b'\xef\xbb\xbf{"id": "a"}\n\n  \n{"id": "b"}\r\n{"id": "c"}',
        "notes.txt": "\ufeffthe copy's notes\n"})
    members = R.ZipFiles(archive)
    assert members.path == archive and members.names == {"raw/train.jsonl", "notes.txt"}
    assert members.open_text("notes.txt").read() == "the copy's notes\n"
    with pytest.raises(KeyError) as e:
        members.read("raw/test.jsonl")
    assert e.value.args == ("raw/test.jsonl",)
    rows = R.ZipLines(members, "raw/train.jsonl")
    assert rows.files == (str(archive),) and len(rows) == 3
    where = f"{archive}:raw/train.jsonl"
    assert rows_of(rows) == [({"id": "a"}, f"{where}:1", 0), ({"id": "b"}, f"{where}:4", 1),
                             ({"id": "c"}, f"{where}:5", 2)]
    assert (rows[-1].data, rows[-1].where, rows[-1].index) == ({"id": "c"}, f"{where}:5", 2)
    assert (rows[-3].data, rows[-3].where, rows[-3].index) == ({"id": "a"}, f"{where}:1", 0)
    for i in (3, -4):
        with pytest.raises(IndexError, match=f"^{i}$"):
            rows[i]
    copy = pickle.loads(pickle.dumps(rows))
    assert copy._lines is None and copy.members._zip is None and rows_of(copy) == rows_of(rows)
    assert pickle.loads(pickle.dumps(members))._zip is None


def test_a_zip_member_saved_with_a_byte_order_mark_before_a_blank_line_has_no_row_there(tmp_path):
    archive = L.write_zip(tmp_path / "data.zip", {"train.jsonl": b'\xef\xbb\xbf\r\n{"id": "a"}\n'})
    rows = R.ZipLines(R.ZipFiles(archive), "train.jsonl")
    assert rows_of(rows) == [({"id": "a"}, f"{archive}:train.jsonl:2", 0)]


def test_a_row_is_read_alone_so_a_later_row_that_cannot_be_read_spares_it(tmp_path):
    """A timestamp past Python's year 9999 has no Python value: the row before it still reads."""
    import datetime

    path = tmp_path / "data-0.arrow"
    table = pa.table({"id": [0, 1], "t": pa.array([0, 400_000 * 365 * 86_400], pa.timestamp("s"))})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    row = R.ArrowRows([path])[0]
    assert (row.data, row.where, row.index) == ({"id": 0, "t": datetime.datetime(1970, 1, 1)}, f"{path} row 0", 0)
    pq.write_table(table, tmp_path / "train.parquet")  # one row group: a row is sliced from it
    row = R.ParquetRows([tmp_path / "train.parquet"])[0]
    assert (row.data, row.where, row.index) == (
        {"id": 0, "t": datetime.datetime(1970, 1, 1)}, f"{tmp_path / 'train.parquet'} row 0", 0)


def test_a_damaged_or_missing_archive_is_named(tmp_path):
    (tmp_path / "bad.zip").write_bytes(b"PK not a zip")
    assert refusal(R.ZipFiles, tmp_path / "bad.zip") == (
        f"{tmp_path / 'bad.zip'}: cannot read the zip archive (File is not a zip file)")
    assert refusal(R.ZipFiles, tmp_path / "none.zip") == (
        f"{tmp_path / 'none.zip'}: cannot read the zip archive ([Errno 2] No such file or directory: "
        f"'{tmp_path / 'none.zip'}')")


@pytest.mark.parametrize("name, metadata", [
    ("__MACOSX/raw/._train.jsonl", True), ("__MACOSX/raw/train.jsonl", True), ("raw/._train.jsonl", True),
    ("._data.json", True), ("raw/train.jsonl", False), ("raw/__MACOSX.jsonl", False), ("a._b.json", False),
    ("x/__MACOSX", True),
])
def test_macos_metadata_is_told_from_the_data(name, metadata):
    assert R.apple_metadata(name) is metadata


def test_the_one_file_a_pattern_finds_is_located(tmp_path):
    for name in ("raw/train.jsonl", "raw/._train.jsonl", "__MACOSX/raw/train.jsonl", "a/data.json", "b/data.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("[]")
    (tmp_path / "dir.jsonl").mkdir()
    found = R.locate(tmp_path, ("train.jsonl", "**/train.jsonl"), "the training file")
    assert found == tmp_path / "raw" / "train.jsonl"
    assert R.locate(tmp_path, ("*.jsonl", "raw/*.jsonl"), "rows") == tmp_path / "raw" / "train.jsonl"
    assert refusal(R.locate, tmp_path, ("*/data.json",), "data.json") == (
        f"{tmp_path}: holds 2 copies of data.json ({tmp_path / 'a' / 'data.json'}, {tmp_path / 'b' / 'data.json'}); "
        "give the one to read")
    assert refusal(R.locate, tmp_path, ("*.parquet", "x/*.json"), "the rows") == (
        f"{tmp_path}: none of ['*.parquet', 'x/*.json'] (the rows)")


def test_a_source_converts_each_row_when_asked_for(tmp_path):
    path = L._jsonl([{"id": k} for k in range(5)], tmp_path / "rows.jsonl")
    source = R.Source(R.JsonLines(path), lambda row: (row.data["id"], row.where))
    assert source.files == (str(path),) and len(source) == 5
    assert source[1] == (1, f"{path}:2") and source[-1] == (4, f"{path}:5")
    assert source[1:4] == [(k, f"{path}:{k + 1}") for k in (1, 2, 3)]
    assert source[::-2] == [(k, f"{path}:{k + 1}") for k in (4, 2, 0)]
    assert source[3:99] == [(3, f"{path}:4"), (4, f"{path}:5")]
