"""JSONL datasets: one Sample per line; every bad line is a DatasetError that names `path:line`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from spatial_jax.data.sample import DatasetError, Sample


def read_jsonl(path: str | Path, check_images: bool = True) -> list[Sample]:
    """All samples of a JSONL file; blank lines are skipped, image paths resolve against the file's folder."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(f"{path}: dataset file does not exist") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e})") from None
    samples = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{lineno}: malformed JSON: {e.msg} (column {e.colno})") from None
        try:
            sample = Sample.from_json(obj, base_dir=path.parent, check_image=check_images)
        except DatasetError as e:
            raise DatasetError(f"{path}:{lineno}: {e}") from None
        if sample.id in seen:
            raise DatasetError(f"{path}:{lineno}: id {sample.id!r} already used on line {seen[sample.id]}")
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
            if not isinstance(s.image, str):
                from PIL import Image

                image_dir.mkdir(parents=True, exist_ok=True)
                file = image_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", s.id) + ".png")
                Image.fromarray(s.image).save(file)
                image_path = _relative(file, path.parent)
            f.write(json.dumps(s.to_json(image_path), ensure_ascii=False) + "\n")
            n += 1
    return n


def _relative(file: Path, base: Path) -> str:
    try:
        return str(file.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(file.resolve())
