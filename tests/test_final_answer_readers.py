"""The methods' final-answer readers at their edges (SPEC 1.1-1.3): where a tag sits at offset 0, which of several
tags counts, what is stripped, and what is not text at all."""

import pytest

from spatial_jax.rewards import parse_harness, parse_scene, parse_think


@pytest.mark.parametrize("reader", [parse_think.final_answer, parse_scene.final_answer, parse_harness.final_answer])
@pytest.mark.parametrize("completion", [None, 3, b"</think> A", ["<answer>A</answer>"]])
def test_what_is_not_text_has_no_final_answer(reader, completion):
    assert reader(completion) is None


def test_think_reads_after_the_last_close_even_at_offset_0():
    read = parse_think.final_answer
    assert read("</think> B") == "B" and read("</think>B") == "B"
    assert read("</think> A </think>") is None  # the last close has nothing after it
    assert read("a </think>\tC\n") == "C" and read("") is None


def test_scene_reads_the_first_closed_answer_tag_and_an_option_label():
    read = parse_scene.final_answer
    assert read("<answer>A</answer><answer>B</answer>") == "A"
    assert read("<answer>A") is None and read("A</answer>") is None and read("<answer> \n </answer>") is None
    assert read("<answer> (C) in front </answer>") == "C" and read("<answer>(12) twelve</answer>") == "12"
    # only an option label that opens the answer is a label; anything else is the answer as written
    assert read("<answer>left of (B)</answer>") == "left of (B)" and read("<answer>(AB)</answer>") == "(AB)"
    assert read("<answer>()</answer>") == "()"


def test_harness_reads_the_last_answer_of_the_last_turn():
    read = parse_harness.final_answer
    assert read("<Answer>A</Answer> then <Answer> B </Answer>") == "B"
    assert read("<answer>c</ANSWER>") == "c"  # the tags are matched whatever their case
    assert read("<Answer>A</Answer><Answer>  </Answer>") is None  # the last one is empty
    assert read("<Answer>A") is None and read("no tags") is None
    turn = "<tool_call>{}</tool_call><tool_response><Answer>X</Answer></tool_response>"
    assert read("<Answer>A</Answer>" + turn) is None and read(turn + "<Answer>D</Answer>") == "D"
