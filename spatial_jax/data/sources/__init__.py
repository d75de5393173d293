"""Data sources by spec, parsed here and nowhere else: `FORMAT:PATH[:split]` names a copy as its authors publish it,
read by one module per layout, each naming the card and the loading code it follows:

  jsonl:PATH (or a bare PATH)   the project's own JSONL (data/jsonl.py)
  synthetic:<split>:<n>         the synthetic world (data/synthetic/)
  verl:PATH[:split]             verl's RL parquet (verl.py)
  easyr1:PATH[:split]           EasyR1's parquet / JSON lines (easyr1.py)
  trl:PATH[:split]              TRL's GRPO vision datasets (trl.py)
  hf-disk:PATH[:split]          a datasets.save_to_disk folder (hf_disk.py)
  stvqa7k:PATH[:split]          STVQA-7K, SpatialThinker's data (stvqa7k.py)
  omnispatial-train:PATH        OmniSpatial's training split, zipped or not (omnispatial_train.py)
  mindcube-train:PATH           MindCube's training split (mindcube_train.py)
  spar7m:PATH[:split]           SPAR-7M (spar7m.py)
  vsi590k:PATH[:split]          VSI-590K, video (vsi590k.py)
  mix:W*SPEC|W*SPEC...          a weighted mixture (AlloSpatial's pool), drawn by grain's mixing

A layout source reads its rows lazily (data/sources/rows.py): a row becomes a Sample when asked for, so the grain
pipeline's index shuffle, per-host slicing and checkpointed position apply to it as to a JSONL file. data.columns
(`field=column`), or the spec's own `?field=column&...` (which wins), renames a layout's fields; nothing is ever
written into the copy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spatial_jax.config import ConfigError
from spatial_jax.data.sample import DatasetError, Sample, regular_file
from spatial_jax.data.sources import (
    conversation,
    easyr1,
    hf_disk,
    mindcube_train,
    omnispatial_train,
    spar7m,
    stvqa7k,
    trl,
    verl,
    vsi590k,
)
from spatial_jax.data.sources import fields as F
from spatial_jax.digests import sha256

READERS = {m.NAME: m.open_source for m in (verl, easyr1, trl, hf_disk, stvqa7k, omnispatial_train, mindcube_train,
                                            spar7m, vsi590k)}
FORMATS = ("jsonl", "synthetic", *READERS, "mix")
COLUMN_FIELDS = frozenset(k for m in (verl, easyr1, trl, stvqa7k, omnispatial_train, mindcube_train, conversation)
                          for k in m.FIELDS) | set(F.SETTINGS) | {"layout"}


@dataclasses.dataclass(frozen=True)
class Spec:
    format: str
    path: str
    split: str = ""
    columns: tuple[str, ...] = ()  # the spec's own `?field=column&...`, over data.columns


def parse_spec(spec: str) -> Spec:
    """`FORMAT:PATH[:split][?field=column&...]`; a bare path is the project's JSONL; `synthetic:<split>:<n>` keeps
    its own form. An unknown format names the known ones."""
    if not isinstance(spec, str) or not spec.strip():
        raise DatasetError(f"empty data source; give a JSONL path or FORMAT:PATH (formats: {', '.join(FORMATS)})")
    head, sep, rest = spec.partition(":")
    if not sep or not re.fullmatch(r"[a-z][a-z0-9-]*", head):
        return Spec("jsonl", spec)
    if head not in FORMATS:
        raise DatasetError(f"unknown data format {head!r} in {spec!r}; known: {', '.join(FORMATS)}")
    if head in ("synthetic", "mix"):
        return Spec(head, rest)
    rest, _, query = rest.partition("?")
    columns = tuple(c for c in query.split("&") if c)
    path, sep, split = rest.rpartition(":")
    if sep and re.fullmatch(r"[A-Za-z0-9_.-]+", split) and path:
        return Spec(head, path, split, columns)
    if not rest:
        raise DatasetError(f"data source {spec!r} names no path ({head}:PATH)")
    return Spec(head, rest, "", columns)


MIN_MIXTURE_SHARE = 1e-9


def parse_mixture(body: str) -> list[tuple[float, str]]:
    """`W*SPEC|W*SPEC` -> [(weight, spec)]."""
    out = []
    for part in body.split("|"):
        weight, sep, spec = part.partition("*")
        try:
            w = float(weight)
        except ValueError:
            w = float("nan")
        if not sep or not spec or not w > 0 or w == float("inf"):
            raise DatasetError(f"mixture part {part!r} must read WEIGHT*SPEC with a positive weight")
        if spec.startswith("mix:"):
            raise DatasetError(f"mixture part {part!r}: a mixture inside a mixture is not supported")
        out.append((w, spec))
    if len(out) < 2:
        raise DatasetError(f"a mixture needs two or more parts, got {body!r}")
    # a share too small to ever be drawn is refused here, not left to overflow in grain's scaling (see Mixture)
    top = max(w for w, _ in out)
    for (w, _), part in zip(out, body.split("|"), strict=True):
        if not w / top >= MIN_MIXTURE_SHARE:
            raise DatasetError(f"mixture part {part!r}: its weight is below {MIN_MIXTURE_SHARE:g} of the largest "
                               "part's, so it would never be drawn; drop the part or raise its weight")
    return out


class Mixture(Sequence[Sample]):
    """grain's MapDataset.mix of the parts, each shuffled by seed + its index: the same seed draws the same rows in
    the same order, and any position is recomputed from its index (so the pipeline's checkpointed state resumes it).
    As grain mixes, the mixture ends where its first part runs out."""

    def __init__(self, parts: list[tuple[float, Sequence[Sample]]], seed: int):
        import grain

        self.parts = parts
        weights = [w for w, _ in parts]
        # grain scales the weights by 100 / the smallest: where that overflows (1e-308, 1e308 beside 1e-3), they are
        # taken relative to the largest first; elsewhere as given, so a mixture draws what it always drew
        if not math.isfinite(max(weights) * (100 / min(weights))):
            weights = [w / max(weights) for w in weights]
        self._ds = grain.MapDataset.mix([grain.MapDataset.source(p).shuffle(seed=seed + k)
                                         for k, (_, p) in enumerate(parts)], weights)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f for _, p in self.parts for f in getattr(p, "files", ()))

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self._ds[i % len(self)]


def open_spec(spec: str, synthetic_cfg: Any = None, check_images: bool = True, columns: Sequence[str] = (),
              seed: int = 0) -> Sequence[Sample]:
    """The samples a spec names (see the module doc); errors name the spec and, for a row, its file and row."""
    s = parse_spec(spec)
    if s.format == "synthetic":
        from spatial_jax.data.synthetic import SyntheticConfig, SyntheticSource

        parts = spec.split(":")
        if len(parts) != 3 or not parts[2].isdigit():
            raise DatasetError(f"synthetic source {spec!r} must read synthetic:<train|heldout>:<count>")
        try:
            return SyntheticSource(synthetic_cfg or SyntheticConfig(), parts[1], int(parts[2]))
        except ValueError as e:
            raise DatasetError(f"synthetic source {spec!r}: {e}") from None
    if s.format == "jsonl":
        from spatial_jax.data.jsonl import read_jsonl

        return read_jsonl(s.path, check_images=check_images)
    if s.format == "mix":
        parts = []
        for w, p in parse_mixture(s.path):
            part = open_spec(p, synthetic_cfg, check_images, columns, seed)
            if not len(part):  # grain refuses it with a traceback
                raise DatasetError(f"mixture part {p!r} holds no rows")
            parts.append((w, part))
        return Mixture(parts, seed)
    cols = F.parse_columns((*columns, *s.columns))
    unknown = sorted(set(cols) - COLUMN_FIELDS)
    if unknown:
        raise DatasetError(f"data.columns names unknown fields {unknown}; known: {sorted(COLUMN_FIELDS)}")
    path = Path(s.path).expanduser()
    if not path.is_dir():
        regular_file(path, f"data source {spec!r}")
    return READERS[s.format](path, s.split, F.Context(cols, path, check_images))


def spec_digest(spec: str) -> str | None:
    """SHA-256 of the rows a spec reads, which a checkpoint or a pseudo-GT output records (rows change a result as
    settings do): a JSONL file's own digest (as recorded before layouts existed), for a layout its row files' names
    and bytes with its format, split and columns (a moved copy is the same copy; images are not read), for a mixture
    its parts' with their weights; None for the synthetic world, which its settings make."""
    s = parse_spec(spec)
    if s.format == "synthetic":
        return None
    if s.format == "jsonl":
        return sha256(regular_file(s.path))
    if s.format == "mix":
        parts = "|".join(f"{w}*{spec_digest(p)}" for w, p in parse_mixture(s.path))
        return hashlib.sha256(parts.encode()).hexdigest()
    h = hashlib.sha256(f"{s.format}:{s.split}?{'&'.join(s.columns)}".encode())
    for f in sorted(open_spec(spec, check_images=False).files):
        h.update(f"{Path(f).name}:{sha256(f)}\n".encode())
    return h.hexdigest()


def spec_paths(spec: str) -> list[str]:
    """The files and folders a spec reads (what an output must never overwrite); none for the synthetic world."""
    s = parse_spec(spec)
    if s.format == "synthetic":
        return []
    if s.format == "mix":
        return [p for _, part in parse_mixture(s.path) for p in spec_paths(part)]
    return [s.path]


def refuse_writing_into_copies(outputs: dict[str, str | None], spec: str) -> None:
    """ConfigError (rc 2), before anything is written, for an output (flag -> path) inside the folder of a published
    copy the spec reads (the folder itself, or the one holding a copy's file): nothing is written into a copy."""
    s = parse_spec(spec)
    parts = [p for _, p in parse_mixture(s.path)] if s.format == "mix" else [spec]
    for part in parts:
        p = parse_spec(part)
        if p.format in ("jsonl", "synthetic"):
            continue
        root = Path(p.path).expanduser()
        root = os.path.realpath(root if root.is_dir() else root.parent)
        for flag, out in outputs.items():
            # the folder itself too (a folder output, to-cvbench's --out, writes its files into it): one resolve
            if out and (os.path.realpath(out) + os.sep).startswith(root + os.sep):
                raise ConfigError(f"{flag} {out} lies inside the copy {root} that {part} reads; nothing is written "
                                  "into a copy")
