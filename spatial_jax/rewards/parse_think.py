"""Parser of SpatialCORE/ProSR completions (SPEC 1.1): box lines, reasoning span, `</think>` count, answer letter.

Never raises on a string: anything it cannot read becomes an invalid box, a missing answer or a zero count.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import re
from collections.abc import Sequence
from typing import Any

from spatial_jax.rewards.geometry import valid_box

THINK_CLOSE = "</think>"

_LABEL = r'"(?P<label{n}>(?:[^"\\\n]|\\.)*)"'
_COORDS = r"\[(?P<coords{n}>[^\[\]{{}}\n]*)\]"
# Key order bbox_2d then label (SPEC 1.1); the reverse order is read too so a swapped line is not silently lost.
_BOX = re.compile(
    r'\{\s*"bbox_2d"\s*:\s*' + _COORDS.format(n=1) + r'\s*,\s*"label"\s*:\s*' + _LABEL.format(n=1) + r"\s*\}"
    r'|\{\s*"label"\s*:\s*' + _LABEL.format(n=2) + r'\s*,\s*"bbox_2d"\s*:\s*' + _COORDS.format(n=2) + r"\s*\}"
)
# JSON integers: ASCII digits only (a Unicode digit is no digit token of D, SPEC 1.1).
_INT = re.compile(r"\s*([0-9]+)\s*")
# Longer digit runs cannot be a coordinate in [0, coord_max]; int() would refuse those beyond 4300 digits anyway.
_MAX_INT_DIGITS = 18
_STANDALONE_CAPITAL = re.compile(r"(?<![A-Za-z0-9])[A-Z](?![A-Za-z0-9])")
# "(B) ..." or "B." / "B)" / "B:" then space or end; a bare "A man ..." is an article, not a letter.
_GOLD_LETTER = re.compile(r"\(([A-Z])\)|([A-Z])[.):](?=\s|$)")


@dataclasses.dataclass(frozen=True)
class ParsedBox:
    """A box line: coordinates (ints when all four parse), label, validity, digit spans of each coordinate."""

    bbox: tuple[int, ...]
    label: str
    valid: bool
    coord_spans: tuple[tuple[int, int], ...]
    span: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class ParsedThink:
    boxes: tuple[ParsedBox, ...]
    reasoning_span: tuple[int, int]
    think_close_count: int
    answer: str | None
    after_think: str

    @property
    def closed(self) -> bool:
        return self.think_close_count > 0

    @property
    def valid_boxes(self) -> tuple[ParsedBox, ...]:
        return tuple(b for b in self.boxes if b.valid)

    @property
    def well_formed_tail(self) -> bool:
        """Exactly one `</think>`, followed by one capital letter and nothing else (whitespace aside)."""
        tail = self.after_think.strip()
        return self.think_close_count == 1 and len(tail) == 1 and "A" <= tail <= "Z"

    @property
    def well_formed_text_tail(self) -> bool:
        """A text gold's form (SPEC section 10): exactly one `</think>`, followed by a one-line answer."""
        tail = self.after_think.strip()
        return self.think_close_count == 1 and bool(tail) and "\n" not in tail

    def well_formed(self, text_gold: bool) -> bool:
        return self.well_formed_text_tail if text_gold else self.well_formed_tail


def _label_text(raw: str) -> str:
    try:
        out = json.loads('"' + raw + '"')
    except ValueError:
        return raw
    return out if isinstance(out, str) else raw


def _parse_box(m: re.Match, coord_max: int) -> ParsedBox:
    which = "1" if m.group("coords1") is not None else "2"
    coords_text = m.group("coords" + which)
    base = m.start("coords" + which)
    label = _label_text(m.group("label" + which))
    values: list[int] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    ok = True
    for part in coords_text.split(","):
        im = _INT.fullmatch(part)
        digits = im.group(1).lstrip("0") if im is not None else ""
        if im is None or len(digits) > _MAX_INT_DIGITS:
            ok = False
        else:
            values.append(int(digits or "0"))
            spans.append((base + pos + im.start(1), base + pos + im.end(1)))
        pos += len(part) + 1
    ok = ok and len(values) == 4
    valid = ok and valid_box(values, label, 0, coord_max)
    return ParsedBox(
        bbox=tuple(values),
        label=label,
        valid=valid,
        coord_spans=tuple(spans) if ok else (),
        span=(m.start(), m.end()),
    )


def answer_letter(completion: str) -> str | None:
    """SPEC 2: the text after the last `</think>` if it is one capital letter, else its last standalone capital."""
    idx = completion.rfind(THINK_CLOSE)
    if idx < 0:
        return None
    tail = completion[idx + len(THINK_CLOSE):]
    stripped = tail.strip()
    if len(stripped) == 1 and "A" <= stripped <= "Z":
        return stripped
    found = _STANDALONE_CAPITAL.findall(tail)
    return found[-1] if found else None


def final_answer(completion: str) -> str | None:
    """SpatialCORE's and ProSR's final answer (SPEC 1.1): the text after the last `</think>`, stripped; None when
    `</think>` is missing or nothing follows it."""
    text = completion if isinstance(completion, str) else ""
    idx = text.rfind(THINK_CLOSE)
    tail = text[idx + len(THINK_CLOSE):].strip() if idx >= 0 else ""
    return tail or None


def parse_think(completion: str, coord_max: int = 1000) -> ParsedThink:
    """Parses one completion. Boxes are read from the reasoning span (the whole text when `</think>` is missing)."""
    if not isinstance(completion, str):
        completion = ""
    first = completion.find(THINK_CLOSE)
    end = first if first >= 0 else len(completion)
    last = completion.rfind(THINK_CLOSE)
    after = completion[last + len(THINK_CLOSE):] if last >= 0 else ""
    boxes = tuple(_parse_box(m, coord_max) for m in _BOX.finditer(completion, 0, end))
    return ParsedThink(
        boxes=boxes,
        reasoning_span=(0, end),
        think_close_count=completion.count(THINK_CLOSE),
        answer=answer_letter(completion),
        after_think=after,
    )


def _option_text(option: str) -> str:
    """Option text without a leading letter label such as `A.` or `(A)`."""
    m = re.match(r"\s*\(?[A-Z]\)?[.:)]\s*|\s*\([A-Z]\)\s*", option)
    return option[m.end():] if m else option


def resolve_gold(answer: Any, options: Sequence[str] = ()) -> str | None:
    """SPEC 2: gold answer -> letter. "B", "B. a man on the left", "(B) ..." -> B (the leading letter, never a later
    word); an integer is a 0-based index into `options` (any index < 26 when no options are given); an option's
    text resolves to its letter; anything else -> None."""
    if isinstance(answer, bool) or answer is None:
        return None
    if isinstance(answer, numbers.Integral):  # numpy integers too
        index = int(answer)
        n = len(options) if options else 26
        return chr(ord("A") + index) if 0 <= index < min(n, 26) else None
    if not isinstance(answer, str):
        return None
    s = answer.strip()
    if len(s) == 1 and s.isascii() and s.isalpha():
        return s.upper()
    m = _GOLD_LETTER.match(s)
    if m:
        return m.group(1) or m.group(2)
    key = " ".join(s.lower().split())
    for i, opt in enumerate(options[:26]):
        if isinstance(opt, str) and " ".join(_option_text(opt).lower().split()) == key and key:
            return chr(ord("A") + i)
    return None
