"""What the layouts share: the column names a config may rename, and a row's question, options, gold answer and
pictures turned into a Sample's fields, each failure one line naming file, row and field."""

from __future__ import annotations

import dataclasses
import io
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from spatial_jax.data.sample import LETTERS, MAX_TEXT_ANSWER, DatasetError, Sample, Video, not_a_file
from spatial_jax.data.sources.rows import Row, ZipFiles
from spatial_jax.records import brief

# The method prompt formats' reference keys (data/prompts.py): a layout's own completion is each one's SFT target.
REFERENCE_KEYS = ("spatialcore", "prosr", "spatialthinker", "allospatial")
# Settings a `data.columns` entry may give besides column names.
SETTINGS = ("image_dir", "video_fps")


@dataclasses.dataclass(frozen=True)
class Context:
    """A reader's settings: `columns` renames a layout's logical fields (`question=question_with_options`),
    `base` is the folder relative media paths resolve against (`image_dir` overrides it), `check` whether files must
    exist when a row is read, `members` an archive the media are read from."""

    columns: Mapping[str, str] = dataclasses.field(default_factory=dict)
    base: Path = Path(".")
    check: bool = True
    members: ZipFiles | None = None
    prefix: str = ""  # the members' folder inside the archive

    def col(self, field: str, default: str) -> str:
        return self.columns.get(field, default)

    @property
    def media_root(self) -> Path:
        return Path(self.columns["image_dir"]) if "image_dir" in self.columns else self.base

    def beside(self, path: Path) -> Context:
        """These settings with relative media resolved in the copy's own folder: PATH, or the folder of the file
        PATH names (verl's and EasyR1's RLHFDataset join them to image_dir, which the copy's folder stands for)."""
        path = Path(path)
        return dataclasses.replace(self, base=path if path.is_dir() else path.parent)


def parse_columns(entries) -> dict[str, str]:
    """`("question=problem", "image_dir=/data/img")` -> a dict; DatasetError for an entry that is no `key=value`."""
    out = {}
    for entry in entries:
        key, sep, value = str(entry).partition("=")
        if not sep or not key.strip() or not value.strip():
            raise DatasetError(f"data.columns entry {entry!r} must read field=column")
        out[key.strip()] = value.strip()
    return out


def strip_markers(text: str) -> str:
    """The question without `<image>` / `<video>` markers (the pipeline places the pictures itself)."""
    return re.sub(r"[ \t]*<(image|video)>[ \t]*\n?", "", text).strip()


_OPTION_LINE = re.compile(r"^\s*\(?([A-Z])[.):]\s+(.*\S)\s*$")
_INLINE = re.compile(r"(?:^|\s)\(?([A-H])[.)]\s")


def split_options(text: str) -> tuple[str, tuple[str, ...]]:
    """(question, option texts) of a question that lists its options: one `A. text` per line, or inline
    `... A. x B. y`, lettered from A in order; (text, ()) when it lists none. An `Options:` line before them goes."""
    lines = text.split("\n")
    k = 0
    while k < len(lines) and not (_OPTION_LINE.match(lines[k]) and _OPTION_LINE.match(lines[k]).group(1) == "A"):
        k += 1
    options = []
    for line in lines[k:]:
        m = _OPTION_LINE.match(line)
        if not m or m.group(1) != LETTERS[len(options)]:
            break
        options.append(m.group(2))
    if len(options) >= 2:
        return _stem("\n".join(lines[:k])), tuple(options)
    marks = list(_INLINE.finditer(text))
    letters = [m.group(1) for m in marks]
    if letters[:2] == ["A", "B"]:
        n = next((i for i, c in enumerate(letters) if c != LETTERS[i]), len(letters))
        cut = [m.start() if m.start() == 0 else m.start() + 1 for m in marks[:n]] + [len(text)]
        texts = [text[a:b].strip() for a, b in zip(cut, cut[1:])]
        return _stem(text[: cut[0]]), tuple(re.sub(r"^\(?[A-H][.)]\s*", "", t).strip() for t in texts)
    return text.strip(), ()


def _stem(text: str) -> str:
    return re.sub(r"\s*(Options|Choices)\s*:\s*$", "", text.strip(), flags=re.IGNORECASE).strip()


def option_texts(row: Row, raw: Any, field: str) -> tuple[str, ...]:
    """A list of options as the copy writes them (`"A. left"` or `"left"`), as texts."""
    if not isinstance(raw, (list, tuple)) or not all(isinstance(o, str) for o in raw):
        raise row.error(f"field '{field}' must be a list of option texts, got {brief(raw)}")
    return tuple(re.sub(r"^\s*\(?[A-Z][.):]\s+", "", o).strip() for o in raw)


_LETTER_FORM = re.compile(r"\(?([A-Z])\)?(?:[.):]?\s+(.*?))?\.?", re.S)


def gold(row: Row, raw: Any, options: tuple[str, ...], field: str) -> tuple[str | float, str]:
    """(answer, answer_type) as the rewards read it. With options, an option letter: the option whose text the gold
    is (numbers compare as numbers), else the letter the gold writes (`B`, `(B)`, `B. text`, whose text must then be
    option B's); an integer is never read as an index here (a layout whose golds are indices turns them into
    letters first, as omnispatial_train.py does).
    Without options, a number ("number", scored by MRA) or else a short text ("text", SPEC section 10). A gold
    naming no option, a letter whose text is another option's, or a text that several options share is an error
    naming the field."""
    if isinstance(raw, str):
        m = re.search(r"<answer>(.*?)</answer>", raw, re.S)
        raw = (m.group(1) if m else raw).strip()
    if options:
        return _option_gold(row, raw, options, field), "choice"
    number = _number(raw)
    if number is None:
        if not isinstance(raw, str) or not raw:
            raise row.error(f"field '{field}' = {brief(raw)} is no answer (an option, a number or a short text)")
        if len(raw) > MAX_TEXT_ANSWER:
            raise row.error(f"field '{field}' = {brief(raw)} is a text of {len(raw)} characters; a text gold is a "
                            f"short answer of at most {MAX_TEXT_ANSWER} (SPEC section 10); no reward scores free text")
        return raw, "text"
    if not math.isfinite(number) or number == 0:
        raise row.error(f"field '{field}' = {brief(raw)}: a numeric gold must be finite and non-zero (MRA divides "
                        "by it)")
    return number, "number"


def _same_text(a: str, b: str) -> bool:
    """Two answers written the same (case, whitespace, a closing full stop aside), numbers by value."""
    na, nb = _number(a), _number(b)
    if na is not None and nb is not None:
        return na == nb
    return " ".join(a.lower().split()).rstrip(".") == " ".join(b.lower().split()).rstrip(".")


def _option_gold(row: Row, raw: Any, options: tuple[str, ...], field: str) -> str:
    where = f"field '{field}' = {brief(raw)}"
    if isinstance(raw, (int, float, str)) and not isinstance(raw, bool):
        hits = [k for k, o in enumerate(options) if _same_text(str(raw), o)]
        if len(hits) == 1:
            return LETTERS[hits[0]]
        if len(hits) > 1:
            raise row.error(f"{where} is the text of options {', '.join(LETTERS[k] for k in hits)}, which read the "
                            "same; the gold cannot say which")
    if isinstance(raw, str):
        m = _LETTER_FORM.fullmatch(raw)
        if m and m.group(1) in LETTERS[: len(options)]:
            k = LETTERS.index(m.group(1))
            if m.group(2) and not _same_text(m.group(2), options[k]):
                raise row.error(f"{where} names option {m.group(1)}, which reads {brief(options[k])}")
            return m.group(1)
    raise row.error(f"{where} is none of the {len(options)} options {brief(list(options))}")


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw.strip())
        except ValueError:
            return None
    return None


def media(row: Row, value: Any, field: str, ctx: Context, what: str = "image") -> str | np.ndarray:
    """One picture as the copy holds it: embedded bytes (a Hub `{bytes, path}` struct or raw bytes), decoded now; a
    path, resolved against the media root (or read from the archive) and checked to exist."""
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return decode(row, bytes(value), field, what)
    if not isinstance(value, str) or not value:
        raise row.error(f"field '{field}' holds no {what} (bytes or a path), got {brief(value)}")
    if ctx.members is not None and ".." not in Path(value).parts:
        name = ctx.prefix + value.lstrip("/")
        try:
            return decode(row, ctx.members.read(name), field, what)
        except KeyError:
            raise row.error(f"field '{field}': {ctx.members.path} has no member {name}") from None
    if not Path(value).is_absolute() and ".." in Path(value).parts:
        # a relative path is the copy's own file; one climbing out of the media folder reads another's
        raise row.error(f"field '{field}': {what} path {value!r} leaves the folder it is relative to "
                        f"({ctx.media_root}); give an absolute path or data.columns image_dir")
    path = Path(value) if Path(value).is_absolute() else ctx.media_root / value
    if ctx.check and not path.is_file():
        raise row.error(f"field '{field}': {what} {path} {not_a_file(path)}")
    return str(path)


def decode(row: Row, data: bytes, field: str, what: str = "image") -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise row.error(f"field '{field}': the embedded {what} cannot be decoded ({e})") from None


def media_list(row: Row, raw: Any, field: str, ctx: Context) -> tuple:
    """One picture or a list of them."""
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    if not items:
        raise row.error(f"field '{field}' lists no image")
    return tuple(media(row, v, f"{field}[{k}]" if isinstance(raw, (list, tuple)) else field, ctx)
                 for k, v in enumerate(items))


def video(row: Row, raw: Any, field: str, ctx: Context) -> Video:
    """A video file, or a list of frame files (taken at data.columns video_fps, default 2 a second: EasyR1's and
    Qwen-VL's sampling rate)."""
    if isinstance(raw, (list, tuple)) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    if isinstance(raw, str):
        return Video(path=media(row, raw, field, ctx, "video"))
    if isinstance(raw, (list, tuple)) and raw:
        frames = tuple(media(row, f, f"{field}[{k}]", ctx, "video frame") for k, f in enumerate(raw))
        fps = ctx.columns.get("video_fps", 2.0)
        try:
            return Video(frames=frames, fps=float(fps))
        except ValueError:  # float's, or Video's own check of a rate that is not positive (a DatasetError)
            raise row.error(f"field '{field}' lists frames, and data.columns video_fps = {fps!r} is no positive "
                            "number of frames a second") from None
    raise row.error(f"field '{field}' must be a video file or a list of frame files, got {brief(raw)}")


def sample(row: Row, *, sid: Any, question: str, options: tuple[str, ...], answer: Any, answer_field: str,
           pictures: tuple = (), clip: Video | None = None, category: str = "", reference: str | None = None,
           meta: dict | None = None) -> Sample:
    """The Sample of one row; its origin names the row for every later message."""
    letter, kind = gold(row, answer, options, answer_field)
    try:
        return Sample(
            id=str(sid), image=pictures[0] if len(pictures) == 1 else None, question=question,
            options=options if kind == "choice" else (), answer=letter, answer_type=kind, category=category,
            reference={k: reference for k in REFERENCE_KEYS} if reference else {}, meta=meta or {},
            origin=row.where, images=pictures if len(pictures) > 1 else (), video=clip)
    except DatasetError as e:
        raise row.error(str(e)) from None
