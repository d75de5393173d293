"""ProSR's SFT data filters (ProSR A.3, SPEC 3) on each sample's reference completion, Sample.reference[key].

A sample is removed when its reference is missing (`no_reference`), or when the reference fails any of:
  answer      the answer is correct: the method's accuracy component >= min_accuracy (the caller judges it, from
              the method whose format writes this reference key)
  reconsider  reconsider_count <= max_reconsider, over SPEC 3's markers ("wait", "let me reconsider", ..., "hmm")
  anchor      rho_anchor >= min_anchor_ratio: spatial-lexicon matches per word (eq. 12; a multi-word expression
              such as "in front of" or "(120, 45)" is one match)
  length      min_words <= words <= max_words
  repetition  no more than max_repeated_sentences sentences repeat an earlier one, and no word n-gram
              (n = repeat_ngram) occurs more than max_ngram_count times (a loop inside a sentence)
The filters read the reasoning: the text between `<think>` (when there is one) and the first `</think>` (the whole
completion without it), less its box lines (lines holding one JSON object), which are grounding, not prose.

ProSR's thresholds (its Table 7) are not in the paper's text, so every number here is the project's choice, a
config field: max_reconsider = 2 (a revision or two is care, more is dithering), min_anchor_ratio = 0.03 (about one
spatial expression per 33 words; the teacher prompt asks for every step to be spatially grounded), 10 <= words <=
400 (the prompt asks for 3 to 6 short steps), max_repeated_sentences = 0 with repeat_ngram = 6 and
max_ngram_count = 2 (the prompt forbids repeated descriptions), min_accuracy = 1.0 (a fully correct answer).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from spatial_jax.config import check_at_least, check_range, require
from spatial_jax.data.prompts import THINK_BOXES
from spatial_jax.data.sample import Sample

FILTERS = ("no_reference", "answer", "reconsider", "anchor", "length", "repetition")

RECONSIDER_MARKERS = (
    r"wait", r"let me reconsider", r"let me re-?examine", r"let me re-?think", r"let me think again",
    r"let me re-?evaluate", r"let me revisit", r"on second thought", r"let me check", r"let me look at", r"hmm+",
)
_RECONSIDER = re.compile(r"\b(?:" + "|".join(RECONSIDER_MARKERS) + r")\b", re.IGNORECASE)

# ProSR A.3's lexicon classes: relative relations, ordinal positions, directional and viewpoint cues, coordinate-
# or distance-like expressions. Longer expressions come first so "in front of" is one match, not "front".
_NUMBER = r"-?\d+(?:\.\d+)?"
SPATIAL_PATTERNS = (
    rf"\(\s*{_NUMBER}\s*,\s*{_NUMBER}(?:\s*,\s*{_NUMBER})?\s*\)",  # (x, y) and (x, y, z)
    rf"{_NUMBER}\s*(?:px|pixels?|m|meters?|metres?|cm|centimet(?:er|re)s?|mm|km|ft|feet|foot|inch(?:es)?"
    r"|degrees?)\b",
    rf"{_NUMBER}\s*°",
    rf"\b(?:row|column|col)\s*#?\s*{_NUMBER}",
    r"\bin front of\b", r"\bon top of\b", r"\bnext to\b", r"\bclose to\b", r"\bfar from\b",
    r"\b(?:left|right|above|below|front|behind|beside|besides|between|under|underneath|beneath|over|atop|adjacent"
    r"|opposite|inside|outside|near|nearer|nearest|far|farther|farthest|closer|closest|top|bottom|upper|lower"
    r"|leftmost|rightmost|topmost|bottommost|uppermost|lowermost|frontmost|backmost|north|south|east|west"
    r"|northeast|northwest|southeast|southwest|clockwise|counterclockwise|anticlockwise|viewpoint|perspective"
    r"|camera|facing|distance|horizontal|horizontally|vertical|vertically|diagonal|diagonally|foreground"
    r"|background|row|column|x-axis|y-axis|z-axis)\b",
)
_SPATIAL = re.compile("|".join(f"(?:{p})" for p in SPATIAL_PATTERNS), re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9]+(?:['’-][a-z0-9]+)*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_BOX_LINE = re.compile(r"^\s*\{.*\}\s*$")


@dataclasses.dataclass(frozen=True)
class SFTFilterConfig:
    """The filters' thresholds (module docstring: what each means and why these numbers)."""

    reference_key: str = THINK_BOXES.reference_key
    max_reconsider: int = 2
    min_anchor_ratio: float = 0.03
    min_words: int = 10
    max_words: int = 400
    max_repeated_sentences: int = 0
    repeat_ngram: int = 6
    max_ngram_count: int = 2
    min_accuracy: float = 1.0

    def __post_init__(self):
        require("reference_key", self.reference_key, bool(self.reference_key.strip()), "be a non-empty string")
        check_at_least(self, max_reconsider=0, min_words=0, max_repeated_sentences=0, repeat_ngram=1,
                       max_ngram_count=1)
        check_range(self, "max_words", self.min_words)
        check_range(self, "min_anchor_ratio", 0, 1)
        check_range(self, "min_accuracy", 0, 1)


@dataclasses.dataclass(frozen=True)
class TraceStats:
    words: int
    reconsider: int
    anchors: int
    repeated_sentences: int
    max_ngram_count: int

    @property
    def anchor_ratio(self) -> float:
        return self.anchors / self.words if self.words else 0.0


def reasoning_text(completion: str) -> str:
    """What the filters read (module docstring)."""
    open_at = completion.find("<think>")
    start = open_at + len("<think>") if open_at >= 0 else 0
    end = completion.find("</think>", start)
    span = completion[start: end if end >= 0 else len(completion)]
    return "\n".join(line for line in span.splitlines() if not _BOX_LINE.match(line))


def trace_stats(text: str, repeat_ngram: int = SFTFilterConfig.repeat_ngram) -> TraceStats:
    words = [w.lower() for w in _WORD.findall(text)]
    sentences = [" ".join(_WORD.findall(s.lower())) for s in _SENTENCE_END.split(text)]
    sentences = [s for s in sentences if s]
    grams = Counter(tuple(words[i: i + repeat_ngram]) for i in range(len(words) - repeat_ngram + 1))
    return TraceStats(
        words=len(words),
        reconsider=len(_RECONSIDER.findall(text)),
        anchors=len(_SPATIAL.findall(text)),
        repeated_sentences=len(sentences) - len(set(sentences)),
        max_ngram_count=max(grams.values(), default=0),
    )


def failed_filters(stats: TraceStats, accuracy: float, cfg: SFTFilterConfig = SFTFilterConfig()) -> list[str]:
    """The filters (FILTERS order) a reference with these statistics and answer accuracy fails."""
    failed = []
    if accuracy < cfg.min_accuracy:
        failed.append("answer")
    if stats.reconsider > cfg.max_reconsider:
        failed.append("reconsider")
    if stats.anchor_ratio < cfg.min_anchor_ratio:
        failed.append("anchor")
    if not cfg.min_words <= stats.words <= cfg.max_words:
        failed.append("length")
    if stats.repeated_sentences > cfg.max_repeated_sentences or stats.max_ngram_count > cfg.max_ngram_count:
        failed.append("repetition")
    return failed


AccuracyJudge = Callable[[Sequence[Sample], Sequence[str]], Sequence[float]]


def filter_samples(samples: Sequence[Sample], judge: AccuracyJudge,
                   cfg: SFTFilterConfig = SFTFilterConfig()) -> tuple[list[Sample], dict[str, Any]]:
    """The samples whose reference passes every filter (input order), and a report: totals and the number removed
    by each filter (a sample failing several counts under each). `judge(samples, completions)` gives each answer's
    accuracy in [0, 1]; it is asked once, for every sample that has a reference."""
    with_ref = [i for i, s in enumerate(samples) if cfg.reference_key in s.reference]
    judged = [samples[i] for i in with_ref]
    accuracy = dict(zip(with_ref, judge(judged, [s.reference[cfg.reference_key] for s in judged]) if judged else []))
    removed = dict.fromkeys(FILTERS, 0)
    kept = []
    for i, s in enumerate(samples):
        if i not in accuracy:
            failed = ["no_reference"]
        else:
            stats = trace_stats(reasoning_text(s.reference[cfg.reference_key]), cfg.repeat_ngram)
            failed = failed_filters(stats, accuracy[i], cfg)
        for name in failed:
            removed[name] += 1
        if not failed:
            kept.append(s)
    report = {"samples": len(samples), "kept": len(kept), "removed": len(samples) - len(kept),
              "removed_by_filter": removed, "config": dataclasses.asdict(cfg)}
    return kept, report
