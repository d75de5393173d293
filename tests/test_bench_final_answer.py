"""Benchmark evaluation of a policy: each method's completion, in the method's own format, is read through the
method's final answer before the benchmark's official extraction sees it; the question is laid out as the
benchmark's protocol shows it; a renamed category is an error naming the file, the record and the category."""

from __future__ import annotations

import json

import pytest
from test_bench_loaders import COPIES, write_copy
from test_bench_scoring import load_fixture

from spatial_jax.cli import main
from spatial_jax.data.prompts import THINK_BOXES, user_text
from spatial_jax.methods import get_method
from spatial_jax.suites import LAYOUTS, LOADERS, SCORERS, BenchmarkError, load, score_responses, scorer, to_sample

# Each method's completion around a final answer; the reasoning names another option ("A", "1") to show that it is
# not what is read. `None` is a completion that gives no final answer.
FORMATS = {
    "spatialcore": lambda a: ('{"bbox_2d": [10, 20, 300, 400], "label": "chair"}\nOption A and option 1 look close; '
                              "the other fits.\n</think>\n" + a if a is not None else "Option A, or 1? Still"),
    "prosr": lambda a: ("Option A and option 1 look close; the other fits.\n</think>\n" + a if a is not None
                        else "Option A and option 1 look close"),
    "spatialthinker": lambda a: ('<observe>a room</observe><scene>{"objects": [], "relationships": []}</scene>'
                                 "<think>Option A and option 1 look close.</think>"
                                 + (f"<answer>({a}) the option</answer>" if a is not None and not _numeric(a)
                                    else f"<answer>{a}</answer>" if a is not None else "")),
    "allospatial": lambda a: ("Step1: Visual Clues\nOption A and option 1 look close.\nStep5: Final Answer\n"
                              + (f"<Answer>{a}</Answer>" if a is not None else "I choose option A")),
}
# (benchmark, the scoring variant or None for the policy default, record id): a choice question of each copy, and
# the numeric ones
CASES = [(name, None, None) for name in sorted(SCORERS)] + [("cvbench", "letter", None), ("vsibench", None, "1"),
                                                           ("sparbench", None, "s3")]


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _record(name: str, rid: str | None):
    records = load_fixture(name)
    if rid is not None:
        return next(r for r in records if r.id == rid)
    # a choice question whose gold is not A (so the reasoning's "A" would be the wrong answer)
    return next(r for r in records if r.answer_type == "choice" and r.answer != "A")


def _answers(name: str, record) -> tuple[str, str]:
    """(right, wrong) final answers as the benchmark's layout asks for them."""
    if record.answer_type == "number":
        return f"{record.answer:g}", f"{record.answer * 5 + 7:g}"
    layout = LAYOUTS[name]
    wrong = next(letter for letter in "ABCDE" if letter != record.answer)
    return layout.label(record.answer), layout.label(wrong)


@pytest.mark.parametrize("method", sorted(FORMATS))
@pytest.mark.parametrize("name,variant,rid", CASES)
def test_a_method_completion_scores_its_final_answer(method, name, variant, rid):
    final_answer = get_method(method).final_answer
    record = _record(name, rid)
    right, wrong = _answers(name, record)
    got = {}
    for case, answer in (("right", right), ("wrong", wrong), ("none", None)):
        scored = score_responses(name, [record], {record.id: FORMATS[method](answer)}, variant, final_answer)
        got[case] = (scored.rows[0]["score"], scored.table.unparsed)
    assert got == {"right": (1.0, 0), "wrong": (0.0, 0), "none": (0.0, 1)}, (right, wrong)


def test_the_final_answer_spans():
    core, thinker, allo = (get_method(m).final_answer for m in ("spatialcore", "spatialthinker", "allospatial"))
    assert core("A then B\n</think>\n B \n") == "B" and core("</think> A </think>\nC") == "C"
    assert core("no close") is None and core("reasoning\n</think>\n  ") is None
    assert thinker("<answer>(B) behind</answer>") == "B" and thinker("<answer>(2) left</answer>") == "2"
    assert thinker("<answer> 3.5 </answer>") == "3.5" and thinker("<answer></answer>") is None
    assert thinker("<think>(A)</think>") is None
    # AlloSpatial: the <Answer> of the last turn; an answer inside a tool response or an earlier turn is not it
    turn = ("Step2.1: World Map\n<tool_call>{}</tool_call><tool_response>map <Answer>A</Answer></tool_response>")
    assert allo("<Answer>C</Answer>\n" + turn + "Step5: Final Answer\n<Answer>B</Answer>") == "B"
    assert allo("<Answer>C</Answer>\n" + turn + "Step5: Final Answer\nB") is None


def test_predictions_from_elsewhere_are_read_whole():
    record = _record("spatialab", None)
    whole = FORMATS["spatialcore"](LAYOUTS["spatialab"].label(record.answer))
    given = score_responses("spatialab", [record], {record.id: whole})
    assert given.rows[0]["score"] == 0.0 and given.table.unparsed is None and "final_answer" not in given.rows[0]
    assert "unparsed" not in given.table.markdown()
    policy = score_responses("spatialab", [record], {record.id: whole}, final_answer=get_method("prosr").final_answer)
    assert policy.rows[0]["score"] == 1.0 and "unparsed (no final answer, scored wrong): 0" in policy.table.markdown()


def test_omnispatial_policy_answers_use_the_direct_extraction():
    # the letter alone is what the direct format asks for; the default "re" extraction would read "A" for it
    record = _record("omnispatial", None)
    scored = score_responses("omnispatial", [record], {record.id: FORMATS["spatialcore"](record.answer)},
                             final_answer=get_method("spatialcore").final_answer)
    assert scored.table.variant == "direct" and scored.rows[0]["score"] == 1.0
    assert score_responses("omnispatial", [record], {record.id: record.answer}).rows[0]["score"] == 0.0


def test_every_benchmark_has_a_layout_with_its_source():
    import importlib

    assert set(LAYOUTS) == set(LOADERS) == set(SCORERS)
    for name in LOADERS:
        module = importlib.import_module(LOADERS[name].__module__)
        assert module.LAYOUT is LAYOUTS[name] and "Layout" in module.__doc__, name


def test_spatialab_numbered_options_and_instruction_map_back_to_the_letter(tmp_path):
    records = load("spatialab", write_copy("spatialab", tmp_path / "s"))
    sample = to_sample(records[1], layout=LAYOUTS["spatialab"])  # gold C of four options
    text = user_text(sample, THINK_BOXES)
    assert text == ("Which way does the mug face?\n1. left\n2. right\n3. towards us\n4. away\n"
                    "Answer with a single number (1-4).")
    assert sample.answer == "C" and scorer("spatialab").score(records[1], "3", "number") == (1.0, "3")
    assert scorer("spatialab").score(records[1], "C", "number")[0] == 0.0
    # without a layout the method's own lettered options stay
    assert "Options:\nA. left" in user_text(to_sample(records[1]), THINK_BOXES)


def test_layouts_show_options_as_their_protocols_do(tmp_path):
    cv = load("cvbench", write_copy("cvbench", tmp_path / "c"))[0]
    assert "\n(A) 1\n(B) 2\n(C) 3\n" in LAYOUTS["cvbench"].text(cv)
    omni = load("omnispatial", write_copy("omnispatial", tmp_path / "o"))[0]
    assert LAYOUTS["omnispatial"].text(omni).startswith("Where will the block be?\nA. left\nB. right\nC. up\nD. down\n")
    mc = load("mindcube-tiny", write_copy("mindcube-tiny", tmp_path / "m"))[0]
    assert LAYOUTS["mindcube-tiny"].text(mc).count("A. Left") == 1  # inline options are not repeated
    vsi = load("vsibench", write_copy("vsibench", tmp_path / "v"))
    assert LAYOUTS["vsibench"].text(vsi[3]).startswith("question 3\nOptions:\nA. left\nB. right")
    assert "single word or number" in LAYOUTS["vsibench"].text(vsi[1])


# benchmark -> (the field a renamed category sits in, a name that benchmark's protocol knows)
RENAMED = {"omnispatial": ("sub_task_type", "Allocentric"), "spatialab": ("category", "Size & Scale"),
           "3dsrbench": ("category", "height_higher"), "cvbench": ("source", "Omni3D")}


@pytest.mark.parametrize("name", sorted(RENAMED))
def test_a_renamed_category_is_an_error_naming_file_record_and_category(name, tmp_path):
    writer, rows, _, record = COPIES[name]
    field, known = RENAMED[name]
    renamed = [dict(r) for r in rows]
    renamed[1][field] = "Renamed Category"
    with pytest.raises(BenchmarkError) as e:
        load(name, writer(tmp_path / name, renamed))
    message = str(e.value)
    assert str(tmp_path / name) in message and record in message and "'Renamed Category'" in message, message
    assert repr(known) in message, message


def test_eval_of_a_policy_reads_its_final_answers_and_counts_unparsed(tmp_path, monkeypatch, capsys):
    """The CLI hands the method's final_answer to scoring for a policy's completions (generation stubbed: the slow
    protocol test in test_bench_protocols.py runs a real checkpoint)."""
    import spatial_jax.cli.eval as cli_eval

    root = write_copy("spatialab", tmp_path / "copy")
    records = load("spatialab", root)
    completions = {records[0].id: FORMATS["spatialcore"]("1"), records[1].id: FORMATS["spatialcore"]("1"),
                   records[2].id: FORMATS["spatialcore"](None)}
    out = tmp_path / "report.json"
    monkeypatch.setattr(cli_eval, "_generate", lambda *a: ({"spatialab": completions}, {}, {}, out,
                                                           get_method("spatialcore").final_answer))
    assert main(["eval", "--benchmark", "spatialab", "--data", str(root), "--initial"]) == 0
    assert "unparsed (no final answer, scored wrong): 1" in capsys.readouterr().out
    report = json.loads(out.read_text())["benchmarks"]["spatialab"]
    assert [r["score"] for r in report["rows"]] == [1.0, 0.0, 0.0] and report["table"]["unparsed"] == 1
    assert [r["final_answer"] for r in report["rows"]] == ["1", "1", None]
