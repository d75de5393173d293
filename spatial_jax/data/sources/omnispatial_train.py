"""OmniSpatial's training split (HF qizekun/OmniSpatial, `OmniSpatial-train.zip`), zipped or unzipped. Read as the
authors' vlms_eval/qwenvl_eval.py reads the test split (spatial_jax/suites/omnispatial.py): `data.json`, a list of
{id, question, options (list), answer (option index), task_type, sub_task_type}, and the image of id `N_k` at
`<task_type>/N.png`. That the training zip holds the same layout under one top folder (`OmniSpatial-train/`, the
folder third-party loaders of the zip open) is inferred: the card describes the files, not the zip's inside. A record
is keyed `<task_type>_<id>`; its category is sub_task_type.

PATH is any of: the zip (data.json and the images read as members, never extracted); the unzipped folder holding
data.json, or data.json itself; the folder one level above it (where the zip was unzipped,
`X/OmniSpatial-train/data.json`); a Hub snapshot holding OmniSpatial-train.zip. Entries under `__MACOSX/` and
AppleDouble `._name` files (macOS's zip adds them) are passed over, `data.json` lookalikes among them included.

What the training split writes that the test split does not:
- `question` as a list of strings: joined with a space, as the one training converter of this split that could be
  read joins them (MyLittleChange/VDrop, SpatialUnderstanding/data_creation/training_data/
  create_omnispatial_sft_data.py, process_omnispatial_item).
- `options: []`: the options are drawn in the image (the authors' reply in qizekun/OmniSpatial issue 9, about
  Complex_Logic). The gold stays an option letter, `A` + the 0-based `answer` (never the index read as a number), and
  each option's text names its mark in the image ("the option marked B in the image"). How many: 4 for Complex_Logic's
  sub-tasks (Pattern_Recognition, Geometric_Reasoning), exam-style items (paper section 3.2.1) in the benchmark's
  four-option format (section 3.2.2), as its Complex Logic example lists A-D (Fig. 1); inferred, no file states a
  count. For any other sub-task the count is unknown (`meta["options_in_image"] = "unknown"`) and the rule is A-D, the
  letters the benchmark's scorer reads (qwenvl_eval.py's `Answer\\s*:\\s*([A-D])`): a model is never asked for a
  letter the benchmark could not score, and a gold past D is an error naming the row and field.
Columns: question, options, answer, id, category, reference."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path, PurePosixPath

from spatial_jax.data.sample import LETTERS, DatasetError
from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import ListRows, Row, Source, ZipFiles, apple_metadata, json_list, locate
from spatial_jax.records import brief

NAME = "omnispatial-train"
FIELDS = {"question": "question", "options": "options", "answer": "answer", "id": "id",
          "category": "sub_task_type", "reference": ""}
ZIP = "OmniSpatial-train.zip"
# where data.json lies below PATH, first match wins: in it, in the training zip's folder, in any folder
DATA_JSON = ("data.json", "OmniSpatial-train/data.json", "*/data.json", ZIP)
IN_IMAGE_COUNT = {"Pattern_Recognition": 4, "Geometric_Reasoning": 4}  # Complex_Logic's sub-tasks (module doc)
IN_IMAGE_RULE = 4  # A-D, what the benchmark's scorer reads, where the count is unknown


def question(row: Row, field: str) -> str:
    raw = row.need(field, (str, list))
    if isinstance(raw, str):
        return raw
    if not raw or not all(isinstance(part, str) for part in raw):
        raise row.error(f"field '{field}' must be a text or a list of texts, got {brief(raw)}")
    return " ".join(raw).strip()


def drawn_options(sub_task: str) -> tuple[tuple[str, ...], dict]:
    """Options drawn in the image: one text per mark, and the count as known (or "unknown") for meta."""
    known = IN_IMAGE_COUNT.get(sub_task)
    texts = tuple(f"the option marked {letter} in the image" for letter in LETTERS[: known or IN_IMAGE_RULE])
    return texts, {"options_in_image": known or "unknown"}


def gold(row: Row, field: str, options: tuple[str, ...]) -> str:
    """The option letter of the record's 0-based index (read here, so no option's text is ever matched against the
    index); a gold written as text is left to F.gold."""
    raw = row.need(field, (int, str))
    if isinstance(raw, str):
        return raw
    if not 0 <= raw < len(options):
        raise row.error(f"field '{field}' = {raw} is no 0-based index of the {len(options)} options "
                        f"{brief(list(options))}")
    return LETTERS[raw]


def convert(row: Row, ctx: F.Context):
    col = {k: ctx.col(k, v) for k, v in FIELDS.items()}
    rid = str(row.need(col["id"], (str, int)))
    task = row.need("task_type", str)
    category = str(row.get(col["category"], ""))
    image = F.media(row, f"{task}/{rid.split('_')[0]}.png", "id", ctx)
    raw = row.need(col["options"])
    options, meta = drawn_options(category) if raw == [] else (F.option_texts(row, raw, col["options"]), {})
    return F.sample(row, sid=f"{task}_{rid}", question=question(row, col["question"]), options=options,
                    answer=gold(row, col["answer"], options), answer_field=col["answer"], pictures=(image,),
                    category=category, reference=row.get(col["reference"]), meta=meta)


def _zipped(path: Path, ctx: F.Context) -> tuple[ListRows, F.Context]:
    members = ZipFiles(path)
    found = sorted((n for n in members.names if PurePosixPath(n).name == "data.json" and not apple_metadata(n)),
                   key=len)
    if not found:
        raise DatasetError(f"{path}: the archive holds no data.json")
    try:
        data = json.load(members.open_text(found[0]))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}:{found[0]}: not valid JSON ({e})") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}:{found[0]}: expected a JSON list of records")
    rows = ListRows(data, Path(f"{path}:{found[0]}"))
    rows.files = (str(path),)  # what a digest reads: the archive (`zip:member` names no file)
    return rows, dataclasses.replace(ctx, base=path.parent, members=members, prefix=found[0][: -len("data.json")])


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    path = Path(path)
    if path.is_dir():
        path = locate(path, DATA_JSON, "OmniSpatial's training split")
    if zipfile.is_zipfile(path):
        rows, ctx = _zipped(path, ctx)
    else:
        rows = json_list(path)
        ctx = ctx.beside(path)
    return Source(rows, lambda row: convert(row, ctx))
