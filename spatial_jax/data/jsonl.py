"""JSONL datasets: one Sample per line; every bad line is a DatasetError that names `path:line`."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from spatial_jax.data.sample import DatasetError, Sample, regular_file
from spatial_jax.records import brief


class MalformedJSON(ValueError):
    """A line that is no JSON value, Python's parser limits included."""


def parse_line(line: str) -> Any:
    """One line's JSON value. Besides syntax errors, json.loads refuses nesting deeper than the recursion limit
    (RecursionError) and integers over sys.get_int_max_str_digits() digits (ValueError); all are MalformedJSON."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise MalformedJSON(f"malformed JSON: {e.msg} (column {e.colno})") from None
    except RecursionError:
        raise MalformedJSON("malformed JSON: nested too deeply") from None
    except ValueError as e:
        # The message's second half advises sys.set_int_max_str_digits(), which is no advice to a data author.
        raise MalformedJSON(f"malformed JSON: {str(e).split(';')[0]}") from None


class DuplicateKey(ValueError):
    """A JSON object giving one key twice (json.loads would keep the last silently)."""

    def __init__(self, key: str):
        super().__init__(f"key {key!r} is given twice in one object")
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def loads_unique(text: str) -> Any:
    """json.loads, refusing (DuplicateKey) an object that gives one key twice."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def read_jsonl(path: str | Path, check_images: bool = True) -> list[Sample]:
    """All samples of a JSONL file; blank lines are skipped, image paths resolve against the file's folder, a UTF-8
    byte-order mark is allowed."""
    path = regular_file(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the dataset file: {e.strerror or e}") from None
    # Undecodable bytes become lone surrogates here (JSON escapes cannot put those in the text), so the first bad
    # line is reported in order with the others.
    text = data.decode("utf-8-sig", errors="surrogateescape")
    samples = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text_lines(text), start=1):
        if not line.strip():
            continue
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as e:
            raise DatasetError(f"{path}:{lineno}: not UTF-8 text (byte 0x{ord(line[e.start]) - 0xDC00:02x} at "
                               f"column {e.start + 1})") from None
        try:
            obj = parse_line(line)
            sample = Sample.from_json(obj, base_dir=path.parent, check_image=check_images, origin=f"{path}:{lineno}")
        except (MalformedJSON, DatasetError) as e:
            raise DatasetError(f"{path}:{lineno}: {e}") from None
        if sample.id in seen:
            raise DatasetError(f"{path}:{lineno}: id {brief(sample.id)} already used on line {seen[sample.id]}")
        seen[sample.id] = lineno
        samples.append(sample)
    return samples


def write_jsonl(samples: Iterable[Sample], path: str | Path, image_dir: str | Path | None = None) -> int:
    """Writes samples to `path`; in-memory images are saved as PNG under `image_dir` (relative paths in the rows).

    Returns the number of rows written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image_dir = Path(image_dir) if image_dir is not None else path.parent / "images"
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for s in samples:
            image_path = None
            if s.image is not None and not isinstance(s.image, str):  # several images / a video: paths only
                from PIL import Image

                image_dir.mkdir(parents=True, exist_ok=True)
                file = image_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", s.id) + ".png")
                Image.fromarray(s.image).save(file)
                image_path = _relative(file, path.parent)
            f.write(json.dumps(s.to_json(image_path), ensure_ascii=False) + "\n")
            n += 1
    return n


def text_lines(text: str) -> io.StringIO:
    """Lines (each with its line break) as open() reads them (\\n, \\r\\n or \\r); str.splitlines would also split at
    U+2028 and others, which JSON leaves raw inside strings, and would number lines unlike any editor."""
    return io.StringIO(text, newline=None)


def _relative(file: Path, base: Path) -> str:
    try:
        return str(file.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(file.resolve())
