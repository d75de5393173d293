"""A folder written by `datasets`' Dataset.save_to_disk (or DatasetDict.save_to_disk: `dataset_dict.json` and one
such folder per split), read with pyarrow alone: `state.json` lists the Arrow files (`_data_files`, IPC streams),
memory-mapped. The rows keep the columns of the set that was saved, so they are read by the layout those columns
name: verl's (`reward_model`), STVQA-7K's (`answer_option_text`), LLaVA conversations (`conversations`), TRL's
(`prompt` a chat list) or EasyR1's (`problem`); `data.columns` layout=<name> says it outright.
Columns: the chosen layout's."""

from __future__ import annotations

import json
from pathlib import Path

from spatial_jax.data.sample import DatasetError
from spatial_jax.data.sources import conversation, easyr1, stvqa7k, trl, verl
from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import ArrowRows, Row, Source
from spatial_jax.records import brief

NAME = "hf-disk"
# layout -> its reader of one row (row, context, split)
READERS = {"verl": lambda row, ctx, split: verl.convert(row, ctx),
           "stvqa7k": lambda row, ctx, split: stvqa7k.convert(row, ctx, split or "train"),
           "conversation": lambda row, ctx, split: conversation.convert(row, ctx, NAME, conversation.FIELDS),
           "trl": lambda row, ctx, split: trl.convert(row, ctx),
           "easyr1": lambda row, ctx, split: easyr1.convert(row, ctx)}
LAYOUTS = tuple(READERS)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: expected a JSON object")
    return data


def split_folder(path: Path, split: str) -> Path:
    """The folder of one saved Dataset: `path` itself, or a DatasetDict's split folder."""
    if (path / "state.json").is_file():
        return path
    if (path / "dataset_dict.json").is_file():
        splits = _read_json(path / "dataset_dict.json").get("splits", [])
        split = split or ("train" if "train" in splits else (splits or [""])[0])
        if split not in splits:
            raise DatasetError(f"{path}: split {split!r} is none of the saved splits {splits}")
        return path / split
    raise DatasetError(f"{path}: no state.json or dataset_dict.json (a datasets save_to_disk folder)")


def layout_of(row: Row, forced: str | None) -> str:
    """The layout data.columns names (`forced`), else the one the row's columns name (the rows of an Arrow file are
    always objects)."""
    if forced:
        if forced not in LAYOUTS:
            raise DatasetError(f"data.columns layout={forced!r} is none of {list(LAYOUTS)}")
        return forced
    data = row.data
    if "reward_model" in data:
        return "verl"
    if "answer_option_text" in data:
        return "stvqa7k"
    if "conversations" in data:
        return "conversation"
    if isinstance(data.get("prompt"), list):
        return "trl"
    if isinstance(data.get("problem"), str) or isinstance(data.get("prompt"), str):
        return "easyr1"
    raise row.error(f"columns {sorted(data)} match no known layout; name one with data.columns layout=<one of "
                    f"{list(LAYOUTS)}>")


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    folder = split_folder(Path(path), split)
    state = _read_json(folder / "state.json")
    listed = state.get("_data_files")
    if not isinstance(listed, list) or not listed:
        raise DatasetError(f"{folder / 'state.json'}: lists no '_data_files'")
    files = []
    for entry in listed:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise DatasetError(f"{folder / 'state.json'}: a '_data_files' entry names no file ({brief(repr(entry))})")
        if Path(folder.resolve(), name).resolve().parent != folder.resolve():
            raise DatasetError(f"{folder / 'state.json'}: names {name!r}, which is not a file in its own folder")
        files.append(folder / name)
    for f in files:
        if not f.is_file():
            raise DatasetError(f"{folder / 'state.json'}: names {f.name}, which is missing")
    rows = ArrowRows(files)
    ctx = ctx.beside(folder)
    forced = ctx.columns.get("layout")
    return Source(rows, lambda row: READERS[layout_of(row, forced)](row, ctx, split))
