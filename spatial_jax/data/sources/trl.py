"""TRL's GRPO vision datasets, as trl's GRPOTrainer takes them (docs "GRPO Trainer", vision-language section, and
its examples/scripts/grpo_vlm.py): a `prompt` column, conversational ([{"role": "user", "content": [{"type":
"image"}, {"type": "text", "text": ...}]}]) or a plain string, with one picture in `image` or several in `images`
(Hub image structs or paths); every other column reaches the reward functions as a keyword argument, and the
published vision sets name the gold `solution` (inferred from trl's examples; `answer` where a set names it so).
Columns: prompt, image, images, answer, id, category, reference."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources import verl
from spatial_jax.data.sources.rows import Row, Source, table

NAME = "trl"
FIELDS = {"prompt": "prompt", "image": "image", "images": "images", "answer": "solution", "id": "id",
          "category": "", "reference": ""}


def convert(row: Row, ctx: F.Context):
    col = {k: ctx.col(k, v) for k, v in FIELDS.items()}
    question, options = F.split_options(F.strip_markers(verl.user_text(row, col["prompt"])))
    key = col["images"] if row.get(col["images"]) not in (None, []) else col["image"]
    pictures = () if row.get(key) in (None, []) else F.media_list(row, row.need(key), key, ctx)  # none: text-only
    answer = col["answer"]
    if row.get(answer) is None and "answer" not in ctx.columns and row.get("answer") is not None:
        answer = "answer"
    return F.sample(row, sid=row.get(col["id"], f"{NAME}-{row.index}"), question=question, options=options,
                    answer=row.need(answer, (str, int, float)), answer_field=answer,
                    pictures=pictures, category=str(row.get(col["category"], "")),
                    reference=row.get(col["reference"]))


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    rows = table(path, split, default="train")
    ctx = ctx.beside(path)
    return Source(rows, lambda row: convert(row, ctx))
