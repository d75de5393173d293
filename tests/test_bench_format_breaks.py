"""benchmarks/papers/format_breaks.py's parts that decide a measurement: the search for the breaking token and the
kinds."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "papers"))

import format_breaks as fb  # noqa: E402


def test_the_search_finds_each_rows_first_unsound_prefix_in_log_rounds():
    breaks, lengths = [0, 5, 37, 99], [1, 40, 38, 100]  # a prefix of k tokens is sound while k <= the break
    calls = []

    def sound(ks):
        calls.append(ks)
        return [k <= b for k, b in zip(ks, breaks)]

    assert fb.first_break(sound, lengths) == breaks
    assert len(calls) <= 7  # ceil(log2(100)) rounds, every row in each


def test_token_kinds():
    names = fb.format_names(['<observe>\nx\n</observe>\n<scene>\n{"objects": [{"id": "a.1", "bbox": [1, 2]}]}'])
    assert {"observe", "scene", "objects", "id", "bbox"} <= names
    assert fb.token_kind("\ufffd", names) == "byte fragment"
    for text in ('"}', " [", "</", "box", "scene"):
        assert fb.token_kind(text, names) == "format word", text
    for text in (" square", "12", " left"):
        assert fb.token_kind(text, names) == "other text", text
