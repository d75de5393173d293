"""OmniSpatial's training split (HF qizekun/OmniSpatial, `OmniSpatial-train.zip`), zipped or unzipped. Read as the
authors' vlms_eval/qwenvl_eval.py reads the test split (spatial_jax/benchmarks/omnispatial.py): `data.json`, a list of
{id, question, options (list), answer (option index), task_type, sub_task_type}, and the image of id `N_k` at
`<task_type>/N.png`. That the training zip holds the same layout as the test zip (possibly under one top folder) is
inferred: the card describes the files, not the training zip's inside. In the zip, `data.json` and the images are
read as members, never extracted. A record is keyed `<task_type>_<id>`; its category is sub_task_type.
Columns: question, options, answer, id, category, reference."""

from __future__ import annotations

import json
from pathlib import Path

from spatial_jax.data.sample import DatasetError
from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import ListRows, Row, Source, ZipFiles, json_list

NAME = "omnispatial-train"
FIELDS = {"question": "question", "options": "options", "answer": "answer", "id": "id",
          "category": "sub_task_type", "reference": ""}


def convert(row: Row, ctx: F.Context):
    col = {k: ctx.col(k, v) for k, v in FIELDS.items()}
    rid = str(row.need(col["id"], (str, int)))
    task = row.need("task_type", str)
    image = F.media(row, f"{task}/{rid.split('_')[0]}.png", "id", ctx)
    return F.sample(row, sid=f"{task}_{rid}", question=row.need(col["question"], str),
                    options=F.option_texts(row, row.need(col["options"]), col["options"]),
                    answer=row.need(col["answer"], (int, str)), answer_field=col["answer"], pictures=(image,),
                    category=str(row.get(col["category"], "")),
                    reference=row.get(col["reference"]) if col["reference"] else None)


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    path = Path(path)
    if path.suffix == ".zip":
        members = ZipFiles(path)
        found = sorted((n for n in members.names if n.rsplit("/", 1)[-1] == "data.json"), key=len)
        if not found:
            raise DatasetError(f"{path}: the archive holds no data.json")
        prefix = found[0][: -len("data.json")]
        try:
            data = json.load(members.open_text(found[0]))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DatasetError(f"{path}:{found[0]}: not valid JSON ({e})") from None
        if not isinstance(data, list):
            raise DatasetError(f"{path}:{found[0]}: expected a JSON list of records")
        rows = ListRows(data, Path(f"{path}:{found[0]}"))
        ctx = F.Context(ctx.columns, path.parent, ctx.check, members, prefix)
    else:
        data_json = path if path.is_file() else path / "data.json"
        if not data_json.is_file():
            raise DatasetError(f"{path}: no data.json (OmniSpatial's training split, unzipped)")
        rows = json_list(data_json)
        ctx = F.Context(ctx.columns, data_json.parent, ctx.check)
    return Source(rows, lambda row: convert(row, ctx), NAME)
