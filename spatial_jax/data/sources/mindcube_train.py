"""MindCube's training split (HF MLL-Lab/MindCube, `data.zip`, which the authors' download script fetches from
Inevitablevalor/MindCube; code mll-lab-nu/MindCube), read as the benchmark loader reads its test file
(spatial_jax/suites/mindcube.py, after the authors' data layout): JSON lines {id, question (options inline,
`A. ... B. ...`), gt_answer (letter), images (paths relative to the data folder, under `other_all_image/`)}. The
training file is `raw/MindCube_train.jsonl` in the data folder (the authors' README feeds it to their
scripts/data_processing.py); images resolve against the data folder, the `./data/` their src/inference/base.py
prepends. The category is the setting the id names (around, rotation, translation, among), as the authors'
get_setting_from_id reads it.

PATH is any of: `data.zip` as the Hub serves it, read like the folder it unzips to (the training file and the views
are members, read when a row asks for them, never extracted); the data folder; the training file; or the folder one
level above the data folder (where data.zip was unzipped, `X/data/raw/...`, or a Hub snapshot holding data.zip). The
authors' scripts/bash_scripts/download_data.bash unzips data.zip to its top `data/` folder and deletes the
`__MACOSX/` tree the zip carries (macOS's AppleDouble `._name` files); here every `__MACOSX/` or `._` entry is passed
over.
Columns: question, answer, images, id, reference."""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path, PurePath, PurePosixPath

from spatial_jax.data.sample import DatasetError
from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import JsonLines, Row, Rows, Source, ZipFiles, ZipLines, apple_metadata, locate

NAME = "mindcube-train"
FIELDS = {"question": "question", "answer": "gt_answer", "images": "images", "id": "id", "reference": ""}
FILES = ("raw/MindCube_train.jsonl", "MindCube_train.jsonl")
ZIP = "data.zip"  # the archive's name on the Hub (download_data.bash's ZIP_NAME)
# the settings the ids name; the test split's loader reads its categories with the same function
SETTINGS = ("around", "rotation", "translation", "among")


def setting(record_id: str) -> str:
    low = record_id.lower()
    return next((s for s in SETTINGS if s in low), "other")


def convert(row: Row, ctx: F.Context):
    col = {k: ctx.col(k, v) for k, v in FIELDS.items()}
    rid = str(row.need(col["id"], (str, int)))
    question, options = F.split_options(row.need(col["question"], str))
    if not options:
        raise row.error(f"field '{col['question']}' lists no options (`A. ...`)")
    return F.sample(row, sid=rid, question=question, options=options, answer=row.need(col["answer"], str),
                    answer_field=col["answer"], pictures=F.media_list(row, row.need(col["images"]), col["images"], ctx),
                    category=setting(rid), reference=row.get(col["reference"]))


def _data_folder(file: PurePath) -> PurePath:
    """The folder the views resolve against: the one holding the training file's `raw/` folder, else the file's."""
    return file.parent.parent if file.parent.name == "raw" else file.parent


def _in_zip(members: ZipFiles) -> str:
    for f in FILES:
        hits = sorted((n for n in members.names if (n == f or n.endswith("/" + f)) and not apple_metadata(n)), key=len)
        if hits:
            return hits[0]
    raise DatasetError(f"{members.path}: the archive holds none of {list(FILES)} (MindCube's training split)")


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    path = Path(path)
    if path.is_dir():
        path = locate(path, (*FILES, f"*/{FILES[0]}", ZIP), "MindCube's training split")
    if zipfile.is_zipfile(path):
        members = ZipFiles(path)
        name = _in_zip(members)
        folder = _data_folder(PurePosixPath(name))
        prefix = "" if folder == PurePosixPath(".") else f"{folder}/"
        rows: Rows = ZipLines(members, name)
        ctx = dataclasses.replace(ctx, base=path.parent, members=members, prefix=prefix)
    else:
        rows = JsonLines(path)
        ctx = dataclasses.replace(ctx, base=_data_folder(path))
    return Source(rows, lambda row: convert(row, ctx))
