"""One benchmark question as its published copy gives it, and the readers shared by the loaders.

A loader reads a local copy exactly as the authors distribute it (parquet with embedded images, JSON or JSONL with
image folders, TSV with base64 images, mp4 videos) and yields BenchRecords; a record that lacks a field the loader
needs is a BenchmarkError naming the file, the record (line, row or id) and the field.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from spatial_jax.data.jsonl import text_lines
from spatial_jax.data.sample import DatasetError, not_a_file
from spatial_jax.records import brief

# An image as the copy holds it: a file path, or the encoded bytes of an embedded image (decoded when used).
Media = str | bytes

ANSWER_TYPES = ("choice", "number", "text")


class BenchmarkError(DatasetError):
    """A benchmark copy that cannot be read; the message names the file, the record and the field."""


@dataclasses.dataclass(frozen=True)
class BenchRecord:
    """id: the benchmark's own record id (what --predictions keys on). options: the choices' texts (letters A, B,
    ... in order), empty for open questions. answer: the gold as the official scorer compares it (a letter, a number
    or a text). answer_type: "choice", "number" (MRA) or "text" (SPAR's view-change commands). category: the task
    type the official table reports it under. images: the question's images in order; video: an mp4 path. extra:
    whatever the scorer needs beyond these (3DSRBench's qid, VSI-Bench's question type, ...)."""

    benchmark: str
    id: str
    question: str
    options: tuple[str, ...]
    answer: str | float
    answer_type: str
    category: str
    images: tuple[Media, ...] = ()
    video: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    origin: str = ""

    def __post_init__(self):
        if self.answer_type not in ANSWER_TYPES:
            raise BenchmarkError(f"{self.origin}: answer_type must be one of {ANSWER_TYPES}, got {self.answer_type!r}")


class Where:
    """`file:line` / `file row N` / `file id X` for the messages of one record."""

    def __init__(self, path: Path, what: str):
        self.path, self.what = path, what

    def __str__(self) -> str:
        return f"{self.path} {self.what}"

    def error(self, message: str) -> BenchmarkError:
        return BenchmarkError(f"{self}: {message}")

    def field(self, obj: Any, key: str, kind: type | tuple[type, ...] = object) -> Any:
        """obj[key], which must be present (not None) and of `kind`."""
        if not isinstance(obj, dict):
            raise self.error(f"expected an object, got {type(obj).__name__}")
        if key not in obj or obj[key] is None:
            raise self.error(f"missing field '{key}'")
        value = obj[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise self.error(f"field '{key}' must be {_kind_name(kind)}, got {brief(value)}")
        return value

    def text(self, obj: Any, key: str) -> str:
        return self.field(obj, key, str)

    def strings(self, obj: Any, key: str) -> list[str]:
        """A non-empty list of strings (a record's options: their text is the prompt's and the scorer's)."""
        value = self.field(obj, key, list)
        if not value or not all(isinstance(v, str) for v in value):
            raise self.error(f"field '{key}' must be a non-empty list of strings, got {brief(value)}")
        return value

    def category(self, obj: Any, key: str, names: tuple[str, ...], benchmark: str) -> str:
        """obj[key], which must be one of the protocol's category names: a renamed category would otherwise drop out
        of the weighted scores without a word."""
        value = self.text(obj, key)
        if value not in names:
            raise self.error(f"category {value!r} (field '{key}') is none of {benchmark}'s: {list(names)}")
        return value

    def ident(self, obj: Any, key: str) -> str:
        """An id given as a string or an integer, kept as its string."""
        return str(self.field(obj, key, (str, int)))


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object",
                        bytes: "bytes"}.get(k, k.__name__) for k in kinds)


def find_file(root: Path, names: tuple[str, ...], benchmark: str) -> Path:
    """The first of `names` (globs allowed) under `root`, or a BenchmarkError listing what was looked for."""
    root = Path(root)
    if root.is_file():
        return root
    if not root.is_dir():
        raise BenchmarkError(f"{benchmark}: {root} is neither a folder nor a file")
    for name in names:
        hits = sorted(root.glob(name))
        if hits:
            return hits[0]
    raise BenchmarkError(f"{benchmark}: none of {list(names)} under {root} (see the expected layout in the README)")


def read_json_list(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BenchmarkError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, list):
        raise BenchmarkError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return data


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each non-blank line."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise BenchmarkError(f"{path}: not UTF-8 ({e})") from None
    for number, line in enumerate(text_lines(text), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as e:
            raise BenchmarkError(f"{path}:{number}: not valid JSON ({e.msg})") from None


def read_parquet(path: Path) -> list[dict[str, Any]]:
    """The rows of a parquet file (or a folder of shards) as dicts; embedded images stay {bytes, path} structs."""
    import pyarrow.parquet as pq

    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    rows: list[dict[str, Any]] = []
    for f in files:
        try:
            rows.extend(pq.read_table(f).to_pylist())
        except Exception as e:  # pyarrow raises ArrowInvalid / OSError subclasses for damaged files
            raise BenchmarkError(f"{f}: cannot read the parquet file ({e})") from None
    return rows


def read_tsv(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(row number, row) of a VLMEvalKit TSV (tab-separated, a header row, base64 images in a column)."""
    import csv
    import sys

    csv.field_size_limit(sys.maxsize)  # base64 images run to megabytes per field
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t")
            yield from enumerate(reader, 1)
    except UnicodeDecodeError as e:
        raise BenchmarkError(f"{path}: not UTF-8 ({e})") from None


def embedded_image(value: Any, where: Where, key: str) -> bytes:
    """The encoded bytes of an image a table embeds: a HF {bytes, path} struct, raw bytes, or base64 text."""
    if isinstance(value, dict):
        value = value.get("bytes")
    if isinstance(value, (bytes, bytearray)) and value:
        return bytes(value)
    if isinstance(value, str) and value:
        try:
            return base64.b64decode(value, validate=False)
        except (binascii.Error, ValueError):
            raise where.error(f"field '{key}' is not base64 image data") from None
    raise where.error(f"field '{key}' holds no image data, got {brief(value)}")


def local_file(root: Path, rel: str, where: Where, key: str) -> str:
    """`root/rel`, which must exist (an image or video the record names)."""
    path = (root / rel) if not Path(rel).is_absolute() else Path(rel)
    if not path.is_file():
        raise where.error(f"field '{key}' names {path}, which {not_a_file(path)}")
    return str(path)


def options_from_lines(text: str, where: Where, key: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """('A', 'B', ...) letters and texts of lines written `A. text`."""
    import re

    letters, texts = [], []
    for line in text_lines(text):
        m = re.match(r"\s*\(?([A-Z])[.)]\s*(.*)", line)
        if m:
            letters.append(m.group(1))
            texts.append(m.group(2).strip())
    if not letters:
        raise where.error(f"field '{key}' lists no lettered options, got {brief(text)}")
    return tuple(letters), tuple(texts)


Loader = Callable[[Path], list[BenchRecord]]
