"""VSI-590K (HF nyu-visionx/VSI-590K, Cambrian-S): video (and image) spatial QA in the LLaVA conversation layout
(data/sources/conversation.py), {id, video or image, conversations, question_type}; numeric questions (counts,
distances, sizes) have a number as gold, the others an option. The videos resolve under the copy's folder (or
image_dir). The card names the task types and the file; the row fields are inferred from the LLaVA layout.
Columns: conversations, image, video, id, category (default question_type), reference, image_dir, video_fps."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.sources import conversation
from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import Source, table

NAME = "vsi590k"
FIELDS = {**conversation.FIELDS, "category": "question_type"}


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    rows = table(path, split)
    ctx = F.Context(ctx.columns, Path(path) if Path(path).is_dir() else Path(path).parent, ctx.check)
    return Source(rows, lambda row: conversation.convert(row, ctx, NAME, FIELDS), NAME)
