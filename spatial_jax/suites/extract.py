"""Shared scoring arithmetic: VSI-Bench's mean relative accuracy and the project's letter extraction for the
benchmarks whose authors publish no scorer."""

from __future__ import annotations

import re

import numpy as np

# VSI-Bench (lmms_eval/tasks/vsibench/utils.py): MRA:.5:.95:.05, ten confidence thresholds 0.50, 0.55, ..., 0.95
# (np.linspace over int((0.95 - 0.5) / 0.05 + 2) = 10 points), a hit when |pred - gt| / gt <= 1 - threshold.
THRESHOLDS = np.linspace(0.5, 0.95, int((0.95 - 0.5) / 0.05 + 2))


def mra(pred: float, target: float, zero_target_absolute: bool = False) -> float:
    """Mean relative accuracy. zero_target_absolute: SPAR-Bench's variant, |pred - gt| when gt == 0. Otherwise a
    zero target (which the official code divides by) scores the limit of the relative error: 1 for an exact 0, else 0;
    a non-finite prediction scores 0."""
    if not np.isfinite(pred):
        return 0.0
    if zero_target_absolute and target == 0:
        dist = abs(pred - target)
    elif target == 0:
        return float(pred == 0)
    else:
        dist = abs((pred - target) / target)
    return float(np.mean(dist <= 1 - THRESHOLDS))


_ANSWER = re.compile(r"(?:answer\s*(?:is)?\s*[:：]?\s*)\(?([A-Z])\)?(?![A-Za-z])", re.IGNORECASE)
_TAG = re.compile(r"<answer>\s*\(?([A-Z])\)?", re.IGNORECASE)
_ALONE = re.compile(r"^\s*\(?([A-Z])\)?\s*[.:)]?\s*(?:$|\s)")
_PAREN = re.compile(r"\(([A-Z])\)")


def choice_letter(text: str, n_options: int) -> str | None:
    """The project's rule where the authors publish none: the last `<answer>X` tag, else the last "answer (is)
    (:) X", else a response that starts with the letter alone ("B", "(B)", "B. text"), else the first "(X)"; only
    capital letters of the options count."""
    valid = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:n_options]
    for pattern, pick in ((_TAG, -1), (_ANSWER, -1), (_ALONE, 0), (_PAREN, 0)):
        hits = [m.group(1) for m in pattern.finditer(text) if m.group(1) in valid]
        if hits:
            return hits[pick]
    return None
