"""STVQA-7K (HF hunarbatra/STVQA-7K; parquet, splits train and val, `data/<split>-*.parquet`), as its card's features
and SpatialThinker's training scripts read it: `images` (one embedded image), `problem` (the question with its
options and the authors' instructions), `question_only`, `question_with_options`, `options` (list), `answer` (the
reference scene graph and answer tag: SpatialThinker's completion, the SFT target here), `answer_option_text`
(the gold option with its letter, which the authors' SpatialThinker script scores), `answer_option_text_only`
(their plain-GRPO baseline's key), `category`, `level`, `image_id`.

The model is shown `question_only` and the lettered `options` (the layout keeps them apart); the gold is read from
`answer_option_text`. The card lists these features without example values: that `options` may carry their
letters (`A. left`) and that the gold may be written `(B) left`, `B` or the option's text are inferred, and all are
read. Columns: question, options, answer, images, id, category, reference (e.g. `question=question_with_options`,
`answer=answer_option_text_only` for the authors' baseline)."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import Row, Source, table

NAME = "stvqa7k"
FIELDS = {"question": "question_only", "options": "options", "answer": "answer_option_text", "images": "images",
          "id": "", "category": "category", "reference": "answer"}


def convert(row: Row, ctx: F.Context, split: str):
    col = {k: ctx.col(k, v) for k, v in FIELDS.items()}
    # options come from their own column; any the question lists (question_with_options) are split off it
    question, _ = F.split_options(F.strip_markers(row.need(col["question"], str)))
    options = F.option_texts(row, row.need(col["options"]), col["options"])
    return F.sample(row, sid=row.get(col["id"], f"{NAME}-{split}-{row.index}"), question=question,
                    options=options, answer=row.need(col["answer"], (str, int)), answer_field=col["answer"],
                    pictures=F.media_list(row, row.need(col["images"]), col["images"], ctx),
                    category=str(row.get(col["category"], "")), reference=row.get(col["reference"]))


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    split = split or "train"
    rows = table(path, split)
    ctx = ctx.beside(path)
    return Source(rows, lambda row: convert(row, ctx, split))
