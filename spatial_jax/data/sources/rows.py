"""Row tables read lazily: a published copy's rows by index, each fetched only when asked for, so a source of any
size holds only its index in memory (and one or two parquet row groups). Every row is named by file and line or row
in the messages about it (`Row`).

Parquet: the files' row-group sizes come from their footers; a row reads its row group (the last two are cached, so
a pass in file order reads each group once). JSON lines: one pass over the file in 1 MiB chunks records where each
non-blank line starts (8 bytes a row, 16 with its line number); a row is one positional read (os.pread, safe from
grain's reading threads). Arrow (`datasets`'
save_to_disk files): memory-mapped, a row is a one-row slice. A JSON list is parsed whole (it cannot be split without
parsing it); archives are read member by member (`ZipFiles`).
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spatial_jax.data.jsonl import MalformedJSON, parse_line
from spatial_jax.data.sample import DatasetError, Sample, regular_file
from spatial_jax.records import brief

_WHITESPACE = np.array([9, 10, 13, 32], np.uint8)
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a copy: its parsed fields and where it sits (`file:line` or `file row N`)."""

    data: Any
    where: str
    index: int = 0  # the row's place in its source

    def error(self, what: str) -> DatasetError:
        return DatasetError(f"{self.where}: {what}")

    def get(self, path: str, default: Any = None) -> Any:
        """The field at a dotted path (`reward_model.ground_truth`); default when any step is missing or null."""
        value = self.data
        if not path:
            return default
        for key in path.split("."):
            if not isinstance(value, dict) or value.get(key) is None:
                return default
            value = value[key]
        return value

    def need(self, path: str, kind: type | tuple[type, ...] = object) -> Any:
        """The field at `path`, which must be present and of `kind`: else one line naming file, row and field."""
        if not isinstance(self.data, dict):
            raise self.error(f"expected an object, got {type(self.data).__name__}")
        value = self.get(path)
        if value is None:
            raise self.error(f"missing field '{path}'")
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.error(f"field '{path}' must be {_kind(kind)}, got {brief(value)}")
        return value


def _kind(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


class Rows(Sequence[Row]):
    """A table of rows by index; `files` are what it reads (the output guards compare them with outputs)."""

    files: tuple[str, ...] = ()


class ListRows(Rows):
    """Rows already in memory (a JSON list), each named `file record N` (0-based, as the list indexes them)."""

    def __init__(self, items: list, path: Path, what: str = "record"):
        self.items, self.path, self.what, self.files = items, path, what, (str(path),)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return Row(self.items[i], f"{self.path} {self.what} {i % len(self)}", i % len(self))


class ParquetRows(Rows):
    """The rows of parquet files in order, a row group read when one of its rows is asked for."""

    def __init__(self, files: Sequence[Path]):
        import pyarrow.parquet as pq

        self.files = tuple(str(f) for f in files)
        groups = []  # (file index, row group, rows)
        for k, f in enumerate(self.files):
            try:
                meta = pq.ParquetFile(f).metadata
            except Exception as e:  # pyarrow raises ArrowInvalid / OSError subclasses for a damaged footer
                raise DatasetError(f"{f}: cannot read the parquet file ({e})") from None
            groups += [(k, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
        self.groups = np.asarray([g[:2] for g in groups], np.int64).reshape(-1, 2)
        self.starts = np.concatenate([[0], np.cumsum([g[2] for g in groups], dtype=np.int64)])
        self._file_starts = {}
        for (k, _), start in zip(self.groups, self.starts):
            self._file_starts.setdefault(int(k), int(start))
        self._cache: OrderedDict = OrderedDict()
        self._handles: dict = {}
        self._lock = threading.Lock()  # grain's reading threads share the cache

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getstate__(self):  # open file handles stay behind (a worker process opens its own)
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_handles", "_lock")}

    def __setstate__(self, state):
        self.__dict__.update(state, _cache=OrderedDict(), _handles={}, _lock=threading.Lock())

    def _group(self, g: int):
        import pyarrow.parquet as pq

        with self._lock:
            if g in self._cache:
                return self._cache[g]
            k, rg = (int(x) for x in self.groups[g])
            try:
                handle = self._handles.setdefault(k, pq.ParquetFile(self.files[k]))
                group = handle.read_row_group(rg)
            except Exception as e:
                raise DatasetError(f"{self.files[k]}: cannot read row group {rg} ({e})") from None
            self._cache[g] = group
            while len(self._cache) > 2:
                self._cache.popitem(last=False)
            return group

    def __getitem__(self, i):
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        g = int(np.searchsorted(self.starts, i, side="right")) - 1
        row = self._group(g).slice(i - int(self.starts[g]), 1).to_pylist()[0]
        k = int(self.groups[g][0])
        return Row(row, f"{self.files[k]} row {i - self._file_starts[k]}", i)


class ArrowRows(Rows):
    """`datasets`' Arrow files (IPC streams, as save_to_disk writes them), memory-mapped."""

    def __init__(self, files: Sequence[Path]):
        self.files = tuple(str(f) for f in files)
        self._tables = [None] * len(self.files)
        self.starts = [0]
        for f in self.files:
            self.starts.append(self.starts[-1] + self._open(f).num_rows)

    @staticmethod
    def _open(f: str):
        import pyarrow as pa

        try:
            source = pa.memory_map(f)
            try:
                return pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                return pa.ipc.open_file(source).read_all()
        except Exception as e:
            raise DatasetError(f"{f}: cannot read the Arrow file ({e})") from None

    def __getstate__(self):
        return {**self.__dict__, "_tables": [None] * len(self.files)}

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i):
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        j = i - self.starts[k]
        if self._tables[k] is None:  # memory-mapped: a second mapping by a racing thread costs nothing
            self._tables[k] = self._open(self.files[k])
        return Row(self._tables[k].slice(j, 1).to_pylist()[0], f"{self.files[k]} row {j}", i)


class JsonLines(Rows):
    """A JSON-lines file: the start offset and line number of each non-blank line, found in one chunked pass."""

    def __init__(self, path: Path):
        self.path, self.files = Path(path), (str(path),)
        starts, lines = [], []
        offset, line_start, line_no, seen_at_start, seen = 0, 0, 1, 0, 0
        try:
            with open(self.path, "rb") as f:
                for chunk in iter(lambda: f.read(_CHUNK), b""):
                    a = np.frombuffer(chunk, np.uint8)
                    # non-blank bytes counted within the chunk (int32: a chunk is 1 MiB); a line holds data when the
                    # count at its break exceeds the count at its start
                    filled = np.cumsum(~np.isin(a, _WHITESPACE), dtype=np.int32)
                    breaks = np.flatnonzero(a == 10)
                    if len(breaks):
                        at_break = filled[breaks].astype(np.int64)
                        first = np.concatenate([[seen_at_start - seen], at_break[:-1]])
                        begin = np.concatenate([[line_start], offset + breaks[:-1] + 1])
                        keep = at_break > first
                        starts.append(begin[keep])
                        lines.append(line_no + np.flatnonzero(keep))
                        line_no += len(breaks)
                        line_start, seen_at_start = offset + int(breaks[-1]) + 1, seen + int(at_break[-1])
                    seen += int(filled[-1])
                    offset += len(a)
        except FileNotFoundError:
            raise DatasetError(f"{self.path}: dataset file does not exist") from None
        except OSError as e:
            raise DatasetError(f"{self.path}: cannot read the dataset file: {e.strerror or e}") from None
        if seen > seen_at_start:  # a last line without its line break
            starts.append(np.asarray([line_start]))
            lines.append(np.asarray([line_no]))
        self.starts = np.concatenate(starts).astype(np.int64) if starts else np.zeros(0, np.int64)
        self.lines = np.concatenate(lines).astype(np.int64) if lines else np.zeros(0, np.int64)
        self.size = offset
        self._fd = None

    def __getstate__(self):
        return {**self.__dict__, "_fd": None}

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i):
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        start = int(self.starts[i])
        end = int(self.starts[i + 1]) if i + 1 < len(self) else self.size  # blank lines between are whitespace
        return line_row(os.pread(self._fd, end - start, start), f"{self.path}:{int(self.lines[i])}", i)


def line_row(raw: bytes, where: str, i: int) -> Row:
    """One JSON line's Row (a leading byte-order mark dropped); not UTF-8 or not JSON is one line naming `where`."""
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return Row(parse_line(raw.decode("utf-8")), where, i)
    except UnicodeDecodeError as e:
        raise DatasetError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
    except MalformedJSON as e:
        raise DatasetError(f"{where}: {e}") from None


def json_list(path: Path) -> ListRows:
    """A file holding one JSON list of records."""
    try:
        data = parse_line(Path(path).read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot read the dataset file ({e})") from None
    except MalformedJSON as e:
        raise DatasetError(f"{path}: {e}") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    return ListRows(data, Path(path))


_SPLIT_PATTERNS = ("data/{}-*.parquet", "{}-*.parquet", "{}.parquet", "{}.jsonl", "{}.json", "{}/*.parquet")
# the split names a Hub folder's files or subfolders are named by (`data/train-00000-of-00001.parquet`, `val.jsonl`)
_SPLIT_NAME = re.compile(r"(train|training|val|valid|validation|dev|test|eval|evaluation)(?:-\d+-of-\d+)?")


def splits_in(folder: Path) -> list[str]:
    """The split names a folder's row files (or its `data/` folder's, or its subfolders of parquet) are named by."""
    found = set()
    for f in [*folder.glob("*"), *folder.glob("data/*.parquet")]:
        m = _SPLIT_NAME.fullmatch(f.name.split(".")[0]) if f.is_file() and f.suffix in (".parquet", ".jsonl", ".json") \
            else _SPLIT_NAME.fullmatch(f.name) if f.is_dir() and any(f.glob("*.parquet")) else None
        if m:
            found.add(m.group(1))
    return sorted(found)


def table(path: Path, split: str = "", default: str = "") -> Rows:
    """A file or folder of rows by its kind: parquet (a file, or a folder's `*.parquet`, `data/<split>-*.parquet`
    as the Hub lays splits out), `.jsonl`, `.json` (a list, or JSON lines), `.arrow`. A folder's rows are those of
    `split` (else `default`) where its files are named by splits; a split the folder does not have is refused naming
    the ones it has (never every file's rows), and so is a folder whose unnamed rows are both parquet and JSON lines
    (one kind would be ignored)."""
    path = Path(path)
    if not path.is_dir():
        return table_of([path])
    wanted = split or default
    for pattern in _SPLIT_PATTERNS if wanted else ():
        hits = sorted(path.glob(pattern.format(wanted)))
        if hits:
            return table_of(hits)
    named = splits_in(path)
    if split or named:
        raise DatasetError(f"{path}: no split {wanted!r}; the copy's files name "
                           + (f"the splits {named}: give one as FORMAT:PATH:<split>" if named
                              else "no split: give the folder without one, or a file"))
    for pattern in ("data/*.parquet", "*.parquet", "*.jsonl"):
        hits = sorted(path.glob(pattern))
        if hits:
            others = sorted(path.glob("*.jsonl" if pattern.endswith("parquet") else "*.parquet"))
            if others:
                raise DatasetError(f"{path}: holds both parquet ({hits[0].name}, ...) and JSON-lines "
                                   f"({others[0].name}, ...) files, and one kind would be ignored: name the file")
            return table_of(hits)
    raise DatasetError(f"{path}: no parquet or JSON-lines files")


def table_of(files: Sequence[Path]) -> Rows:
    for f in files:
        regular_file(f)
    suffix = Path(files[0]).suffix
    if suffix == ".parquet":
        return ParquetRows(files)
    if suffix == ".arrow":
        return ArrowRows(files)
    if len(files) != 1:
        return Concat([table_of([f]) for f in files])
    if suffix == ".json":
        # a list or JSON lines, told by the first byte past the byte-order mark and however much white space
        with open(files[0], "rb") as f:
            head = f.read(65536).removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
            while not head and (block := f.read(65536)):
                head = block.lstrip(b" \t\r\n")
        return json_list(files[0]) if head.startswith(b"[") else JsonLines(files[0])
    return JsonLines(files[0])


class Concat(Rows):
    def __init__(self, parts: Sequence[Rows]):
        self.parts = list(parts)
        self.files = tuple(f for p in parts for f in p.files)
        self.starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i):
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return dataclasses.replace(self.parts[k][i - int(self.starts[k])], index=i)


class ZipFiles:
    """Members of a zip archive by name, read when asked for; the handle is reopened in each process."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            with zipfile.ZipFile(self.path) as z:
                self.names = set(z.namelist())
        except (OSError, zipfile.BadZipFile) as e:
            raise DatasetError(f"{self.path}: cannot read the zip archive ({e})") from None
        self._zip = None

    def __getstate__(self):
        return {**self.__dict__, "_zip": None}

    def read(self, name: str) -> bytes:
        if name not in self.names:
            raise KeyError(name)
        if self._zip is None:
            self._zip = zipfile.ZipFile(self.path)
        return self._zip.read(name)

    def open_text(self, name: str) -> io.TextIOWrapper:
        return io.TextIOWrapper(io.BytesIO(self.read(name)), encoding="utf-8-sig")


def apple_metadata(name: str) -> bool:
    """A zip entry or file macOS added beside the data: under `__MACOSX/`, or an AppleDouble `._name`."""
    parts = name.split("/")
    return "__MACOSX" in parts or parts[-1].startswith("._")


def locate(folder: Path, patterns: tuple[str, ...], what: str) -> Path:
    """The one file the first matching pattern finds in `folder` (macOS metadata passed over); an error naming the
    candidates when it finds several, or the patterns when none finds any."""
    for pattern in patterns:
        hits = sorted(p for p in folder.glob(pattern)
                      if p.is_file() and not apple_metadata(p.relative_to(folder).as_posix()))
        if len(hits) > 1:
            raise DatasetError(f"{folder}: holds {len(hits)} copies of {what} ({', '.join(map(str, hits))}); "
                               "give the one to read")
        if hits:
            return hits[0]
    raise DatasetError(f"{folder}: none of {list(patterns)} ({what})")


class ZipLines(Rows):
    """The JSON lines of one zip member, read whole when first asked for (MindCube's training file: some ten thousand
    rows) and parsed a row at a time, each named `archive:member:line`."""

    def __init__(self, members: ZipFiles, name: str):
        self.members, self.name, self.files = members, name, (str(members.path),)
        self._lines: list[bytes] | None = None
        self.numbers = [k + 1 for k, line in enumerate(self._read()) if line.strip()]

    def _read(self) -> list[bytes]:
        if self._lines is None:
            self._lines = self.members.read(self.name).removeprefix(b"\xef\xbb\xbf").split(b"\n")
        return self._lines

    def __getstate__(self):  # a worker process reads the member again
        return {**self.__dict__, "_lines": None}

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, i):
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        number = self.numbers[i]
        return line_row(self._read()[number - 1], f"{self.members.path}:{self.name}:{number}", i)


class Source(Sequence[Sample]):
    """A layout's rows as Samples, each converted when it is asked for (so an error names its row then)."""

    def __init__(self, rows: Rows, convert: Callable[[Row], Sample]):
        self.rows, self.convert = rows, convert

    @property
    def files(self) -> tuple[str, ...]:
        return self.rows.files

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return self.convert(self.rows[i])
