"""Text helpers shared by the reward parsers: label normalisation, word sets, bag-of-words similarity, and the
normalised exact match that scores a short text gold (SPEC section 10)."""

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


_ARTICLE = re.compile(r"\b(?:a|an|the)\b")
# ASCII punctuation and the common typographic marks a model writes around a short answer
_PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + "\u2018\u2019\u201c\u201d\u3002\uff0c"


def normalise_short_answer(s: str) -> str:
    """SPEC section 10's form of a short text answer: lower case, surrounding punctuation and the articles a / an /
    the removed, whitespace runs collapsed ("The Left." -> "left")."""
    s = _SPACE.sub(" ", s.lower()).strip().strip(_PUNCTUATION + " ")
    return _SPACE.sub(" ", _ARTICLE.sub(" ", s)).strip()


def _as_number(s: str) -> float | None:
    """A short answer read as a number before its punctuation goes (a sign or a leading point is part of it; a
    closing full stop is not)."""
    try:
        x = float(s.strip().removesuffix(".").strip())
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def short_answer_score(predicted: str | None, gold: str, number_score=None) -> float:
    """SPEC section 10: 1 when the final answer equals the text gold after normalisation, else 0; when both sides
    read as numbers they compare as numbers, by `number_score(prediction, target)` where the method scores numbers
    so (AlloSpatial's MRA), else exactly. No answer, or a gold that normalises to nothing, scores 0."""
    if predicted is None or not isinstance(gold, str):
        return 0.0
    pn, gn = _as_number(predicted), _as_number(gold)
    if pn is not None and gn is not None:
        return float(number_score(pn, gn)) if number_score is not None and gn != 0 else float(pn == gn)
    g = normalise_short_answer(gold)
    return float(bool(g) and normalise_short_answer(predicted) == g)
