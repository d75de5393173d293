"""The bad-row policy for real datasets (data.bad_rows): "fail" stops at the first row that cannot be read, with one
line naming its file, row and field; "skip" drops such rows, counts them by reason, and refuses the source when more
than data.max_bad_share of its rows are bad (a copy that is mostly unreadable is a wrong path or layout, not noise).

A source is screened once, where every row is read before training (the trainer's preflight, `data check`); the rows
it dropped are remembered by source, so the iterators that open the same source later (`Screened`) skip the same
rows without reading them again."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from spatial_jax.data.sample import DatasetError, Sample

BAD_ROWS = ("fail", "skip")
_FIELD = re.compile(r"field '([^']+)'")
_WHERE = re.compile(r"^.*?(?::\d+| row \d+| record \d+): ")
# source key -> the indices screening dropped; filled by `screen`, read by `screened`
_DROPPED: dict[tuple, frozenset[int]] = {}


def reason(error: DatasetError) -> str:
    """What kind of fault a row has, to count rows by: the field it names (list positions dropped), else the
    message's first clause with its numbers and paths taken out."""
    message = str(error)
    if "duplicate id" in message:
        return "duplicate id"
    field = _FIELD.search(message)
    if field:
        return "field " + re.sub(r"\[\d+\]", "", field.group(1))
    what = _WHERE.sub("", message).split(";")[0].split(":")[0]  # anchored: the leading location only
    what = re.sub(r"\S*/\S*", "<path>", what)
    return " ".join(re.sub(r"\d+", "N", what).split())[:80] or "unreadable row"


class Screened(Sequence[Sample]):
    """A source without the rows screening dropped, in order."""

    def __init__(self, source: Sequence[Sample], dropped: frozenset[int]):
        self.source = source
        self.keep = [i for i in range(len(source)) if i not in dropped]

    @property
    def files(self) -> tuple[str, ...]:
        return getattr(self.source, "files", ())

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return self.source[self.keep[i]]


def screen(source: Sequence[Sample], check: Callable[[Sample], Any], bad_rows: str, max_bad_share: float,
           key: tuple = (), unique_ids: bool = True, errors: list[str] | None = None) -> Counter:
    """Reads every row (and `check`s it; with `unique_ids`, a row repeating an earlier row's id is bad: rewards,
    pseudo-GT and the paired gains are keyed by id). "fail": the first bad row's DatasetError. "skip": the bad rows
    counted by reason (remembered under `key`; each one's message appended to `errors`), or a DatasetError when their
    share is over max_bad_share."""
    if bad_rows not in BAD_ROWS:
        raise DatasetError(f"data.bad_rows must be one of {BAD_ROWS}, got {bad_rows!r}")
    reasons, dropped, first, seen = Counter(), set(), None, {}
    for i in range(len(source)):
        try:
            sample = source[i]
            if unique_ids and sample.id in seen:
                raise sample.error(f"duplicate id {sample.id!r}, first at {seen[sample.id]}")
            check(sample)
            seen[sample.id] = sample.origin or f"row {i}"
        except DatasetError as e:
            if bad_rows == "fail":
                raise
            reasons[reason(e)] += 1
            dropped.add(i)
            if errors is not None:
                errors.append(str(e))
            first = first or str(e)
    if dropped and len(dropped) > max_bad_share * len(source):
        share = f"{100 * len(dropped) / len(source):.2f}%"
        raise DatasetError(f"{len(dropped)} of {len(source)} rows are bad ({share}), over data.max_bad_share = "
                           f"{max_bad_share:g}; by reason: {dict(reasons.most_common())}; the first: {first}")
    if key:
        _DROPPED[key] = frozenset(dropped)
    return reasons


def screened(source: Sequence[Sample], key: tuple) -> Sequence[Sample]:
    """The source without the rows its screening under `key` dropped (as it is where none was screened)."""
    dropped = _DROPPED.get(key)
    return Screened(source, dropped) if dropped else source
