"""Box coordinate-token uncertainty (eq. 5, SpatialCORE): token positions of each coordinate's digits and H in [0, 1].

Host side: digit character spans -> token positions (SPEC 7) -> padded [B, 4, K] entropy/mask arrays.
Device side: `spatial_jax.kernels.position.uncertainty.box_uncertainty_from_digits` (eq. 5 itself, beside the kernels).

How every scorer reads a token trace (records.py refuses other traces in JSON; a Rollout built directly may hold
anything): a token counts only when its offsets lie in the completion, 0 <= start < end <= len(completion), and its
entropy is a number in [-ENTROPY_ROUNDING, ENTROPY_LIMIT] nats, read as 0 when negative (float32 rounding of a
near-certain token, as records.py reads it). Any other token is left out as if the trace lacked it: NaN is the
records' "missing", and a more negative, infinite or absurd value is no entropy, which would otherwise pull a box's
H to 0 (the largest weight) or overflow ProSR's trajectory sums. Rewards therefore stay within their bounds.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from spatial_jax.records import ENTROPY_LIMIT, ENTROPY_ROUNDING


def read_entropies(entropies) -> tuple[np.ndarray, np.ndarray]:
    """(entropies with rounding below 0 read as 0, whether each counts) as the module docstring reads a trace."""
    e = np.asarray(entropies, np.float64)
    readable = (e >= -ENTROPY_ROUNDING) & (e <= ENTROPY_LIMIT)  # NaN fails both comparisons
    return np.where(readable, np.maximum(e, 0.0), 0.0), readable


class TokenLookup:
    """Digit-token positions of character spans in one completion (SPEC 7); offsets outside the completion are
    never a digit token (module docstring).

    Offsets from a tokenizer are sorted, so the overlapping tokens are found by bisection; unsorted offsets
    fall back to a scan.
    """

    def __init__(self, completion: str, offsets: Sequence[tuple[int, int]]):
        self.completion = completion
        self.offsets = offsets
        self.starts = [s for s, _ in offsets]
        self.ends = [e for _, e in offsets]
        self.sorted = all(a <= b for a, b in zip(self.starts, self.starts[1:])) and all(
            a <= b for a, b in zip(self.ends, self.ends[1:])
        )

    def digit_positions(self, span: tuple[int, int]) -> list[int]:
        """Tokens overlapping [start, end) whose own text is made of ASCII digits only."""
        a, b = span
        if self.sorted:
            candidates = range(bisect.bisect_right(self.ends, a), bisect.bisect_left(self.starts, b))
        else:
            candidates = range(len(self.offsets))
        out = []
        for t in candidates:
            s, e = self.offsets[t]
            if s < b and e > a and 0 <= s < e <= len(self.completion):
                text = self.completion[s:e]
                if text and text.isascii() and text.isdigit():
                    out.append(t)
        return out

    def box_positions(self, coord_spans: Sequence[tuple[int, int]]) -> list[list[int]]:
        """Per coordinate of one box, its digit-token positions."""
        return [self.digit_positions(span) for span in coord_spans]


def digit_token_positions(
    completion: str, offsets: Sequence[tuple[int, int]], span: tuple[int, int]
) -> list[int]:
    """Tokens overlapping the character span [start, end) whose own text is made of digits only (SPEC 7)."""
    return TokenLookup(completion, offsets).digit_positions(span)


def box_digit_positions(
    completion: str, offsets: Sequence[tuple[int, int]], coord_spans: Sequence[tuple[int, int]]
) -> list[list[int]]:
    """Per coordinate (4 of them), the digit-token positions of that coordinate."""
    return TokenLookup(completion, offsets).box_positions(coord_spans)


def pack_box_digits(
    positions: Sequence[Sequence[Sequence[int]]],
    entropies: Sequence[float],
    k: int | None = None,
    rows: int | None = None,
    dtype=np.float64,
) -> tuple[np.ndarray, np.ndarray]:
    """Boxes' per-coordinate token positions -> padded ([B, 4, K] entropies, [B, 4, K] mask).

    `rows` pads B (extra boxes fully masked), `k` pads K (at least the longest coordinate). A position outside
    the entropy sequence, or whose entropy is not readable (module docstring), is left masked.
    """
    ent, readable = read_entropies(entropies)
    need_k = max([len(p) for box in positions for p in box] + [1])
    k = need_k if k is None else k
    if k < need_k:
        raise ValueError(f"k={k} is smaller than the longest coordinate ({need_k} digit tokens)")
    b = len(positions) if rows is None else rows
    if b < len(positions):
        raise ValueError(f"rows={b} is smaller than the number of boxes ({len(positions)})")
    values = np.zeros((b, 4, k), dtype=dtype)
    mask = np.zeros((b, 4, k), dtype=bool)
    for i, box in enumerate(positions):
        if len(box) != 4:
            raise ValueError(f"box {i} has {len(box)} coordinates, expected 4")
        for c, pos in enumerate(box):
            for slot, t in enumerate(pos):
                if 0 <= t < ent.shape[0] and readable[t]:
                    values[i, c, slot] = ent[t]
                    mask[i, c, slot] = True
    return values, mask


def pack_rollout_boxes(
    completion: str,
    offsets: Sequence[tuple[int, int]],
    entropies: Sequence[float],
    coord_spans: Sequence[Sequence[tuple[int, int]]],
    k: int | None = None,
    rows: int | None = None,
    dtype=np.float64,
) -> tuple[np.ndarray, np.ndarray]:
    """One rollout's boxes (each given by its 4 coordinate digit spans) -> padded ([B, 4, K], [B, 4, K] mask)."""
    lookup = TokenLookup(completion, offsets)
    return pack_box_digits([lookup.box_positions(spans) for spans in coord_spans], entropies, k, rows, dtype)
