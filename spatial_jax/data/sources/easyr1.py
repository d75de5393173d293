"""EasyR1's RL data, as hiyouga/EasyR1's verl/utils/dataset.py (RLHFDataset) reads it: parquet (a file, or a folder
of `<split>` files as the Hub lays them out) or JSON lines; each row's prompt_key ("prompt": the question, `<image>`
marking where each image goes), answer_key ("answer": the gold the reward compares), image_key ("images": embedded
{bytes} structs or paths, joined to image_dir when one is set), video_key ("videos": a video file or a list of frame
files). EasyR1 sets these keys in its data config; here they are `data.columns` entries of the same names without
`_key` (prompt, answer, images, videos) plus id, category, reference and `image_dir` (a folder; default: the
copy's own). Options are the ones the prompt lists (`A. ...`)."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources import verl
from spatial_jax.data.sources.rows import Row, Source, table

NAME = "easyr1"
FIELDS = {"prompt": "prompt", "question": "", "images": "images", "videos": "videos", "answer": "answer",
          "id": "id", "category": "", "reference": ""}


def convert(row: Row, ctx: F.Context):
    return verl.convert(row, ctx, NAME, FIELDS)


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    rows = table(path, split or "train")
    ctx = F.Context(ctx.columns, Path(path) if Path(path).is_dir() else Path(path).parent, ctx.check)
    return Source(rows, lambda row: convert(row, ctx), NAME)
