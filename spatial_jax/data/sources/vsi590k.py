"""VSI-590K (HF nyu-visionx/VSI-590K, Cambrian-S): video (and image) spatial QA in the LLaVA conversation layout
(data/sources/conversation.py), {id, video or image, conversations, question_type}; numeric questions (counts,
distances, sizes) have a number as gold, the others an option. The card names the task types and the file; the row
fields are inferred from the LLaVA layout.

Media: the Hub repo ships `vsi_590k.jsonl` beside one archive per source, `<source>.tar.gz` for each of SOURCES (its
file list, as the allenai/Molmo2-ER-VSI-590K mirror shows it), and a row's media path starts with its source's folder
(`scannet/scene0191_00.mp4` is in scannet.tar.gz; inferred from the paths the rows hold and from third-party loaders,
which extract each archive beside the jsonl: `tar -xzf <archive> -C <folder>`); extracted, the paths resolve there
(or under image_dir). A path that is not on
disk is looked for in the archive its first folder names, in that media folder: a `.zip` holding the same path gives
an image (or a video's frame files) as a member, which a zip reads alone; a `.tar.gz`, which reads only from its
start, and a video file in a zip, which the decoder opens as a file, are refused in one line naming the archive and
the command that extracts it; with no archive there, the message names the card's archive to fetch.
Columns: conversations, image, video, id, category (default question_type), reference, image_dir, video_fps."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from spatial_jax.data.sources import conversation
from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import Row, Source, ZipFiles, table

NAME = "vsi590k"
FIELDS = {**conversation.FIELDS, "category": "question_type"}
# the card's archives, one per source, named as the folder its media paths start with
SOURCES = ("adt", "arkitscenes", "hypersim", "procthor", "robotics", "s3dis", "scannet", "scannetppv2", "ytb_roomtour")


def _media(row: Row, col: dict) -> tuple[str, str, list[str]]:
    """(field, what, relative paths) of a row's media."""
    field, what = (col["video"], "video") if row.get(col["video"]) is not None else (col["image"], "image")
    raw = row.get(field)
    paths = [raw] if isinstance(raw, str) else [p for p in raw if isinstance(p, str)] if isinstance(raw, list) else []
    return field, what, [p for p in paths if p and not Path(p).is_absolute()]


def _from_archive(row: Row, ctx: F.Context, zips: dict[Path, ZipFiles]) -> F.Context:
    """The row's context, reading its media from its source's zip where they are not on disk; a one-line refusal
    where they are in an archive that cannot be read member by member, or in none."""
    col = {k: ctx.col(k, v) for k, v in FIELDS.items()}
    field, what, paths = _media(row, col)
    root = ctx.media_root
    missing = next((p for p in paths if not (root / p).is_file()), None)
    if missing is None or "/" not in missing:
        return ctx
    source = missing.split("/")[0]
    tar, zipped = root / f"{source}.tar.gz", root / f"{source}.zip"
    where = f"field '{field}': {what} {root / missing} is not on disk;"
    if zipped.is_file():
        if what == "video" and isinstance(row.get(field), str):
            raise row.error(f"{where} it is in the archive {zipped}, and a video is decoded from a file: extract it "
                            f"with `unzip -n {zipped} -d {root}`")
        if zipped not in zips:
            zips[zipped] = ZipFiles(zipped)
        return dataclasses.replace(ctx, members=zips[zipped])
    if tar.is_file():
        raise row.error(f"{where} it is in the archive {tar}, not extracted: extract it with "
                        f"`tar -xzf {tar} -C {root}`")
    if source in SOURCES:
        raise row.error(f"{where} the card ships the `{source}/` media in {source}.tar.gz, which is not in {root} "
                        f"either: download it there and run `tar -xzf {tar} -C {root}`")
    return ctx


def convert(row: Row, ctx: F.Context, zips: dict[Path, ZipFiles]):
    if ctx.check:
        ctx = _from_archive(row, ctx, zips)
    return conversation.convert(row, ctx, NAME, FIELDS)


def open_source(path: Path, split: str, ctx: F.Context) -> Source:
    rows = table(path, split)
    ctx = ctx.beside(path)
    zips: dict[Path, ZipFiles] = {}  # each source's zip indexed once, when a row first needs it
    return Source(rows, lambda row: convert(row, ctx, zips))
