"""Fuzzing the input side: Hypothesis writes whole JSONL files of rollouts (and of dataset rows) with hostile
structure mixed in, and the readers and scorers run on each file in one call.

Rollout files, 2,500 lines per method: no exception escapes `score_rollouts`; every non-blank line is scored or
reported malformed, once, with its line number (no scorer fails on a record Rollout.from_json accepted); a line built
from valid fields is never called malformed and a line with an invalid field always is; every reward and advantage
is finite and each reward lies in its method's documented bounds. Dataset files: `read_jsonl` returns every row, or
raises a short DatasetError that names the first bad line.
"""

import functools
import io
import json
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st

from spatial_jax.data.jsonl import read_jsonl
from spatial_jax.data.sample import DatasetError
from spatial_jax.eval.offline_score import score_rollouts
from spatial_jax.methods import get_method
from spatial_jax.testing.rollouts import tokenize

LINES_PER_FILE = 100
FILES_PER_METHOD = 25  # 4 methods x 25 files x 100 lines = 10,000 lines
# SPEC 2 (SpatialCORE, format term floored at -0.2), SPEC 3 (ProSR: 1 + 0.2 - 0.1 - 0.1), SPEC 4 (SpatialThinker),
# rewards/allospatial.py's docstring (HGTR with the default weights).
BOUNDS = {"spatialcore": (-1.2, 2.25), "prosr": (-0.2, 1.2), "spatialthinker": (0.0, 1.0),
          "allospatial": (-0.25, 0.82)}
SLACK = 1e-9

# Shrinking a file of 100 hostile lines takes many minutes and the falsifying example runs to megabytes, so neither
# is done: each assertion names its line instead. No example database either (nothing to replay without shrinking).
# derandomize: CI draws the same examples every run, so a run lands or fails for the code, not for the draw
FUZZ_SETTINGS = settings(max_examples=FILES_PER_METHOD, deadline=None, database=None, verbosity=Verbosity.quiet,
                         derandomize=True,
                         phases=(Phase.explicit, Phase.generate),
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                HealthCheck.large_base_example])

MISSING = object()
BAD_BYTES = "@@BAD-BYTES@@"  # replaced by invalid UTF-8 after serialising

GIANT = "x" * 50_000
HUGE_INT = 10**4000  # JSON allows it; under Python's 4,300-digit limit, so it parses and reaches the fields
COMMON = ["", " ", "0123456789", "\u2028", "\ud800", "\x00", "é漢字🤗", GIANT, BAD_BYTES, "\n", "B", "</think>"]
# Numbers past Python's 4,300-digit int limit inside the text: 4,400 digit tokens each, so drawn rarely (run time).
LONG_DIGITS = "9" * 4400
SC_BOXES = [
    '{"bbox_2d": [100, 200, 300, 400], "label": "red car"}\n',
    '{"bbox_2d": [0, 0, 0, 0], "label": "man"}\n',
    '{"bbox_2d": [500, 500, 100, 100], "label": "tree"}\n',
    '{"bbox_2d": [1, 2, 99999999999999999999, 4], "label": "dog"}\n',
    '{"bbox_2d": [-5, 3, 1e999, 4], "label": "x"}\n',
    '{"bbox_2d": [100, 200, 300, 400], "label": ""}\n',
    '{"bbox_2d": [1, 2, 3, 4, 5], "label": "red car"}\n',
]
SC_LEAD = "We have the positions of the relevant objects. Let's think.\n"
ST_SCENES = [
    "<scene>" + json.dumps({"objects": [{"id": "car.1", "bbox": [10, 20, 30, 40]},
                                        {"id": "tree.2", "bbox": [30, 5, 60, 45]}],
                            "relationships": [{"subject": "car.1", "predicate": "left of", "object": "tree.2"}]})
    + "</scene>",
    '<scene>{"objects": [{"id": "x.1", "bbox": [1e308, -1e308, 1e308, 1e308]}], "relationships": []}</scene>',
    '<scene>{"objects": [{"id": "x.1", "bbox": [5, 5, 5, 5]}, {"id": "x.1", "bbox": [9, 9, 1, 1]}]}</scene>',
    "<scene>{bad json</scene>", "<scene>" + "[" * 5000 + "</scene>",
]
ALLO_STEPS = [
    "Step2.1: world map\n", "Step3.1: view\n", "Step4: Cross-Validation\n",
    '<tool_call>{"name": "world2mind", "arguments": {"image": 1}}</tool_call>',
    '<tool_call>{"name": "view_image", "arguments": {}}</tool_call>', "<tool_call>{not json}</tool_call>",
    '<tool_call>{"name": "world2mind", "arguments": ' + "[" * 3000 + "}</tool_call>",
    "<tool_response>Step5: Final Answer <Answer>A</Answer></tool_response>",
]
FRAGMENTS = {
    "spatialcore": SC_BOXES + [SC_LEAD, "the red car is left of the tree. ", "</think>\n", "\nA", "The answer is C.",
                               "<think>"],
    "prosr": ["the car is left. ", "wait, let me reconsider. " * 3, "</think>\nB", "</think>\nA", "hmm " * 40,
              "</think>\n</think>\nC"],
    "spatialthinker": ST_SCENES + ["<observe>a car and a tree</observe>", "<think>the car is left</think>",
                                   "<answer>(B) behind</answer>", "<answer>b</answer>", "<answer></answer>"],
    "allospatial": ALLO_STEPS + ["Step1: Visual Clues\n", "Step5: Final Answer\n", "<Answer>B</Answer>",
                                 "<Answer>3.5 m</Answer>", "<Answer>1e400</Answer>", "<Answer>nan</Answer>",
                                 "<Answer>-0</Answer>"],
}
LONG_NUMBERS = ['{"bbox_2d": [' + LONG_DIGITS + ', 1, 2, 3], "label": "car"}\n', f"<Answer>{LONG_DIGITS}</Answer>",
                '<scene>{"objects": [{"id": "y.1", "bbox": [' + LONG_DIGITS + ', 0, 1, 1]}]}</scene>']
ALL_FRAGMENTS = [f for frags in FRAGMENTS.values() for f in frags] + COMMON
# Completions in each method's own format, so the deep branches run (matched boxes, S after a correct answer,
# accuracy past the structure gate, both ProSR terms); the hostile pieces ride inside them.
TEMPLATES = {
    "spatialcore": st.builds(
        lambda boxes, words, letter: "".join(boxes) + SC_LEAD + words + "\n</think>\n" + letter,
        st.lists(st.sampled_from(SC_BOXES), max_size=4),
        st.sampled_from(["the red car is left of the tree.", "", "wait " * 30]), st.sampled_from("ABCDZ")),
    "prosr": st.builds(
        lambda words, letter: words + "\n</think>\n" + letter,
        st.sampled_from(["the red car is left of the tree and so on. " * k for k in (1, 2, 5)] + ["hmm " * 20]),
        st.sampled_from("ABCD")),
    "spatialthinker": st.builds(
        lambda scene, answer: f"<observe>a car</observe>{scene}<think>it is left</think><answer>{answer}</answer>",
        st.sampled_from(ST_SCENES), st.sampled_from(["(B) b", "B", "(A) a", "b", ""])),
    "allospatial": st.builds(
        lambda steps, answer: f"Step1: Visual Clues\n{''.join(steps)}Step5: Final Answer\n<Answer>{answer}</Answer>",
        st.lists(st.sampled_from(ALLO_STEPS), max_size=5),
        st.sampled_from(["B", "A", "3.5 m", "1e400", "nan", "9" * 400, "0"])),
}


NAN, INF = float("nan"), float("inf")
_BOX = {"bbox_2d": [100, 200, 300, 400], "label": "red car", "validity": 0.9}
_BOXES = [_BOX, {"bbox_2d": [5, 5, 5, 5], "label": "man"}, {"bbox_2d": [500, 500, 100, 100], "label": "tree"},
          {"bbox": [0, 0, 1e300, 1e300], "label": "", "validity": 0}, {"bbox_2d": [-50, -5, 0, 0], "label": "dog"},
          {"bbox_2d": [0, 0, 1000, 1000], "label": "x", "validity": 1}]
_BAD_BOXES = [{"label": "car"}, {"bbox_2d": [1, 2, 3], "label": "car"}, {"bbox_2d": [NAN, 2, 3, 4], "label": "car"},
              {"bbox_2d": ["1", 2, 3, 4], "label": "car"}, {"bbox_2d": [1, 2, HUGE_INT, 4], "label": "y"},
              {**_BOX, "validity": 1.5}, {**_BOX, "validity": -0.1}, {**_BOX, "validity": NAN}, {**_BOX, "label": 5},
              "box"]
_OBJ = {"id": "car.1", "bbox": [10, 20, 30, 40]}
_NEST = {"a": 1}
for _ in range(60):
    _NEST = {"a": _NEST}
# Each field: (values a record may hold, values that make it malformed). MISSING leaves the key out.
FIELDS = {
    "id": (["tracked", MISSING, None, 7], [[1], {"a": 1}, True, 1.5]),
    "question": ([MISSING, "", "Where is the red car?", "Image size: (64 x 48). Where?", "Image size: (0 x 0)",
                  "Image size: (99999999999999999999 x 1)", GIANT[:20_000], BAD_BYTES], [5, None, ["q"]]),
    "options": ([MISSING, None, [], ["a", "b", "c", "d"], ["a", "b", "c", "d"], [f"o{i}" for i in range(30)], [""],
                 ["red car", GIANT]], ["A,B", [1, 2], {"a": 1}]),
    "answer": ([MISSING, "B", "B", "(B) x", "b", "B. behind", 0, 1, 29, -1, 1e308, -0.0, "12.5", "3.5", "nan", "1 m",
                None, "Z", "", "9" * 4000], [[1], {"x": 1}, True, NAN, INF, HUGE_INT]),
    "gt_boxes": ([MISSING, None, [], _BOXES, _BOXES[:2], _BOXES[1:2] * 300],
                 [[_BOX, b] for b in _BAD_BOXES] + ["boxes", _BOX]),
    "scene": ([MISSING, None, {}, _NEST, {"objects": [_OBJ], "relationships": []},
               {"objects": [_OBJ, {"id": "tree.2", "bbox": [1, 1, 1, 1]}],
                "relationships": [{"subject": "car.1", "predicate": "left of", "object": "tree.2"}]},
               {"objects": [_OBJ] * 200, "relationships": [{}] * 50},
               {"objects": [{"id": 5, "bbox": [1e308, 1e308, -1e308, 1]}]}],
              ["scene", [_OBJ], {"objects": "x"}, {"objects": [1]}, {"objects": [{"bbox": [NAN, 1, 2, 3]}]},
               {"objects": [{"id": "a.1", "bbox": [HUGE_INT, 0, 1, 1]}]}, {"objects": [{"id": "a.1"}]},
               {"relationships": {}}]),
    "image_size": ([MISSING, None, [64, 48], [1, 1], [1e308, 1e308], [1.5, 2.5]],
                   [[0, 5], [64], "64x48", [True, 5], [NAN, 5], [INF, 5], [-1, 5], [HUGE_INT, 5]]),
    "num_generated_tokens": ([MISSING, None, 0, 2000, 4001, 2**63 - 1], [-1, 1.5, "5", True, NAN, 2**63, HUGE_INT]),
    "group": ([MISSING, None, "g1", "g2", 7], [[1], {"a": 1}, 1.5, True]),
}
COMPLETION_FAULTS = [MISSING, 5, None, ["text"]]
TRACE_EDITS = ["none", "none", "absent", "zero_width", "hf_repeat", "tiny_negative", "gaps", "null"]
BAD_TRACE_EDITS = ["past_end", "whole", "overlap", "reverse", "negative", "nan", "inf", "huge", "huge_int", "string",
                   "bool", "mismatch", "offset_strings", "offset_triples", "offset_floats", "offsets_only", "not_list"]
FAULTS = sorted(k for k, (_, bad) in FIELDS.items() if bad) + ["completion", "trace", "blank", "blank_trace"]


def trace_ok(ent, off, n) -> bool:
    """The trace rules of records.py, restated from the README and the issue: see `_trace` there."""
    if ent is MISSING and off is MISSING:
        return True
    if not isinstance(ent, list) or not isinstance(off, list) or len(ent) != len(off):
        return False
    for e in ent:
        if e is None:
            continue
        if isinstance(e, bool) or not isinstance(e, (int, float)):
            return False
        if isinstance(e, int) and abs(e) > 1e6:
            return False
        if not (math.isfinite(e) and -1e-4 <= e <= 1e6):
            return False
    prev = None
    for o in off:
        if not (isinstance(o, list) and len(o) == 2 and all(type(c) is int for c in o) and 0 <= o[0] <= o[1] <= n):
            return False
        if prev is not None and o[0] < prev[1] and not (o == prev and o[1] - o[0] == 1):
            return False
        prev = o
    return True


def make_trace(completion: str, edit: str, rng: np.random.Generator):
    """(entropies, offsets) for `completion`, a tokenizer's trace changed by `edit`."""
    off = [list(o) for o in tokenize(completion)]
    ent = rng.choice([0.0, 0.01, 1.0, math.log(10), 4.0, 11.9], size=len(off)).tolist()
    n = len(completion)
    k = int(rng.integers(0, max(1, len(off))))
    if edit == "absent":
        return MISSING, MISSING
    if edit == "zero_width" and off:
        off.insert(k, [off[k][0], off[k][0]])
        ent.insert(k, 0.5)
    elif edit == "hf_repeat":
        ones = [i for i, (s, e) in enumerate(off) if e - s == 1]
        if ones:
            off.insert(ones[0], list(off[ones[0]]))
            ent.insert(ones[0], 0.2)
    elif edit == "tiny_negative" and ent:
        ent[k] = -5e-5
    elif edit == "gaps":
        off, ent = off[::2], ent[::2]
    elif edit == "null" and ent:
        ent[k] = None
    elif edit == "past_end":
        off.append([n, n + 5])
        ent.append(1.0)
    elif edit == "whole":
        off = [[0, n] for _ in off]
    elif edit == "overlap" and len(off) >= 2:
        off[k] = [max(0, off[k][0] - 1), off[k][1] + 1]
    elif edit == "reverse":
        off = off[::-1]
    elif edit in ("negative", "nan", "inf", "huge", "huge_int", "string", "bool") and ent:
        ent[k] = {"negative": -3.0, "nan": NAN, "inf": INF, "huge": 1e7, "huge_int": HUGE_INT, "string": "0.5",
                  "bool": True}[edit]
    elif edit == "mismatch" and ent:
        ent.pop()
    elif edit == "offset_strings" and off:
        off[k] = [str(c) for c in off[k]]
    elif edit == "offset_triples" and off:
        off[k] = off[k] + [0]
    elif edit == "offset_floats" and off:
        off[k] = [float(c) for c in off[k]]
    elif edit == "offsets_only":
        return MISSING, off
    elif edit == "not_list":
        return ent, "0,1"
    return ent, off


@functools.cache
def _text(method):
    """The completion text strategy, built once per method (building and validating it per record cost a fifth of
    the run)."""
    frags = FRAGMENTS[method] * 3 + ALL_FRAGMENTS
    free = st.lists(st.one_of(st.sampled_from(frags), st.text(max_size=12)), max_size=10).map("".join)
    return st.one_of(free, TEMPLATES[method], st.one_of(*TEMPLATES.values()))


@st.composite
def record(draw, method):
    """A rollout record (a dict) and whether it is valid: about half are, the rest hold one or two faults."""
    text = _text(method)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    faulty = draw(st.sets(st.sampled_from(FAULTS), max_size=2))
    obj = {}
    completion = draw(text) + (str(rng.choice(LONG_NUMBERS)) if rng.random() < 0.005 else "")
    if "completion" in faulty:
        value = draw(st.sampled_from(COMPLETION_FAULTS))
        if value is not MISSING:
            obj["completion"] = value
    else:
        obj["completion"] = completion
    for key, (good, bad) in FIELDS.items():
        value = draw(st.sampled_from(bad if key in faulty else good))
        if value is not MISSING:
            obj[key] = value
    ent, off = make_trace(completion, draw(st.sampled_from(BAD_TRACE_EDITS if "trace" in faulty else TRACE_EDITS)),
                          rng)
    if "completion" in faulty:  # a trace without a text to measure it against says nothing either way
        ent = off = MISSING
    ok = not (faulty - {"trace", "blank_trace"}) and trace_ok(ent, off, len(completion))
    for key, value in (("token_entropies", ent), ("token_offsets", off)):
        if value is not MISSING:
            obj[key] = value
    if "blank" in faulty:
        obj["blank"] = draw(st.sampled_from([{"token_entropies": []}, "blank", {"completion": 5}]))
    elif method == "prosr" or rng.random() < 0.25:
        b_completion = draw(text)
        edit = draw(st.sampled_from(BAD_TRACE_EDITS if "blank_trace" in faulty else TRACE_EDITS))
        b_ent, b_off = make_trace(b_completion, edit, rng)
        ok &= trace_ok(b_ent, b_off, len(b_completion))
        obj["blank"] = {"completion": b_completion}
        for key, value in (("token_entropies", b_ent), ("token_offsets", b_off)):
            if value is not MISSING:
                obj["blank"][key] = value
    return obj, ok


# Whole lines that are no record at all; "[bom]" is a record led by a byte-order mark (valid on line 1 only).
HOSTILE = [b"{not json", b"[" * 100_000 + b"]" * 100_000, b'{"completion": ' + b"9" * 5000 + b"}", b"NaN",
           b"Infinity", b"-Infinity", b"[1, 2]", b'"text"', b"null", b"123", b"{}",
           b'{"completion": "x", "completion": 5}', b"\xff\xfe" + b'{"completion": "x"}', b"\x00",
           b'{"completion": "' + b"y" * 100_000, b'{"completion": "x"}}', b"[bom]"]
BLANK_LINES = [b"", b"   ", b"\t"]


@st.composite
def line(draw, method):
    """(bytes of one line without its newline, label): label "valid", "invalid", "blank", or "unknown" (invalid
    UTF-8 or unpaired surrogates placed inside strings: replacement characters change lengths, so offsets may or may
    not still fit)."""
    kind = draw(st.sampled_from(["record"] * 8 + ["hostile", "blank"]))
    if kind == "blank":
        return draw(st.sampled_from(BLANK_LINES)), "blank"
    if kind == "hostile":
        return draw(st.sampled_from(HOSTILE)), "invalid"
    obj, ok = draw(record(method))
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    label = "valid" if ok else "invalid"
    raw = text.encode("utf-8", "surrogatepass")
    if BAD_BYTES in text or raw != text.encode("utf-8", "replace"):
        label = "unknown" if ok else label
    return raw.replace(BAD_BYTES.encode(), b"\xff\xfe\xc3"), label


def write_file(path, lines, bom: bool):
    """Writes the lines; a "tracked" id becomes L<line number>. Returns [(line number, label, id tracked, bytes)]."""
    out, labels = [], []
    for number, (raw, label) in enumerate(lines, start=1):
        tracked = b'"tracked"' in raw
        raw = raw.replace(b'"tracked"', f'"L{number}"'.encode())
        if raw == b"[bom]":
            raw = b"\xef\xbb\xbf" + json.dumps({"id": f"L{number}", "completion": "x"}).encode()
            label, tracked = ("valid" if number == 1 and not bom else "invalid"), True
        out.append(raw)
        labels.append((number, label, tracked, raw))
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + b"\n".join(out) + b"\n")
    return labels


def check_scored(method, rows, summary, err, path, labels):
    lo, hi = BOUNDS[method]
    for row in rows:
        r = row["reward"]
        assert isinstance(r, float) and lo - SLACK <= r <= hi + SLACK, (method, row)
        assert all(v is None or math.isfinite(v) for v in row.values() if isinstance(v, float)), row
        assert "advantage" not in row or math.isfinite(row["advantage"]), row
    reported: dict[int, str] = {}
    prefix = re.compile(re.escape(str(path)) + r":(\d+): (.*)")
    for message in err.splitlines():
        m = prefix.fullmatch(message)
        assert m, f"not a path:line report: {message[:300]!r}"
        number = int(m.group(1))
        assert number not in reported, f"line {number} reported twice"
        reported[number] = m.group(2)
    # Rollout.from_json checks every field a scorer reads, so a scorer never fails on a record it was given.
    failures = [f"{n}: {what[:300]}" for n, what in reported.items() if what.startswith("scoring failed")]
    assert not failures and "scoring failures" not in summary, failures
    assert f"malformed lines {len(reported)}" in summary
    nonblank = {n for n, label, *_ in labels if label != "blank"}
    assert set(reported) <= nonblank and len(rows) + len(reported) == len(nonblank)
    ids = {row["id"] for row in rows}
    for n, label, tracked, raw in labels:
        if label == "valid":
            assert n not in reported, f"valid line {n} called malformed: {reported[n][:300]}\n{raw[:2000]!r}"
            assert not tracked or f"L{n}" in ids, f"valid line {n} was not scored: {raw[:2000]!r}"
        elif label == "invalid":
            assert n in reported, f"invalid line {n} was not reported: {raw[:2000]!r}"


@pytest.mark.parametrize("method", sorted(BOUNDS))
@pytest.mark.slow
def test_scorers_survive_fuzzed_rollout_files(method, tmp_path):
    scorer, path, seen = get_method(method), tmp_path / "rollouts.jsonl", []
    cfg = scorer.config()

    @FUZZ_SETTINGS
    @given(lines=st.lists(line(method), min_size=LINES_PER_FILE, max_size=LINES_PER_FILE), bom=st.booleans())
    def run(lines, bom):
        labels = write_file(path, lines, bom)
        err = io.StringIO()
        rows, summary = score_rollouts(scorer, cfg, str(path), "default", err)
        check_scored(method, rows, summary, err.getvalue(), path, labels)
        seen.append((len(lines), len(rows)))

    run()
    assert sum(n for n, _ in seen) >= FILES_PER_METHOD * LINES_PER_FILE
    assert sum(n for _, n in seen) >= 0.2 * FILES_PER_METHOD * LINES_PER_FILE, "the generator lost its valid records"


_ROW_BOX = {"bbox_2d": [1, 2, 30, 40], "label": "red car", "validity": 0.5}
# Dataset row fields: (values a row may hold, values that make it invalid); a dataset names every box's label.
ROW_FIELDS = {
    "id": (["tracked"], [MISSING, [1], True, 1.5]),
    "question": (["Where?", "", GIANT[:5000], "left\u2028right"], [MISSING, 5, None, BAD_BYTES]),
    "category": ([MISSING, "size"], [5]),
    "image_size": FIELDS["image_size"],
    "gt_boxes": ([MISSING, [], [_ROW_BOX], [_ROW_BOX, {**_ROW_BOX, "label": "tree"}]],
                 [[_ROW_BOX, b] for b in _BAD_BOXES] + [[{**_ROW_BOX, "label": " "}], "boxes"]),
    "scene": FIELDS["scene"],
    "reference": ([MISSING, {"spatialcore": "B"}], [{"a": 5}, "ref"]),
    "meta": ([MISSING, {"x": [1, 2]}], [[1]]),
}
# The gold by kind of question: (options, answer_type, answer) each (valid, invalid).
GOLDS = {
    # no `[]` among the bad options: a row without options is read as a numeric question, valid with answer 2
    "choice": {"options": ([["a", "b", "c"]], ["a,b", [1], [f"o{i}" for i in range(27)]]),
               "answer_type": ([MISSING, "choice"], ["bogus", 5]),
               "answer": (["B", "(C) c", 0, 2, "A. a"], [MISSING, "Z", 3, -1, "Because", None, HUGE_INT, [1], NAN])},
    "number": {"options": ([MISSING, []], []),
               "answer_type": ([MISSING, "number"], ["choice", "bogus"]),
               "answer": ([3.0, "12.5", 7, 1e308, -2, "1e3"], ["nan", NAN, INF, HUGE_INT, 0, "abc", None, [1]])},
}
# Image paths: fine, fine unless the file is checked, or never fine.
IMAGES = (["img.png"], ["missing.png", "x" * 5000, "a\x00b", "/", ""], [5, None, MISSING])


@st.composite
def dataset_line(draw):
    """(bytes, label) of a dataset row with at most one fault, a hostile line or a blank one; the label of a row
    whose only fault is an image path that does not exist is "unchecked" (valid unless images are checked)."""
    kind = draw(st.sampled_from(["row"] * 20 + ["hostile", "blank"]))
    if kind == "blank":
        return draw(st.sampled_from(BLANK_LINES)), "blank"
    if kind == "hostile":
        return draw(st.sampled_from(HOSTILE[:-1])), "invalid"
    gold = GOLDS[draw(st.sampled_from(sorted(GOLDS)))]
    fields = {**ROW_FIELDS, **gold}
    # Reading stops at the first bad row, so faults are rare enough that most rows of a file are read; the gold,
    # with the most rules, is faulted most.
    fault = draw(st.sampled_from([None] * 40 + sorted(k for k, (_, bad) in fields.items() if bad) + ["image"]
                                 + ["answer"] * 4))
    obj = {}
    for key, (good, bad) in fields.items():
        value = draw(st.sampled_from(bad if key == fault else good))
        if value is not MISSING:
            obj[key] = value
    label = "valid" if fault is None else "invalid"
    if fault == "image":
        unchecked = draw(st.booleans())
        obj["image"] = draw(st.sampled_from(IMAGES[1] if unchecked else IMAGES[2]))
        label = "unchecked" if unchecked else "invalid"
        if obj["image"] is MISSING:
            del obj["image"]
    else:
        obj["image"] = IMAGES[0][0]
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    return text.replace(BAD_BYTES, "\udcff").encode("utf-8", "surrogatepass"), label


@settings(FUZZ_SETTINGS, max_examples=600)
@given(lines=st.lists(dataset_line(), min_size=1, max_size=20), bom=st.booleans(), check_images=st.booleans())
def test_read_jsonl_names_the_first_bad_line(tmp_path_factory, lines, bom, check_images):
    folder = tmp_path_factory.mktemp("ds", numbered=True)
    (folder / "img.png").write_bytes(b"not decoded here")
    path = folder / "data.jsonl"
    labels = write_file(path, lines, bom)
    nonblank = [n for n, label, *_ in labels if label != "blank"]
    bad = [n for n, label, *_ in labels if label == "invalid" or (label == "unchecked" and check_images)]
    try:
        samples = read_jsonl(path, check_images=check_images)
    except DatasetError as e:
        assert bad, f"a valid file was refused: {str(e)[:500]}"
        assert str(e).startswith(f"{path}:{bad[0]}: "), (str(e)[:500], labels[bad[0] - 1][3][:500])
        assert len(str(e)) < 2000, "error messages stay short, whatever the input"
    else:
        assert not bad, f"line {bad[0]} was accepted: {labels[bad[0] - 1][3][:500]!r}"
        assert [s.origin for s in samples] == [f"{path}:{n}" for n in nonblank]
