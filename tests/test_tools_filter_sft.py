"""`spatial-jax filter-sft`: ProSR's SFT data filters, each threshold just inside and just outside, the per-filter
counts, and the command end to end with the answer judged by the method's reward."""

from __future__ import annotations

import json

import pytest

from spatial_jax.cli import main
from spatial_jax.data.jsonl import read_jsonl, write_jsonl
from spatial_jax.data.sample import Sample
from spatial_jax.data.sft_filters import (
    FILTERS,
    SFTFilterConfig,
    failed_filters,
    filter_samples,
    reasoning_text,
    trace_stats,
)

CFG = SFTFilterConfig()


def _words(n: int, start: int = 0) -> str:
    """n distinct filler words: no spatial word, no marker, no repeated n-gram."""
    return " ".join(f"w{i}" for i in range(start, start + n))


def _failed(text: str, accuracy: float = 1.0, cfg: SFTFilterConfig = CFG) -> list[str]:
    return failed_filters(trace_stats(text, cfg.repeat_ngram), accuracy, cfg)


def test_a_clean_trace_passes_everything():
    text = "The cup is left of the plate. From the camera viewpoint the plate is in front of the vase."
    assert _failed(text) == []


def test_reconsider_threshold():
    base = "left right above below " + _words(40)
    two = base + " Wait, w100. Let me re-examine w101."
    three = two + " Hmmm, w102."
    assert trace_stats(two).reconsider == 2 and "reconsider" not in _failed(two)
    assert trace_stats(three).reconsider == 3 and "reconsider" in _failed(three)
    for marker in ("let me reconsider", "let me rethink", "let me re-think", "let me think again",
                   "let me re-evaluate", "let me revisit", "on second thought", "let me check", "let me look at",
                   "hmm", "WAIT"):
        assert trace_stats(f"w1 {marker} w2").reconsider == 1, marker
    assert trace_stats("the waiter is awaited").reconsider == 0  # whole words only


def test_anchor_ratio_threshold():
    # 3 matches: "left", "in front of" (one expression) and "(10, 20)" (one coordinate pair).
    anchors = "left in front of (10, 20)"
    at = anchors + " " + _words(100 - 6)  # 6 words in the anchors: 3 / 100 = 0.03
    below = anchors + " " + _words(101 - 6)  # 3 / 101
    assert trace_stats(at).words == 100 and trace_stats(at).anchors == 3
    assert "anchor" not in _failed(at) and "anchor" in _failed(below)
    for expr in ("12 px", "3.5 meters", "90°", "45 degrees", "row 2", "column 3", "leftmost", "clockwise",
                 "north", "perspective", "facing", "on top of", "next to", "(1, 2, 3)"):
        assert trace_stats(f"w1 {expr} w2").anchors == 1, expr


def test_length_thresholds():
    spatial = "left right above below "  # enough anchors for any length here
    assert "length" not in _failed(spatial + _words(6))  # 10 words
    assert "length" in _failed(spatial + _words(5))  # 9
    assert "length" not in _failed(spatial + _words(396))  # 400
    assert "length" in _failed(spatial + _words(397))  # 401


def test_repetition_thresholds():
    sentence = "The cup is left of the plate."
    assert "repetition" not in _failed(f"{sentence} Then w1 w2 w3 w4 behind.")
    repeated = f"{sentence} w1 w2 w3 right. {sentence.upper()}"  # one sentence repeated (case aside)
    assert trace_stats(repeated).repeated_sentences == 1 and "repetition" in _failed(repeated)
    six = "a b c d e f"  # a word 6-gram, in sentences that differ
    twice = f"left {six} w1. {six} w2. w3 w4 w5 w6"
    thrice = f"left {six} w1. {six} w2. {six} w3."
    assert trace_stats(twice).max_ngram_count == 2 and "repetition" not in _failed(twice)
    assert trace_stats(thrice).max_ngram_count == 3 and "repetition" in _failed(thrice)


def test_answer_threshold():
    text = "The cup is left of the plate and right of the vase."
    assert "answer" not in _failed(text, 1.0) and "answer" in _failed(text, 0.999)
    half = SFTFilterConfig(min_accuracy=0.5)
    assert "answer" not in _failed(text, 0.5, half) and "answer" in _failed(text, 0.49, half)


def test_reasoning_text_skips_box_lines_and_the_answer():
    completion = ('{"bbox_2d": [1, 2, 3, 4], "label": "cup"}\nWe look.\n  {"bbox_2d": [5, 6, 7, 8], "label": "x"}\n'
                  "The cup is left.\n</think>\nB")
    assert reasoning_text(completion) == "We look.\nThe cup is left."
    assert reasoning_text("<observe>o</observe><think>inside</think><answer>(A) x</answer>") == "inside"
    assert reasoning_text("no tags at all") == "no tags at all"


def _sample(i: int, completion: str | None, key: str = "spatialcore") -> Sample:
    return Sample(id=f"s{i}", image=f"images/{i}.png", question="Where is the cup?", options=("left", "right"),
                  answer="A", reference={} if completion is None else {key: completion})


GOOD = ('{"bbox_2d": [10, 20, 300, 400], "label": "cup"}\nWe have the positions of the relevant objects. '
        "Let's think.\nThe cup is centred at (155, 210), left of the plate at (700, 300), so it is on the left.\n"
        "</think>\nA")


def test_counts_per_filter_and_kept():
    bad_everything = "wait wait wait hmm. wait wait wait hmm."
    samples = [_sample(0, GOOD), _sample(1, GOOD.replace("\nA", "\nB")), _sample(2, bad_everything),
               _sample(3, None), _sample(4, GOOD)]
    judged = []

    def judge(ss, completions):
        judged.extend(s.id for s in ss)
        return [0.0 if c.endswith("B") or s.id == "s2" else 1.0 for s, c in zip(ss, completions)]

    kept, report = filter_samples(samples, judge)
    assert [s.id for s in kept] == ["s0", "s4"] and judged == ["s0", "s1", "s2", "s4"]
    assert report["samples"] == 5 and report["kept"] == 2 and report["removed"] == 3
    assert report["removed_by_filter"] == {"no_reference": 1, "answer": 2, "reconsider": 1, "anchor": 1,
                                           "length": 1, "repetition": 1}
    assert set(report["removed_by_filter"]) == set(FILTERS)


def test_config_is_validated():
    with pytest.raises(ValueError, match="max_words must be >= 10"):
        SFTFilterConfig(max_words=5)
    with pytest.raises(ValueError, match="min_anchor_ratio must lie in"):
        SFTFilterConfig(min_anchor_ratio=-0.1)


def test_cli_end_to_end_with_the_method_judge(tmp_path, capsys):
    data = tmp_path / "data" / "in.jsonl"
    write_jsonl([_sample(0, GOOD), _sample(1, GOOD.replace("\nA", "\nB")), _sample(2, GOOD, key="other")], data)
    out = tmp_path / "out.jsonl"
    assert main(["filter-sft", "--input", str(data), "--output", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s.id for s in read_jsonl(out, check_images=False)] == ["s0"]
    assert report["removed_by_filter"]["answer"] == 1 and report["removed_by_filter"]["no_reference"] == 1
    assert main(["filter-sft", "--input", str(data), "--output", str(out), "--method-key", "other",
                 "--report", str(tmp_path / "r.json")]) == 2
    assert "no method writes reference key 'other'" in capsys.readouterr().err
    assert main(["filter-sft", "--input", str(data), "--output", str(out), "min_words=50",
                 "--report", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["removed_by_filter"]["length"] == 2
    assert main(["filter-sft", "--input", str(data), "--output", str(out), "max_words=-1"]) == 2
    assert "max_words must be >=" in capsys.readouterr().err
