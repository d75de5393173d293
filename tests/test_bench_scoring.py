"""`spatial-jax eval --benchmark NAME --data COPY --predictions FILE` on each benchmark's fixture copy, with responses
written to trip each official scorer's extraction rules (a missing "Answer:" line, a lower-case letter, a number
with units, a trailing newline). The expected per-record scores and totals are worked out by hand from the rules
the scorer's docstring quotes (the official code's), not by running the scorer."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_bench_loaders import write_copy

from spatial_jax.cli import main
from spatial_jax.suites import load, score_responses
from spatial_jax.suites.extract import mra

# benchmark -> (responses by record id, expected score per record in file order, expected overall, {row: value})
CASES = {
    "omnispatial": (
        {"Dynamic_Reasoning_0_0": "The block slides to the left.",  # no "Answer:" line: read as "A", the gold: right
         "Dynamic_Reasoning_1_0": "answer: b",  # case-insensitive match keeps the lower-case "b": not "B"
         "Perspective_Taking_0_0": "Answer: B\nOn reflection:\nAnswer: C\n",  # the last match counts
         "Perspective_Taking_2_1": "Answer: D"},
        [1, 0, 1, 0], 0.5, {"Manipulation": 1.0, "Motion_Analysis": 0.0, "Allocentric": 0.5,
                            "Dynamic_Reasoning": 0.5, "Perspective_Taking": 0.5}),
    "spatialab": (
        # App. D.1: an exact match on the option's number, whitespace aside ("3." is not "3")
        {"sl-1": " 1\n", "sl-2": "3.", "sl-3": "2"},
        [1, 0, 1], 2 / 3, {"3D Geometry": 1.0, "Orientation": 0.5}),
    "3dsrbench": (
        {"1": "A. the lamp", "2": "b", "3": "The answer is B\n", "4": "(A)", "5": "C", "6": "D"},
        # the authors' rows are per question: height {1,2} wrong, {3,4} right -> 0.5 (lmms-eval's per row: 0.75)
        [1, 0, 1, 1, 1, 1], 2 / 3, {"height": 0.5, "orientation": 1.0, "height_higher": 0.5,
                                    "orientation_viewpoint": 1.0}),
    "mindcube-tiny": (
        {"among_001": "I think the answer is A. Left",
         "around_002": "<Answer>b</Answer>",  # lower case: no rule finds a letter
         "rotation_003": "Rotating 90 degrees, the view is C",
         "translation_004": "D",
         "among_005": "The CUBE. is facing B"},  # the first rule reads "E." out of "CUBE."
        [1, 0, 1, 1, 0], 0.5, {"among": 0.5, "around": 0.0, "rotation": 1.0, "translation": 1.0}),
    "viewspatial": (
        {"0": "The counter is right of it.\nA", "1": "B\n",  # a trailing newline leaves an empty last line
         "2": "Thinking...\nthe answer is c. left"},  # case-insensitive: the lower-case c counts
        [1, 0, 1], 2 / 3, {"Camera perspective - Relative Direction": 0.5,
                           "Person perspective - Object View Orientation": 1.0}),
    "embspatial": (
        {"mp3d_0": "B", "ai2thor_1": "<answer>(a)</answer>"},
        [1, 0], 0.5, {"left": 1.0, "far": 0.0}),
    "sparbench": (
        {"s0": "",  # an empty response is "in" every gold
         "s1": "Blue point is closer",  # its first character is the gold letter
         "s2": "A", "s3": "about 2.5 m", "s4": "first 1 then 4 meters", "s5": "move_right:1, rotate_left:30"},
        [1, 1, 0, 0.8, 1.0, 0.8], (0.5 + 1.0 + 0.8 + 1.0 + 0.8) / 5,
        {"obj_spatial_relation_oo": 0.5, "position_matching": 1.0, "depth_prediction_oc": 0.8,
         "depth_prediction_oc_mv": 1.0, "view_change_infer": 0.8, "Low": 0.9, "Middle": 1.0, "High": 0.5}),
    "vsibench": (
        {"0": "4\n", "1": "2.5 meters", "2": "20m", "3": "a.", "4": "B.\n", "5": "Answer: C"},
        [1.0, 0.8, 0.0, 1.0, 0.0, 0.0], (1.0 + 0.8 + 0.0 + 1 / 3 + 0.0) / 5,
        {"object_counting": 1.0, "object_abs_distance": 0.8, "room_size_estimation": 0.0,
         "object_rel_direction": 1 / 3, "route_planning": 0.0}),
    "cvbench": (
        {"0": "(B)", "1": "answer: (A)\n", "2": "A", "3": "The answer is A", "4": "b"},
        # Cambrian lower-cases the response: the lone "b" is the gold (B) of record 4
        [1, 1, 0, 1, 1], 0.875, {"ADE20K": 1.0, "COCO": 0.5, "Omni3D": 1.0, "2D": 0.75, "3D": 1.0,
                                 "task Relation": 0.5}),
}


def test_the_hand_computed_mra_values():
    # |2.5 - 2.2| / 2.2 = 0.136: within 1 - t for t = 0.50 ... 0.85 (8 of 10); gt 4, pred 4: all 10
    assert mra(2.5, 2.2) == pytest.approx(0.8) and mra(4, 4) == 1.0 and mra(10, 1) == 0.0
    # SPAR's view-change axes score MRA(gt, pred) (swapped): gt -30 against pred 0 divides by 0 -> |-30| -> 0
    assert mra(-30, 0, zero_target_absolute=True) == 0.0 and mra(0, 0, zero_target_absolute=True) == 1.0
    # defined scores where the official code would divide by zero or compare a NaN
    assert mra(0, 0) == 1.0 and mra(1, 0) == 0.0 and mra(float("nan"), 2) == 0.0 and mra(float("inf"), 2) == 0.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_predictions_score_as_the_official_rules_say(name, tmp_path, capsys):
    responses, per_record, overall, rows = CASES[name]
    root = write_copy(name, tmp_path / "copy")
    preds = tmp_path / "preds.json"
    if name in ("3dsrbench", "vsibench"):  # JSONL, one {"id", "response"} per line, ids as the copy writes them
        preds = tmp_path / "preds.jsonl"
        preds.write_text("".join(json.dumps({"id": int(k), "response": v}) + "\n" for k, v in responses.items()))
    else:
        preds.write_text(json.dumps(responses))
    out = tmp_path / "report.json"
    assert main(["eval", "--benchmark", name, "--data", str(root), "--predictions", str(preds),
                 f"--output={out}"]) == 0
    printed = capsys.readouterr().out
    assert f"### {name}" in printed and "**Overall**" in printed
    report = json.loads(out.read_text())["benchmarks"][name]
    assert [r["score"] for r in report["rows"]] == pytest.approx(per_record)
    table = report["table"]
    assert table["overall"]["mean"] == pytest.approx(overall)
    cells = {**table["categories"], **table["groups"]}
    for row, value in rows.items():
        assert cells[row]["mean"] == pytest.approx(value), row
    assert out.with_suffix(".md").read_text().startswith(f"### {name}")


def test_3dsrbench_variants_group_rotations_and_flips():
    records = load_fixture("3dsrbench")
    responses = CASES["3dsrbench"][0]
    got = {v: score_responses("3dsrbench", records, responses, v).table.overall.mean
           for v in ("authors", "circular", "flip_circular", "flip", "vanilla")}
    # rows right: 1 0 1 1 | 1 1. authors and circular groups {1,2} {3,4} {5,6}; flip_circular {1-4} {5,6};
    # flip pairs {1,3} {2,4} {5} {6}; vanilla rows.
    assert got == pytest.approx({"authors": 2 / 3, "circular": 2 / 3, "flip_circular": 1 / 2, "flip": 3 / 4,
                                 "vanilla": 5 / 6})


def test_3dsrbench_authors_rows_per_question_lmms_eval_per_row():
    records = load_fixture("3dsrbench")
    responses = CASES["3dsrbench"][0]
    authors = score_responses("3dsrbench", records, responses).table
    lmms = score_responses("3dsrbench", records, responses, "circular").table
    assert authors.variant == "authors"
    # height: questions {1,2} (0) and {3,4} (1) -> 1/2 for the authors; rows 1 0 1 1 -> 3/4 for lmms-eval
    assert authors.categories["height"].mean == pytest.approx(0.5) and authors.categories["height"].n == 2
    assert lmms.categories["height"].mean == pytest.approx(0.75) and lmms.categories["height"].n == 4
    assert "height_higher" in authors.categories and "height_higher" not in lmms.categories


def test_3dsrbench_authors_drop_only_a_one_character_rotation_suffix():
    from spatial_jax.suites.srbench3d import group_key

    # the authors' rule looks at the second-to-last character; lmms-eval's cuts at fixed widths
    assert group_key("AAAAAAAA-flip-3", "authors") == "AAAAAAAA-flip"
    assert group_key("AAAAAAAA-12", "authors") == "AAAAAAAA-12"
    assert group_key("AAAAAAAA-12", "circular") == "AAAAAAAA"


def test_3dsrbench_without_qids_scores_only_rows(tmp_path):
    from test_bench_loaders import SRBENCH, write_3dsrbench

    from spatial_jax.suites import BenchmarkError

    records = load("3dsrbench", write_3dsrbench(tmp_path, [{k: v for k, v in r.items() if k != "qid"}
                                                           for r in SRBENCH]))
    responses = CASES["3dsrbench"][0]
    assert score_responses("3dsrbench", records, responses, "vanilla").table.overall.mean == pytest.approx(5 / 6)
    with pytest.raises(BenchmarkError, match="lacks"):
        score_responses("3dsrbench", records, responses)


def test_omnispatial_direct_variant_and_missing_and_stray_ids(tmp_path):
    records = load_fixture("omnispatial")
    ids = [r.id for r in records]
    direct = score_responses("omnispatial", records, dict(zip(ids, (" a.", "B", "c", "Bottom left"))), "direct")
    assert [r["score"] for r in direct.rows] == [1, 1, 1, 0]
    part = score_responses("omnispatial", records, {ids[1]: "Answer: B"})
    assert part.missing == [ids[0], ids[2], ids[3]] and part.table.overall.n == 1
    from spatial_jax.suites import BenchmarkError

    with pytest.raises(BenchmarkError, match="no omnispatial record ids"):
        score_responses("omnispatial", records, {"9_9": "A"})
    with pytest.raises(BenchmarkError, match="no scoring variant"):
        score_responses("omnispatial", records, {}, "json")


def test_bad_prediction_files_are_one_line_errors(tmp_path, capsys):
    root = write_copy("embspatial", tmp_path / "copy")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "mp3d_0", "response": "B"}\n{"id": "ai2thor_1"}\n')
    assert main(["eval", "--benchmark", "embspatial", "--data", str(root), "--predictions", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.jsonl:2: missing field 'response'" in err and "Traceback" not in err
    bad.write_text('{"mp3d_0": 3}')
    assert main(["eval", "--benchmark", "embspatial", "--data", str(root), "--predictions", str(bad)]) == 1
    assert "must be a string" in capsys.readouterr().err
    assert main(["eval", "--benchmark", "nope", "--data", str(root), "--predictions", str(bad)]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err


_FIXTURES: dict = {}


def load_fixture(name):
    import tempfile
    from pathlib import Path

    if name not in _FIXTURES:
        _FIXTURES[name] = load(name, write_copy(name, Path(tempfile.mkdtemp()) / name))
    return _FIXTURES[name]


def test_prediction_file_forms(tmp_path):
    from spatial_jax.suites.runner import read_predictions

    one = tmp_path / "one.jsonl"
    one.write_text('{"id": 3, "response": "B"}\n')  # one JSONL line is also a JSON object: still a row
    assert read_predictions(one) == {"3": "B"}
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"id": 3, "response": "B"}\n\n{"4": "C"}\n')
    assert read_predictions(mixed) == {"3": "B", "4": "C"}
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"id": 3, "response": "B"}\n{"3": "C"}\n')
    from spatial_jax.suites import BenchmarkError

    with pytest.raises(BenchmarkError, match="given twice"):
        read_predictions(twice)


def test_cvbench_cambrian_quirks_against_the_letter_rule():
    from spatial_jax.suites import cvbench

    records = {r.id: r for r in load_fixture("cvbench")}
    count, depth = records["0"], records["3"]  # ADE20K Count, gold (B) "2"; Omni3D Depth, gold (A) "lamp"
    # each keyword in turn cuts at its last occurrence: "answer is" then "answer:" leaves "b"
    assert cvbench.score(count, "My answer is C. Final answer: B", "cambrian") == (1.0, "b")
    assert cvbench.score(count, "My answer is C. Final answer: B", "letter") == (1.0, "B")
    # a 2D response naming the option text is wrong; only the first character is kept ("2" is no letter)
    assert cvbench.score(count, "2", "cambrian")[0] == 0.0
    assert cvbench.score(count, "Because of the two chairs", "cambrian") == (1.0, "b")
    assert cvbench.score(count, "Because of the two chairs", "letter")[0] == 0.0
    # 3D accepts the gold text only when it survives the one-character cut
    assert cvbench.score(depth, "lamp", "cambrian") == (0.0, "l")
    one_char = dataclasses.replace(depth, options=("3", "4"))
    assert cvbench.score(one_char, "3", "cambrian")[0] == 1.0 and cvbench.score(count, "", "cambrian") == (0.0, None)
