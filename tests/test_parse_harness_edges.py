"""AlloSpatial trajectory reader at its edges (spatial_jax/rewards/parse_harness.py, SPEC 1.3 and 5): a stray
`</tool_call>`, a doubled opener, an unclosed last call, an argument left empty, tool output blanked in place, calls
that name no known tool or carry arguments of the wrong type, and option letters read from options that carry their
own letters or run past Z. Each case pins the whole ToolCall, offsets included."""

from __future__ import annotations

import json

import pytest

from spatial_jax.rewards import parse_harness as ph

MAP_ARGS = {"categories": ["towel", "fridge"], "knowledge_type": "landmark", "output_format": "rectangle",
            "scene_type": ""}  # the scene type left empty: a missing argument
MAP_BODY = json.dumps({"name": "world2mind", "arguments": MAP_ARGS})
VIEW_BODY = '{"name": "view_image", "arguments": {"visualization_type": "landmark_vis"}}'
RESPONSE = '<tool_response>{"map": "towel (1.2, 0.4)"}</tool_response>'

# A trajectory with a stray closer, a doubled opener and a call cut off at the end of the text.
TRAJECTORY = (
    "Step1: Visual Clues\nA towel hangs on the oven.\n"
    f"<tool_call>{MAP_BODY}</tool_call>\n{RESPONSE}\n"
    "Step2.1: Map Clues\nThe towel is 0.99 m from the fridge.\n</tool_call>\n"
    f"Step3.1: View\n<tool_call><tool_call>{VIEW_BODY}</tool_call>\n"
    "Step4: Cross-Validation\nStep5: Final Answer\n<Answer>B</Answer>\n"
    '<tool_call>{"name": "view_image", "arguments": {'
)


def test_trajectory_with_broken_calls():
    h = ph.parse(TRAJECTORY)
    t = TRAJECTORY
    map_start = t.index("<tool_call>")
    double = t.index("<tool_call><tool_call>")
    last = t.rindex("<tool_call>")
    assert (map_start, double, last) == (47, 363, 536)
    assert h == ph.ParsedHarness(
        steps=(ph.Step(1, None, 0), ph.Step(2, 1, t.index("Step2.1")), ph.Step(3, 1, t.index("Step3.1")),
               ph.Step(4, None, t.index("Step4")), ph.Step(5, None, t.index("Step5"))),
        tool_calls=(
            # the empty scene type counts as missing; the stray </tool_call> after it opens nothing
            ph.ToolCall(47, 220, MAP_BODY, "world2mind", MAP_ARGS, "map", malformed=False, missing=("scene_type",)),
            # a doubled opener: the block runs from the first one, so its body starts with the second
            ph.ToolCall(363, 472, "<tool_call>" + VIEW_BODY, None, None, None, malformed=True),
            # cut off: malformed, from its opener to the end of the text
            ph.ToolCall(536, len(t), '{"name": "view_image", "arguments": {', None, None, None, malformed=True),
        ),
        answer="B",
    )
    assert t[47:220] == f"<tool_call>{MAP_BODY}</tool_call>" and len(t) == 584
    assert (h.n_malformed, h.n_missing_arguments) == (2, 1)


def test_stray_closers_open_no_block():
    assert ph.parse("Step1: Visual Clues\n</tool_call>\nStep5: Final Answer\n</Answer>B").tool_calls == ()
    assert ph.parse("Step5: Final Answer\n</Answer> <Answer>C</Answer>").answer == "C"
    assert ph.final_answer("</Answer>\n<Answer> 0.99 m </Answer>") == "0.99 m"
    assert ph.find_tool_call("done</tool_call>") is None


def test_find_tool_call_keeps_offsets():
    turn = f"Step3.1: Visualization Clues\n<tool_call>{VIEW_BODY}</tool_call>"
    assert ph.find_tool_call(turn) == ph.ToolCall(
        29, len(turn), VIEW_BODY, "view_image", {"visualization_type": "landmark_vis"}, "view", malformed=False)
    assert turn[29:].startswith("<tool_call>") and len(turn) == 127
    # tool output blanked in place keeps the offsets of the call after it
    turn2 = RESPONSE + "\n" + turn
    assert ph.find_tool_call(turn2) == ph.ToolCall(
        len(RESPONSE) + 30, len(turn2), VIEW_BODY, "view_image", {"visualization_type": "landmark_vis"}, "view",
        malformed=False)


def test_model_text_blanks_tool_output_in_place():
    text = f"Step2.1: Map\n{RESPONSE}\nStep4: Cross-Validation\n<tool_response>unclosed output"
    assert ph.model_text(text) == (
        "Step2.1: Map\n" + " " * len(RESPONSE) + "\nStep4: Cross-Validation\n" + " " * 30)  # 30: the unclosed output
    assert ph.response_spans(text) == ((13, 13 + len(RESPONSE)), (len(text) - 30, len(text)))
    assert ph.parse(text).steps == (ph.Step(2, 1, 0), ph.Step(4, None, 14 + len(RESPONSE)))


def test_non_string_trajectory_is_empty():
    assert ph.parse(None) == ph.ParsedHarness(steps=(), tool_calls=(), answer=None)
    assert ph.parse(42) == ph.ParsedHarness(steps=(), tool_calls=(), answer=None)


@pytest.mark.parametrize("body, call", [
    # a tool the harness does not have: its name and arguments are kept for the log
    ('{"name": "search", "arguments": {"query": "towel"}}',
     ph.ToolCall(0, 0, '{"name": "search", "arguments": {"query": "towel"}}', "search", {"query": "towel"}, None,
                 malformed=True)),
    # a name that is no string and arguments that are no object: neither is kept
    ('{"name": ["world2mind"], "arguments": {"categories": ["towel"]}}',
     ph.ToolCall(0, 0, '{"name": ["world2mind"], "arguments": {"categories": ["towel"]}}', None,
                 {"categories": ["towel"]}, None, malformed=True)),
    ('{"name": "world2mind", "arguments": ["towel", "landmark"]}',
     ph.ToolCall(0, 0, '{"name": "world2mind", "arguments": ["towel", "landmark"]}', "world2mind", None, None,
                 malformed=True)),
    # arguments serialised as a JSON string, as some chat templates do; one that does not parse is no object
    ('{"name": "view_image", "arguments": "{\\"visualization_type\\": \\"landmark_vis\\"}"}',
     ph.ToolCall(0, 0, '{"name": "view_image", "arguments": "{\\"visualization_type\\": \\"landmark_vis\\"}"}',
                 "view_image", {"visualization_type": "landmark_vis"}, "view", malformed=False)),
    ('{"name": "view_image", "arguments": "{visualization_type: landmark_vis}"}',
     ph.ToolCall(0, 0, '{"name": "view_image", "arguments": "{visualization_type: landmark_vis}"}', "view_image",
                 None, None, malformed=True)),
    ("not json", ph.ToolCall(0, 0, "not json", None, None, None, malformed=True)),
    # empty values of every kind are missing
    ('{"name": "world2mind", "arguments": {"categories": [], "knowledge_type": "", "output_format": {}}}',
     ph.ToolCall(0, 0, '{"name": "world2mind", "arguments": {"categories": [], "knowledge_type": "", '
                       '"output_format": {}}}', "world2mind", {"categories": [], "knowledge_type": "",
                                                               "output_format": {}}, "map", malformed=False,
                 missing=("categories", "knowledge_type", "output_format", "scene_type"))),
])
def test_parse_call_alone(body, call):
    assert ph.parse_call(body) == call


def test_parse_call_within_a_trajectory_keeps_its_place():
    text = f"Step2.1: Map Clues\n<tool_call>{MAP_BODY}</tool_call>"
    (call,) = ph.parse(text).tool_calls
    assert (call.start, call.end, call.raw) == (19, len(text), MAP_BODY)
    bad = "Step2.1: Map Clues\n<tool_call>{not json}</tool_call>"
    assert ph.parse(bad).tool_calls == (ph.ToolCall(19, len(bad), "{not json}", None, None, None, malformed=True),)


def test_read_letter_from_lettered_options():
    # options that carry their own letters, listed out of order: the letter is the option's own
    opts = ("B. behind", "A. in front")
    assert ph.read_letter("in front", opts) == "A"
    assert ph.read_letter("behind", opts) == "B"
    many = tuple(f"{i} chairs" for i in range(30))
    assert ph.read_letter("25 chairs", many) == "Z"
    assert ph.read_letter("26 chairs", many) is None
