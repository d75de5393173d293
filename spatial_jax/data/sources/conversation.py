"""LLaVA-style conversation rows, the layout SPAR-7M's and VSI-590K's training files use: {id, image (a path or a
list) or video (a path), conversations: [{from: "human", value: "<image>\\nquestion"}, {from: "gpt", value:
answer}]}. The question is the first human turn without its `<image>` / `<video>` markers, the gold the first gpt
turn (an option's letter or text when the question lists options, else a number); the gpt turn is also the SFT
reference. Paths resolve against the copy's folder or data.columns image_dir."""

from __future__ import annotations

from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import Row

FIELDS = {"conversations": "conversations", "image": "image", "video": "video", "id": "id", "category": "type",
          "reference": ""}


def turn(row: Row, field: str, speaker: str) -> str:
    turns = row.need(field, list)
    for t in turns:
        if isinstance(t, dict) and t.get("from") == speaker and isinstance(t.get("value"), str):
            return t["value"]
    raise row.error(f"field '{field}' has no '{speaker}' turn")


def convert(row: Row, ctx: F.Context, name: str, fields: dict):
    col = {k: ctx.col(k, v) for k, v in fields.items()}
    question, options = F.split_options(F.strip_markers(turn(row, col["conversations"], "human")))
    reply = turn(row, col["conversations"], "gpt")
    if row.get(col["video"]) is not None:
        images, clip = (), F.video(row, row.get(col["video"]), col["video"], ctx)
    elif row.get(col["image"]) in (None, []):  # LLaVA's text-only conversations
        images, clip = (), None
    else:
        images, clip = F.media_list(row, row.need(col["image"]), col["image"], ctx), None
    return F.sample(row, sid=row.get(col["id"], f"{name}-{row.index}"), question=question, options=options,
                    answer=reply, answer_field=f"{col['conversations']}[gpt]", pictures=images, clip=clip,
                    category=str(row.get(col["category"], "")),
                    reference=row.get(col["reference"]) if col["reference"] else reply)
