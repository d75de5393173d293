"""What every benchmark script checks before its first heavy step, beside the commands' output rules (outputs.py):
its counts lie within bounds, and its output file is none of its inputs and either new or the script's own earlier
output, which it marks (`"written_by"` in a JSON object, a first comment line in Markdown) so that a rerun may replace
it and nothing else is ever replaced. A script's output folder, which it writes and clears runs in, is new, empty or
marked as its own the same way (a `.written_by` file inside)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from spatial_jax.cli.outputs import PathLike, check_folder, check_output_files
from spatial_jax.config import ConfigError

MARK = "written_by"
FOLDER_MARK = f".{MARK}"


def check_counts(counts: Mapping[str, tuple[int | float | Iterable[int | float], int | float, int | float]]) -> None:
    """ConfigError naming the first flag whose value (or any of its values) lies outside [least, most]: a count
    beyond any real run (a size that would fill the memory for hours) is refused before the work starts."""
    for flag, (given, least, most) in counts.items():
        for value in given if isinstance(given, (list, tuple)) else [given]:
            if not least <= value <= most:
                raise ConfigError(f"{flag} must lie in [{least}, {most}], got {value}")


def _written_by(path: Path, owner: str) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError:
            return False
        return isinstance(data, dict) and data.get(MARK) == owner
    return text.startswith(_comment(owner))


def _comment(owner: str) -> str:
    return f"<!-- {MARK} {owner} -->\n"


def check_own_output(path: PathLike, flag: str, owner: str, inputs: Iterable[PathLike | None] = ()) -> Path:
    """`path` as a Path, or a ConfigError (rc 2) unless it can take `owner`'s output: named, not a folder, none of
    `inputs` (nor a file inside an input folder), and new or written by `owner` before (write_own's mark)."""
    if not str(path).strip():
        raise ConfigError(f"{flag} is empty: name the file to write")
    check_output_files({flag: path}, inputs)
    path = Path(path)
    if os.path.lexists(path) and not _written_by(path, owner):
        raise ConfigError(f"{flag} {path} exists and was not written by {owner}: name a new file")
    return path


def write_own(path: PathLike, content: dict | str, owner: str, flag: str = "--out") -> None:
    """Writes `owner`'s output (a JSON object, or Markdown text) to `path`, marked as its own: written beside and
    renamed in, so a kill never leaves half a file, and refused (ConfigError) when what is there now is not its own."""
    path = check_own_output(path, flag, owner)
    text = json.dumps({MARK: owner, **content}, indent=1) if isinstance(content, dict) else _comment(owner) + content
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        part.write_text(text.rstrip("\n") + "\n", encoding="utf-8")
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)


def claim_folder(out: PathLike, flag: str, owner: str) -> Path:
    """`out`, made `owner`'s folder (created with its mark when new or empty), or a ConfigError (rc 2) when it is a
    file, empty, or holds files while not marked as `owner`'s: a rerun may add to and replace in its own earlier
    folder, and never in a folder someone else filled."""
    check_folder(out, flag)
    out = Path(out)
    mark = out / FOLDER_MARK
    if out.is_dir() and any(out.iterdir()):
        try:
            ours = mark.read_text(encoding="utf-8").strip() == owner
        except (OSError, UnicodeDecodeError):
            ours = False
        if not ours:
            raise ConfigError(f"{flag} {out} holds files that {owner} did not write: name a new or empty folder")
        return out
    out.mkdir(parents=True, exist_ok=True)
    mark.write_text(owner + "\n", encoding="utf-8")
    return out
