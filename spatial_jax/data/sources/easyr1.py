"""EasyR1's RL data, as hiyouga/EasyR1's verl/utils/dataset.py (RLHFDataset) reads it with the keys its
examples/config.yaml sets (`data.prompt_key: problem`, `answer_key: answer`, `image_key: images`, `video_key:
videos`, `image_dir: null`), which its reference sets (hiyouga/geometry3k, hiyouga/math12k) follow: parquet (a file,
or a folder of `<split>` files as the Hub lays them out) or JSON lines; each row's `problem` (the question, `<image>`
marking where each image goes), `answer` (the gold the reward compares), `images` (embedded {bytes} structs or
paths, joined to image_dir when one is set), `videos` (a video file or a list of frame files, joined the same way).
Here these keys are `data.columns` entries named without `_key` (prompt, answer, images, videos) plus id, category,
reference and `image_dir` (a folder; default: the copy's own). Options are the ones the prompt lists (`A. ...`)."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources import verl
from spatial_jax.data.sources.rows import Row, Source, table

NAME = "easyr1"
FIELDS = {"prompt": "problem", "question": "", "images": "images", "videos": "videos", "answer": "answer",
          "id": "id", "category": "", "reference": ""}


def convert(row: Row, ctx: F.Context):
    fields = FIELDS
    if row.get(FIELDS["prompt"]) is None and isinstance(row.get("prompt"), str):
        fields = {**FIELDS, "prompt": "prompt"}  # a copy written for RLHFDataset's own default prompt_key (a
        # data.columns prompt still wins: verl.convert reads the columns first)
    return verl.convert(row, ctx, NAME, fields)


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    rows = table(path, split, default="train")
    ctx = ctx.beside(path)
    return Source(rows, lambda row: convert(row, ctx))
