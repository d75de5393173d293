"""AlloSpatial harness parser (SPEC 1.3): steps, tool calls, `<Answer>`; never raises on any string.

A trajectory reads `Step1: Visual Clues`, optional `Step2.x` (World2Mind map) and `Step3.x` (view a rendered
map) each with a `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, `Step4: Cross-Validation` after tool
use, `Step5: Final Answer` and `<Answer>...</Answer>`. Tool output that a multi-turn rollout splices into the text
(`<tool_response>...</tool_response>`, to the end of the text when unclosed) is not the model's and is blanked
before parsing, keeping character offsets.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Literal

ToolKind = Literal["map", "view"]


@dataclasses.dataclass(frozen=True)
class ToolSchema:
    name: str
    kind: ToolKind
    required: tuple[str, ...]


# Tool names and arguments as the AlloSpatial paper's traces call them (§3.2-3.3, App. D): World2Mind takes the
# query xi = (categories C, knowledge type k, footprint format f, scene type s); traversable_categories is optional.
WORLD2MIND = ToolSchema(
    name="world2mind",
    kind="map",
    required=("categories", "knowledge_type", "output_format", "scene_type"),
)
VIEW_IMAGE = ToolSchema(name="view_image", kind="view", required=("visualization_type",))
TOOL_SCHEMAS: tuple[ToolSchema, ...] = (WORLD2MIND, VIEW_IMAGE)

STEP_MAP, STEP_VIEW, STEP_CROSS_CHECK = 2, 3, 4

_CALL_TAGS = re.compile(r"<(/?)tool_call>")
_RESPONSE = re.compile(r"<tool_response>.*?(?:</tool_response>|\Z)", re.DOTALL)
_ANSWER_TAGS = re.compile(r"<(/?)answer>", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_GOLD_NUMBER = re.compile(r"\s*" + _NUMBER.pattern + r"\s*[^\W\d]*\s*")
_LETTER = re.compile(r"^\(?\s*([A-Za-z])\s*\)?(?:[.):\s]|$)")
# A step header starts a line (after optional markdown: spaces, '#', '*', '_', '>', '-'); "Step10" is no step.
_STEP = re.compile(r"^[ \t#*_>\-]*step\s*([1-5])(?:\.(\d+))?(?!\d)", re.IGNORECASE | re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One `<tool_call>` block. `malformed`: its JSON does not parse to {"name": str, "arguments": object} or it
    names no known tool (an unclosed trailing block is malformed too); `missing`: required arguments absent."""

    start: int
    end: int
    raw: str
    name: str | None
    arguments: dict | None
    kind: ToolKind | None
    malformed: bool
    missing: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.malformed and not self.missing


@dataclasses.dataclass(frozen=True)
class Step:
    major: int
    minor: int | None
    start: int


@dataclasses.dataclass(frozen=True)
class ParsedHarness:
    steps: tuple[Step, ...]
    tool_calls: tuple[ToolCall, ...]
    answer: str | None

    def has_step(self, major: int) -> bool:
        return any(s.major == major for s in self.steps)

    def calls(self, kind: ToolKind) -> tuple[ToolCall, ...]:
        return tuple(c for c in self.tool_calls if c.kind == kind)

    @property
    def n_malformed(self) -> int:
        return sum(c.malformed for c in self.tool_calls)

    @property
    def n_missing_arguments(self) -> int:
        return sum(len(c.missing) for c in self.tool_calls)

    @property
    def cross_check_after_tools(self) -> bool:
        """A Step4 header follows the last map/view call (vacuously true without one; malformed calls are no use)."""
        used = [c.end for c in self.tool_calls if c.kind is not None]
        if not used:
            return True
        last = max(used)
        return any(s.major == STEP_CROSS_CHECK and s.start >= last for s in self.steps)


def response_spans(text: str) -> tuple[tuple[int, int], ...]:
    """[start, end) character spans of the tool responses spliced into `text`."""
    return tuple(m.span() for m in _RESPONSE.finditer(text))


def model_text(text: str) -> str:
    """`text` with tool responses blanked to spaces (same length, so offsets still index the original)."""
    return _RESPONSE.sub(lambda m: " " * len(m.group(0)), text)


def _present(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def parse_call(body: str, start: int = 0, end: int = 0) -> ToolCall:
    """Reads the text between `<tool_call>` and `</tool_call>`."""
    try:
        data = json.loads(body.strip())
    except (ValueError, RecursionError):
        data = None
    name = data.get("name") if isinstance(data, dict) else None
    args = data.get("arguments", {}) if isinstance(data, dict) else None
    if isinstance(args, str):
        # Some chat templates serialise arguments as a JSON string.
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            args = None
    schema = next((s for s in TOOL_SCHEMAS if s.name == name), None)
    if schema is None or not isinstance(args, dict):
        return ToolCall(start, end, body, name if isinstance(name, str) else None,
                        args if isinstance(args, dict) else None, None, malformed=True)
    missing = tuple(k for k in schema.required if not _present(args.get(k)))
    return ToolCall(start, end, body, name, args, schema.kind, malformed=False, missing=missing)


def _blocks(text: str, tags: re.Pattern) -> tuple[list[tuple[int, int, int, int]], re.Match | None]:
    """Blocks as a lazy `<t>(.*?)</t>` would find them, in one linear pass (a run of unclosed openers would make
    the regex quadratic): (start, end, body start, body end) each, and the opener of a trailing unclosed block."""
    blocks, opened = [], None
    for m in tags.finditer(text):
        if not m.group(1) and opened is None:
            opened = m
        elif m.group(1) and opened is not None:
            blocks.append((opened.start(), m.end(), opened.end(), m.start()))
            opened = None
    return blocks, opened


def _calls(text: str) -> tuple[ToolCall, ...]:
    blocks, tail = _blocks(text, _CALL_TAGS)
    calls = [parse_call(text[b0:b1], s, e) for s, e, b0, b1 in blocks]
    if tail is not None:
        calls.append(ToolCall(tail.start(), len(text), text[tail.end():], None, None, None, malformed=True))
    return tuple(calls)


def parse(completion: Any) -> ParsedHarness:
    """Parses one AlloSpatial trajectory; a non-string is read as an empty one."""
    text = model_text(completion if isinstance(completion, str) else "")
    steps = tuple(
        Step(int(m.group(1)), None if m.group(2) is None else int(m.group(2)), m.start())
        for m in _STEP.finditer(text)
    )
    answers, _ = _blocks(text, _ANSWER_TAGS)
    answer = text[answers[-1][2]:answers[-1][3]].strip() if answers else None
    return ParsedHarness(steps=steps, tool_calls=_calls(text), answer=answer)


def final_answer(completion: str) -> str | None:
    """AlloSpatial's final answer (SPEC 1.3): the `<Answer>` of the last turn (after the last tool response),
    stripped; None when that turn has none or it is empty."""
    text = completion if isinstance(completion, str) else ""
    spans = response_spans(text)
    last_turn = text[spans[-1][1]:] if spans else text
    answers, _ = _blocks(last_turn, _ANSWER_TAGS)
    return (last_turn[answers[-1][2]:answers[-1][3]].strip() or None) if answers else None


def find_tool_call(text: Any) -> ToolCall | None:
    """The last complete `<tool_call>...</tool_call>` of a turn (check `.malformed`/`.missing`), or None."""
    if not isinstance(text, str):
        return None
    masked = model_text(text)
    blocks, _ = _blocks(masked, _CALL_TAGS)
    if not blocks:
        return None
    s, e, b0, b1 = blocks[-1]
    return parse_call(masked[b0:b1], s, e)


def read_number(text: str | None) -> float | None:
    """The first finite number in `text` ("0.99 m" -> 0.99), or None."""
    if text is None:
        return None
    m = _NUMBER.search(text)
    if m is None:
        return None
    value = float(m.group(0))
    return value if math.isfinite(value) else None


def read_letter(text: str | None, options: tuple[str, ...] = ()) -> str | None:
    """An upper-case option letter: a bare letter ("B", "(B)", "B."), else the full text of an option, else a
    leading letter ("b. yes"). The option text comes before the leading letter, so "A man on the left" names the
    option that reads so rather than option A."""
    if text is None:
        return None
    stripped = text.strip()
    m = _LETTER.match(stripped)
    if m and not stripped[m.end():].strip():
        return m.group(1).upper()
    norm = " ".join(text.lower().split())
    for i, opt in enumerate(options[:26]):
        o = " ".join(opt.lower().split())
        om = _LETTER.match(o)
        if norm == o or (om is not None and norm == o[om.end():].strip()):
            return om.group(1).upper() if om is not None else chr(ord("A") + i)
    return m.group(1).upper() if m else None


def read_gold(answer: Any, options: tuple[str, ...] = ()) -> float | str | None:
    """A numeric gold as a float (int, float, or an option-less string "1.1" / "1.1 m"), else its option letter."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, (int, float)):
        return float(answer) if math.isfinite(answer) else None
    if not isinstance(answer, str):
        return None
    if not options and _GOLD_NUMBER.fullmatch(answer):
        return read_number(answer)
    return read_letter(answer, options)
