"""A `datasets` save_to_disk folder (data/sources/hf_disk.py) as users hold one: a Dataset folder or a DatasetDict's,
its split chosen as `datasets.load_from_disk(...)[split]` would be, its rows read by the layout their columns name,
and each way such a folder breaks named in one line. The folders are written with pyarrow as datasets 3 writes them
(an Arrow IPC stream per file, `state.json` listing `_data_files`, `dataset_dict.json` listing `splits`)."""

import json
from pathlib import Path

import layout_copies as L
import pyarrow as pa
import pytest

from spatial_jax.data.sources import open_spec

QUESTION = "Which object is nearer?\nA. the cube\nB. the ball"
# one row per layout, each with the columns that name it (hf_disk.layout_of) and the gold B
ROWS = {
    "verl": {"prompt": [{"role": "user", "content": QUESTION}], "reward_model": {"ground_truth": "B"}},
    "stvqa7k": {"question_only": "Which object is nearer?", "options": ["the cube", "the ball"],
                "answer_option_text": "the ball", "images": "p.png"},
    "conversation": {"conversations": [{"from": "human", "value": QUESTION}, {"from": "gpt", "value": "B"}]},
    "trl": {"prompt": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}], "solution": "B"},
    "easyr1": {"problem": QUESTION, "answer": "B"},
}


def save(folder: Path, rows: list[dict], files: int = 1) -> Path:
    """One saved Dataset: its rows over `files` Arrow streams, and state.json naming them."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data-{k:05d}-of-{files:05d}.arrow" for k in range(files)]
    for k, name in enumerate(names):
        table = pa.Table.from_pylist(rows[k::files])
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names]}))
    return folder


def save_dict(root: Path, splits: dict[str, list[dict]]) -> Path:
    for split, rows in splits.items():
        save(root / split, rows)
    (root / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    return root



@pytest.mark.parametrize("layout", list(ROWS))
def test_rows_are_read_by_the_layout_their_columns_name(tmp_path, layout):
    L._save(L.BLANK, tmp_path / "p.png")
    s = open_spec(f"hf-disk:{save(tmp_path, [ROWS[layout]])}")[0]
    assert (s.question, s.options, s.answer) == ("Which object is nearer?", ("the cube", "the ball"), "B")
    # a row's id names its layout, or the folder where the layout names none (LLaVA's own id column aside)
    assert s.id == {"verl": "verl-0", "stvqa7k": "stvqa7k-train-0", "conversation": "hf-disk-0", "trl": "trl-0",
                    "easyr1": "easyr1-0"}[layout]
    assert s.image == (str(tmp_path / "p.png") if layout == "stvqa7k" else None)  # relative to the split folder


def test_a_layout_named_in_the_columns_is_read_so(tmp_path):
    row = {"prompt": QUESTION, "answer": "B", "problem": "How far is it?"}
    folder = save(tmp_path, [row])
    assert open_spec(f"hf-disk:{folder}")[0].question == "How far is it?"  # problem: EasyR1's
    assert open_spec(f"hf-disk:{folder}?layout=easyr1&prompt=prompt")[0].options == ("the cube", "the ball")
    assert L.row_error(f"hf-disk:{folder}?layout=llava") == (
        "data.columns layout='llava' is none of ['verl', 'stvqa7k', 'conversation', 'trl', 'easyr1']")
    other = save(tmp_path / "other", [{"question": "Where?", "gold": "B"}])
    assert L.row_error(f"hf-disk:{other}") == (
        f"{other / 'data-00000-of-00001.arrow'} row 0: columns ['gold', 'question'] match no known layout; name one "
        "with data.columns layout=<one of ['verl', 'stvqa7k', 'conversation', 'trl', 'easyr1']>")


def test_the_split_is_chosen_as_load_from_disk_would(tmp_path):
    easy = ROWS["easyr1"]
    root = save_dict(tmp_path / "dd", {"test": [{**easy, "id": "t"}], "train": [{**easy, "id": "r"}]})
    assert [s.id for s in open_spec(f"hf-disk:{root}")] == ["r"]  # train where there is one
    assert [s.id for s in open_spec(f"hf-disk:{root}:test")] == ["t"]
    assert [s.id for s in open_spec(f"hf-disk:{root / 'test'}")] == ["t"]  # one Dataset's own folder
    only = save_dict(tmp_path / "only", {"validation": [{**easy, "id": "v"}], "test": [{**easy, "id": "t"}]})
    assert [s.id for s in open_spec(f"hf-disk:{only}")] == ["v"]  # else the first one saved
    assert L.row_error(f"hf-disk:{root}:val") == f"{root}: split 'val' is none of the saved splits ['test', 'train']"
    many = save(tmp_path / "many", [{**easy, "id": str(k)} for k in range(5)], files=2)
    assert sorted(s.id for s in open_spec(f"hf-disk:{many}")) == ["0", "1", "2", "3", "4"]


def test_a_broken_folder_is_one_line_naming_the_file(tmp_path):
    assert L.row_error(f"hf-disk:{tmp_path}") == (
        f"{tmp_path}: no state.json or dataset_dict.json (a datasets save_to_disk folder)")
    folder = save(tmp_path / "ds", [ROWS["easyr1"]])
    state = folder / "state.json"
    unnamed = "a '_data_files' entry names no file"
    for text, why in [
            ("[1]", "expected a JSON object"),
            ("{", "cannot read (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
            ('{"_data_files": []}', "lists no '_data_files'"),
            ('{"_data_files": {"filename": "x"}}', "lists no '_data_files'"),
            ('{"_data_files": ["x"]}', f"{unnamed} (\"'x'\")"),
            ('{"_data_files": [{"filename": " "}]}', f"{unnamed} (\"{{'filename': ' '}}\")"),
            ('{"_data_files": [{"filename": "../x.arrow"}]}',
             "names '../x.arrow', which is not a file in its own folder"),
            ('{"_data_files": [{"filename": "gone.arrow"}]}', "names gone.arrow, which is missing")]:
        state.write_text(text)
        assert L.row_error(f"hf-disk:{folder}") == f"{state}: {why}", text
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text("{}")
    assert L.row_error(f"hf-disk:{tmp_path / 'dd'}") == f"{tmp_path / 'dd'}: split '' is none of the saved splits []"


def test_a_missing_picture_is_named_unless_pictures_go_unchecked(tmp_path):
    folder = save(tmp_path / "ds", [ROWS["stvqa7k"]])
    assert L.row_error(f"hf-disk:{folder}") == (
        f"{folder / 'data-00000-of-00001.arrow'} row 0: field 'images': image {folder / 'p.png'} does not exist")
    assert open_spec(f"hf-disk:{folder}", check_images=False)[0].image == str(folder / "p.png")


def test_stvqa_rows_of_a_named_split_are_named_by_it(tmp_path):
    L._save(L.BLANK, tmp_path / "dd" / "val" / "p.png")
    root = save_dict(tmp_path / "dd", {"train": [ROWS["stvqa7k"]], "val": [ROWS["stvqa7k"]]})
    assert [s.id for s in open_spec(f"hf-disk:{root}:val")] == ["stvqa7k-val-0"]
