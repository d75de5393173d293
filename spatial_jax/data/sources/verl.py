"""verl's RL parquet, as volcengine/verl's examples/data_preprocess/geo3k.py writes it and
verl/utils/dataset/rl_dataset.py (RLHFDataset: prompt_key "prompt", image_key "images", video_key "videos") reads
it: each row {data_source, prompt: [{"role": "user", "content": "<image>question ..."}], images: [{bytes, path}],
ability, reward_model: {style: "rule", ground_truth}, extra_info: {split, index, answer, question}}. The reward
reads reward_model.ground_truth.

The question shown is extra_info.question where the row keeps it (geo3k.py's prompt appends its own answer
instruction; the method adds its own), else the user turn's text without `<image>` markers; options are the ones it
lists (`A. ...`), which verl leaves inside the prompt. Columns (`data.columns`): prompt, question, images, videos,
answer, id, category, reference (none by default: verl's RL rows carry no completion)."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import Row, Source, table

NAME = "verl"
FIELDS = {"prompt": "prompt", "question": "extra_info.question", "images": "images", "videos": "videos",
          "answer": "reward_model.ground_truth", "id": "extra_info.index", "category": "data_source",
          "reference": ""}


def user_text(row: Row, field: str) -> str:
    """The text of the last user turn of a chat list (a string, or the text of its {type: text} parts), or a
    string."""
    prompt = row.need(field, (str, list))
    if isinstance(prompt, str):
        return prompt
    turns = [t for t in prompt if isinstance(t, dict) and t.get("role") == "user"]
    if not turns:
        raise row.error(f"field '{field}' holds no user turn")
    content = turns[-1].get("content")
    if isinstance(content, list):  # the pictures' parts are placed by the pipeline: the text parts only
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
    if not isinstance(content, str):
        raise row.error(f"field '{field}': the user turn's content is no text")
    return content


def pictures(row: Row, ctx: F.Context, images: str, videos: str):
    """(images, video) of a row; ((), None) for a text-only row (no value, or an empty list, in either column), which
    verl's and EasyR1's RLHFDataset take as a prompt without pictures."""
    if row.get(videos) not in (None, []):
        return (), F.video(row, row.get(videos), videos, ctx)
    if row.get(images) in (None, []):
        return (), None
    return F.media_list(row, row.need(images), images, ctx), None


def convert(row: Row, ctx: F.Context, name: str = NAME, fields: dict = FIELDS) -> object:
    col = {k: ctx.col(k, v) for k, v in fields.items()}
    text = row.get(col["question"])
    if not isinstance(text, str):
        text = user_text(row, col["prompt"])
    question, options = F.split_options(F.strip_markers(text))
    images, clip = pictures(row, ctx, col["images"], col["videos"])
    return F.sample(row, sid=row.get(col["id"], f"{name}-{row.index}"), question=question, options=options,
                    answer=row.need(col["answer"], (str, int, float)), answer_field=col["answer"], pictures=images,
                    clip=clip, category=str(row.get(col["category"], "")),
                    reference=row.get(col["reference"]))


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    rows = table(path, split, default="train")
    ctx = ctx.beside(path)
    return Source(rows, lambda row: convert(row, ctx))
