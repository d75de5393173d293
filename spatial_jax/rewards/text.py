"""Label text helpers shared by the reward parsers: normalisation, word sets, bag-of-words similarity."""

from __future__ import annotations

import math
import re

_WORD = re.compile(r"[a-z0-9]+")
_SPACE = re.compile(r"\s+")


def normalise_label(s: str) -> str:
    """Lower-cased, whitespace collapsed to single spaces and trimmed (SPEC 7)."""
    return _SPACE.sub(" ", s.lower()).strip()


def words(s: str) -> frozenset[str]:
    """The set of lower-cased `[a-z0-9]+` tokens of `s`."""
    return frozenset(_WORD.findall(s.lower()))


def label_similarity(a: str, b: str) -> float:
    """Cosine of binary bag-of-words vectors (eq. 13, SpatialCORE); 0 when either label has no word."""
    wa, wb = words(a), words(b)
    if not wa or not wb:
        return 0.0
    return len(wa & wb) / math.sqrt(len(wa) * len(wb))
