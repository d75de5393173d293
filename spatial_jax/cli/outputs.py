"""What the commands share about their outputs: never an input or another output, checked before anything is written,
a folder output that adds files and never replaces one, and a JSON report to a file or to stdout."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from itertools import combinations
from pathlib import Path
from typing import Any

from spatial_jax.config import ConfigError

PathLike = str | os.PathLike


def _identity(path: PathLike) -> tuple[str, tuple[int, int] | None]:
    """(the path with every symlink resolved, its (device, inode) when it exists): equal paths, symlinks to it and
    hard links of it share one of the two."""
    try:
        st = os.stat(path)
        inode = (st.st_dev, st.st_ino)
    except (OSError, ValueError):  # does not exist (yet), or cannot be a path
        inode = None
    return os.path.realpath(path), inode


def same_file(a: PathLike, b: PathLike) -> bool:
    """Whether `a` and `b` name one file or folder: by path, through a symlink or as hard links of one file."""
    (path_a, inode_a), (path_b, inode_b) = _identity(a), _identity(b)
    return path_a == path_b or (inode_a is not None and inode_a == inode_b)


def _input_entries(inputs: Iterable[PathLike | None]) -> Iterable[Path]:
    """Each input, and every file inside an input folder (a benchmark copy, a run directory)."""
    for given in inputs:
        if not given:
            continue
        yield Path(given)
        if os.path.isdir(given):
            for folder, _, names in os.walk(given):
                yield from (Path(folder) / name for name in names)


def refuse_overwriting(outputs: Mapping[str, PathLike | None], inputs: Iterable[PathLike | None]) -> None:
    """ConfigError (rc 2), before anything is written, when an output (flag -> path; None when not given) names an
    input, a file inside an input folder or another output: by path, through a symlink or as a hard link."""
    given = {flag: path for flag, path in outputs.items() if path}
    paths, inodes = {}, {}
    for entry in _input_entries(inputs):
        path, inode = _identity(entry)
        paths.setdefault(path, entry)
        if inode is not None:
            inodes.setdefault(inode, entry)
    for flag, out in given.items():
        path, inode = _identity(out)
        hit = paths.get(path) or (inodes.get(inode) if inode is not None else None)
        if hit is not None:
            raise ConfigError(f"{flag} {out} would overwrite its input {hit}")
    for (flag_a, a), (flag_b, b) in combinations(given.items(), 2):
        if same_file(a, b):
            raise ConfigError(f"{flag_a} {a} and {flag_b} {b} name the same file: one would overwrite the other")


def refuse_inside(outputs: Mapping[str, PathLike | None], folders: Mapping[str, PathLike | None]) -> None:
    """ConfigError (rc 2), before anything is written, for an output (flag -> path) at or below one of `folders`
    (what -> folder the command reads, such as a run directory): files written there would sit among what the folder
    holds (a run's checkpoints, which the next run would take for its own or move away as damaged)."""
    for what, folder in folders.items():
        if not folder:
            continue
        root = os.path.realpath(folder)
        for flag, out in outputs.items():
            path = os.path.realpath(out) if out else ""
            if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
                raise ConfigError(f"{flag} {out} lies inside {what} {folder}, which this command reads: name a "
                                  "folder outside it")


def check_writable_file(flag: str, path: PathLike) -> None:
    """ConfigError (rc 2), before the work, unless the file `path` can be written whole: its folder exists and takes
    new files (reports are written through a temp file renamed over them)."""
    import tempfile

    folder = Path(os.path.abspath(path)).parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {folder} does not exist")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write in {folder} ({e.strerror or e})") from None


def check_output_files(outputs: Mapping[str, PathLike | None], inputs: Iterable[PathLike | None]) -> None:
    """refuse_overwriting, and a ConfigError for an output file flag naming a folder: found now, not once the work
    is done and the file is opened."""
    refuse_overwriting(outputs, inputs)
    for flag, path in outputs.items():
        if path and os.path.isdir(path):
            raise ConfigError(f"{flag} {path} is a folder: name the file to write")


def print_report(report: dict[str, Any], path: str | None, summary: str) -> None:
    """The JSON report to `path` (and a one-line summary to stdout), or the report itself to stdout."""
    text = json.dumps(report, indent=1)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        print(f"{summary} (report: {path})")
    else:
        print(text)


def check_room(folder: PathLike, need: int, what: str) -> None:
    """ConfigError (rc 2), before anything is written, when the file system holding `folder` (or its nearest
    existing parent) has less than `need` bytes free: a count too large for the disk is refused at once instead of
    filling it for hours."""
    where = Path(os.path.abspath(folder))
    while not where.exists() and where != where.parent:
        where = where.parent
    free = os.statvfs(where).f_bavail * os.statvfs(where).f_frsize
    if need > free:
        raise ConfigError(f"{what} needs up to {need / 2**30:.3g} GiB, and {where} has {free / 2**30:.3g} GiB free")


def check_folder(out: PathLike, flag: str) -> None:
    """ConfigError unless `out` can be a folder output: not empty (the working directory), not a file."""
    if not str(out).strip():
        raise ConfigError(f"{flag} is empty: name the folder to write")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"{flag} {out} is a file, not a folder")


@contextlib.contextmanager
def new_files(out: PathLike, flag: str) -> Iterator[Path]:
    """The one rule of a folder output (to-cvbench, export, gen-data, pretrain): yields a staging folder beside `out`
    to write everything in; once the body has finished, its files move into `out` only if none of their names is taken
    there, else a ConfigError names the first taken one. Never replaces a file the command did not write, and a
    refusal or an error partway leaves nothing behind: not the staged files, not a file moved in, not a folder it
    made. An empty path is refused (it would be the working directory). A process that writes nothing (a multi-host
    job's other processes) never creates the staging folder, and nothing moves for it."""
    check_folder(out, flag)
    out = Path(out)
    stage = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        yield stage
        if stage.is_dir():
            _move_in(stage, out, flag)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _move_in(stage: Path, out: Path, flag: str) -> None:
    """Hard-links every file of `stage` into `out` (a link never replaces an existing name), undoing all on a clash."""
    files = sorted(p.relative_to(stage) for p in stage.rglob("*") if not p.is_dir())
    taken = next((rel for rel in files if os.path.lexists(out / rel)), None)
    if taken is not None:
        raise ConfigError(f"{flag} {out} already holds {taken}, which this command did not write: name a new or "
                          "empty folder")
    made, linked = [], []
    try:
        for rel in files:
            for folder in reversed((out / rel).parents):
                if not folder.exists():
                    folder.mkdir()
                    made.append(folder)
            os.link(stage / rel, out / rel)  # FileExistsError when the name appeared meanwhile: nothing replaced
            linked.append(out / rel)
    except BaseException as e:
        for path in linked:
            path.unlink(missing_ok=True)
        for folder in reversed(made):
            folder.rmdir()
        if isinstance(e, FileExistsError):
            raise ConfigError(f"{flag} {out} already holds {rel}, which this command did not write: name a new or "
                              "empty folder") from None
        raise
