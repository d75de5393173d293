"""SPAR-7M (HF jasonzhango/SPAR-7M; the authors' repo LogosRoboticsGroup/SPAR) as the authors' readme extracts it
(`cat spar-*.tar.gz | tar -xzf -`):

  spar/<source>/images/<scene>/{image_color,video_color}/...
  spar/<source>/qa_jsonl/<split>/<task>/<fill|select|sentence|judge>/<format>_<N>.jsonl

`spar7m:PATH[:split]` reads every source and task of one split (its `qa_jsonl/<split>/` folders; default train, the
one the authors' training index is made from) from the folder holding `spar/`, from `spar/` or from one
`spar/<source>`; a single file of rows (or a folder of them outside such a tree) reads as the LLaVA layout.

Read from the authors' code: datasets/generate_data_josn.py (process_dataset) indexes each
`qa_jsonl/train/<task>/<format>/*.jsonl` with `spar/<source>/images` as its image root; datasets/toy_dataset.py
(SPARDataset) joins each listed path to that root (os.path.join, so an absolute path stays as it is), reads a row
with more than 10 pictures, or of type `nav` (here: with more than one), as a video's frames and one with 2-10 as
views, and draws the row's markers on every row it loads (spar_markers.py says how); datasets/mix_data.py names the
four answer formats; the readme's row shows the fields (`conversations`, `image` a list, `type`, `red_point`).
Inferred: a `select` row lists its options in the question, its gold an option's letter or text (fields.gold reads
both); `fill`, `sentence` and `judge` golds are numbers or text, never options; the frames of a video row carry no
rate, so data.columns video_fps (default 2) gives it; a file inside the tree read alone resolves its pictures against
its source's images folder as the tree does. Columns: conversations, image, video, id, category, reference, image_dir.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from spatial_jax.data.sample import DatasetError, Video
from spatial_jax.data.sources import conversation, spar_markers
from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import Concat, Row, Source, table, table_of

NAME = "spar7m"
SPLIT = "train"
OPEN_FORMATS = ("fill", "sentence", "judge")  # answered in words or numbers, never by an option
MAX_VIEWS = 10  # toy_dataset.py: a row with more pictures is a video's frames


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    path = Path(path)
    sources = _sources(path) if path.is_dir() else []
    if not sources:
        rows = table(path, split)
        base, fmt = _placed(path)
        own = dataclasses.replace(ctx, base=base)
        return Source(rows, lambda row: convert(row, own, fmt))
    files = _split_files(path, sources, split or SPLIT)
    rows = Concat([table_of([f]) for _, f in files])
    settings = [(dataclasses.replace(ctx, base=source / "images"), f.parent.name) for source, f in files]
    return Source(rows, lambda row: convert(row, *settings[_part(rows, row)]))


def _sources(path: Path) -> list[Path]:
    """The `spar/<source>` folders PATH names: itself, those under it (PATH is `spar/`) or under its `spar/`."""
    if (path / "qa_jsonl").is_dir():
        return [path]
    top = path / "spar" if (path / "spar").is_dir() else path
    return sorted(d for d in top.iterdir() if (d / "qa_jsonl").is_dir())


def _split_files(path: Path, sources: list[Path], split: str) -> list[tuple[Path, Path]]:
    """(source, rows file) of every task and format of the split, in name order."""
    splits = sorted({d.name for s in sources for d in (s / "qa_jsonl").iterdir() if d.is_dir()})
    if split not in splits:
        raise DatasetError(f"{path}: SPAR-7M has no split {split!r} here; its qa_jsonl folders hold "
                           f"{', '.join(splits) or 'no split'}")
    files = [(s, f) for s in sources for f in sorted((s / "qa_jsonl" / split).glob("*/*/*.jsonl"))]
    if not files:
        raise DatasetError(f"{path}: no qa_jsonl/{split}/<task>/<format>/*.jsonl file")
    return files


def _placed(path: Path) -> tuple[Path, str]:
    """(image root, answer format) of rows read outside a tree walk: a file at
    `<source>/qa_jsonl/<split>/<task>/<format>/` resolves against `<source>/images`, others against their folder."""
    if path.is_file() and path.parts[-5:-4] == ("qa_jsonl",):
        return path.parents[4] / "images", path.parent.name
    return (path if path.is_dir() else path.parent), ""


def _part(rows: Concat, row: Row) -> int:
    return int(np.searchsorted(rows.starts, row.index, side="right")) - 1


def convert(row: Row, ctx: F.Context, fmt: str):
    """One row as a Sample: `fmt` is the answer format its folder names ("" where no folder says)."""
    col = {k: ctx.col(k, v) for k, v in conversation.FIELDS.items()}
    talk = col["conversations"]
    question, options = F.strip_markers(conversation.turn(row, talk, "human")), ()
    if fmt not in OPEN_FORMATS:
        question, options = F.split_options(question)
    if fmt == "select" and not options:
        raise row.error(f"field '{talk}[human]': a select row lists no options")
    reply = conversation.turn(row, talk, "gpt")
    pictures, clip = _pictures(row, col, ctx)
    return F.sample(row, sid=row.get(col["id"], f"{NAME}-{row.index}"), question=question, options=options,
                    answer=reply, answer_field=f"{talk}[gpt]", pictures=pictures, clip=clip,
                    category=str(row.get(col["category"], "")),
                    reference=row.get(col["reference"]) if col["reference"] else reply)


def _pictures(row: Row, col: dict, ctx: F.Context) -> tuple[tuple, Video | None]:
    """(views, None) or ((), video), the markers drawn on them."""
    if row.get(col["video"]) is not None:  # a video file, as the LLaVA layout names one
        return (), F.video(row, row.get(col["video"]), col["video"], ctx)
    raw = row.need(col["image"])
    if isinstance(raw, list) and (len(raw) > MAX_VIEWS or (row.get("type") == "nav" and len(raw) > 1)):
        clip = F.video(row, raw, col["image"], ctx)
        return (), dataclasses.replace(clip, frames=tuple(spar_markers.draw(row, list(clip.frames), col["image"])))
    return tuple(spar_markers.draw(row, list(F.media_list(row, raw, col["image"], ctx)), col["image"])), None
