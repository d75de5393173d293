"""SPAR-7M (HF jasonzhango/SPAR-7M; the authors' repo LogosRoboticsGroup/SPAR): QA files in the LLaVA conversation
layout (data/sources/conversation.py) with the images of each scene unpacked from the per-source archives
(scannet.tar.gz, ...) so that the rows' relative image paths resolve under the copy's folder (or image_dir). The
card lists the archives and the LLaVA-style training json; the row fields (`image` a path or a list for multi-view
tasks, `type` the task) are inferred from the LLaVA layout the file is named after. JSON lines and parquet stream;
a `.json` list is parsed whole. Columns: conversations, image, video, id, category, reference, image_dir."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.sources import conversation
from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import Source, table

NAME = "spar7m"


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    rows = table(path, split)
    ctx = F.Context(ctx.columns, Path(path) if Path(path).is_dir() else Path(path).parent, ctx.check)
    return Source(rows, lambda row: conversation.convert(row, ctx, NAME, conversation.FIELDS), NAME)
