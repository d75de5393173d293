"""SHA-256 digests of files and folders: what a manifest, a checkpoint's checksums and a run's record of its data
compare."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(folder: str | Path, skip: str = "") -> dict[str, str]:
    """SHA-256 of every file under `folder` but those named `skip`, by path relative to it."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file() and p.name != skip}
