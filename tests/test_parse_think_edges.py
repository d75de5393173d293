"""SpatialCORE/ProSR completion reader at its edges (spatial_jax/rewards/parse_think.py, SPEC 1.1 and 2): labels a
model escapes, coordinates it writes oddly (zero-led, over-long, a trailing comma, three or five values), `</think>`
at the very start or more than once, a truncated completion, the answer letter's fallback, and gold indices at the
ends of the option range. Each case pins the whole parse, spans included."""

from __future__ import annotations

import pytest

from spatial_jax.rewards.parse_think import ParsedBox, ParsedThink, answer_letter, parse_think, resolve_gold

OPTIONS = ("A. the sedan is left", "B. a man on the left", "C. the bus", "D. nothing")


def _spans(text: str, box: ParsedBox) -> list[str]:
    return [text[s:e] for s, e in box.coord_spans]


def test_escaped_labels_read_as_json_strings():
    # A label is a JSON string: an escaped quote or a \u escape is the character it names; an escape JSON does not
    # know is kept as written rather than dropping the box.
    text = (
        '{"bbox_2d": [120, 85, 460, 390], "label": "12\\" monitor"}\n'
        '{"bbox_2d": [500, 40, 730, 300], "label": "caf\\u00e9 sign"}\n'
        '{"bbox_2d": [10, 10, 50, 60], "label": "a\\q"}\n'
        "The monitor is left of the sign.\n</think>\nA"
    )
    p = parse_think(text)
    assert [b.label for b in p.boxes] == ['12" monitor', "café sign", "a\\q"]
    assert [b.valid for b in p.boxes] == [True, True, True]
    assert p.boxes[0] == ParsedBox(bbox=(120, 85, 460, 390), label='12" monitor', valid=True,
                                   coord_spans=((13, 16), (18, 20), (22, 25), (27, 30)), span=(0, 57))
    assert _spans(text, p.boxes[1]) == ["500", "40", "730", "300"]
    assert p.boxes[1].span == (58, 58 + len('{"bbox_2d": [500, 40, 730, 300], "label": "caf\\u00e9 sign"}'))


def test_coordinates_as_models_write_them():
    text = (
        '{"bbox_2d": [10, 20, 300, 400, ], "label": "cup"}\n'  # trailing comma: a fifth, empty value
        '{"bbox_2d": [10, 20, 300], "label": "cup"}\n'  # three values
        '{"bbox_2d": [10, 20, 300, 400, 500], "label": "cup"}\n'  # five values
        '{"bbox_2d": [0, 007, 100000000000000000, 0400], "label": "mug"}\n'  # zero-led; 18 digits still read
        '{"bbox_2d": [0, 7, 1000000000000000000, 400], "label": "mug"}\n'  # 19 digits: no coordinate
        "</think>\nB"
    )
    p = parse_think(text)
    # each span is its whole line (lines of 49, 42, 52, 63 and 61 characters)
    assert p.boxes == (
        ParsedBox(bbox=(10, 20, 300, 400), label="cup", valid=False, coord_spans=(), span=(0, 49)),
        ParsedBox(bbox=(10, 20, 300), label="cup", valid=False, coord_spans=(), span=(50, 92)),
        ParsedBox(bbox=(10, 20, 300, 400, 500), label="cup", valid=False, coord_spans=(), span=(93, 145)),
        ParsedBox(bbox=(0, 7, 100000000000000000, 400), label="mug", valid=False,
                  coord_spans=((159, 160), (162, 165), (167, 185), (187, 191)), span=(146, 209)),
        ParsedBox(bbox=(0, 7, 400), label="mug", valid=False, coord_spans=(), span=(210, 271)),
    )
    assert [len(line) for line in text.split("\n")[:5]] == [49, 42, 52, 63, 61]
    # the first coordinate's span is the digit alone, not its comma
    assert _spans(text, p.boxes[3]) == ["0", "007", "100000000000000000", "0400"]
    assert p.valid_boxes == ()


def test_coord_max_bounds_the_box():
    # The configured frame bounds a valid box (SpatialCOREConfig.coord_max); the default frame is [0, 1000].
    line = '{"bbox_2d": [0, 0, 700, 1000], "label": "table"}\n</think>\nC'
    assert [b.valid for b in parse_think(line).boxes] == [True]
    assert [b.valid for b in parse_think(line, coord_max=640).boxes] == [False]
    wide = '{"bbox_2d": [0, 0, 1001, 500], "label": "table"}\n</think>\nC'
    assert [b.valid for b in parse_think(wide).boxes] == [False]
    assert [b.valid for b in parse_think(wide, coord_max=1001).boxes] == [True]


BOX = '{"bbox_2d": [10, 20, 300, 400], "label": "sedan"}'


@pytest.mark.parametrize("text, expected", [
    # the model closes the template's <think> at once: empty reasoning, so a box after it is outside the span
    ("</think>\n" + BOX + "\nB",
     ParsedThink(boxes=(), reasoning_span=(0, 0), think_close_count=1, answer="B", after_think="\n" + BOX + "\nB")),
    ("</think>B", ParsedThink(boxes=(), reasoning_span=(0, 0), think_close_count=1, answer="B", after_think="B")),
    # truncated: no </think>, boxes read from the whole text, no answer and nothing after
    (BOX + "\nThe sedan is on the",
     ParsedThink(boxes=(ParsedBox((10, 20, 300, 400), "sedan", True, ((13, 15), (17, 19), (21, 24), (26, 29)),
                                  (0, len(BOX))),),
                 reasoning_span=(0, len(BOX) + 20), think_close_count=0, answer=None, after_think="")),
    # two closes: reasoning ends at the first, the answer follows the last; a box between them is not reasoning
    (BOX + "\nleft</think>A\n" + BOX + "</think>\nC",
     ParsedThink(boxes=(ParsedBox((10, 20, 300, 400), "sedan", True, ((13, 15), (17, 19), (21, 24), (26, 29)),
                                  (0, len(BOX))),),
                 reasoning_span=(0, len(BOX) + 5), think_close_count=2, answer="C", after_think="\nC")),
    ("", ParsedThink(boxes=(), reasoning_span=(0, 0), think_close_count=0, answer=None, after_think="")),
    (None, ParsedThink(boxes=(), reasoning_span=(0, 0), think_close_count=0, answer=None, after_think="")),
])
def test_parse_think_spans(text, expected):
    assert parse_think(text) == expected


def test_tails_of_the_edge_cases():
    assert parse_think("</think>B").well_formed_tail
    assert not parse_think("x</think>A</think>B").well_formed_tail  # two closes
    assert parse_think("x</think>A</think>B").after_think == "B"


@pytest.mark.parametrize("completion, letter", [
    ("</think>B", "B"),  # nothing before the close
    ("</think>\n D \n", "D"),
    ("It is option B.</think>\n", None),  # a letter before the close is no answer
    ("I think it is D</think>none of them", None),
    ("reasoning</think>B\n</think>", None),  # a stray close after the answer: the text after the last one is empty
    ("x</think>No", None),  # a word is no letter, however short
    ("x</think>OK", None),
    ("x</think>b", None),  # lower case is no option letter
    ("x</think>_", None),
    ("x</think>A", "A"),
    ("x</think>Z", "Z"),
    ("x</think>Y", "Y"),
    ("x</think>The answer is (C).", "C"),
])
def test_answer_letter_edges(completion, letter):
    assert answer_letter(completion) == letter


def test_integer_gold_is_an_index_at_both_ends():
    assert resolve_gold(0, OPTIONS) == "A"
    assert resolve_gold(3, OPTIONS) == "D"
    assert resolve_gold(4, OPTIONS) is None
    # no options: any letter's index
    assert resolve_gold(0) == "A"
    assert resolve_gold(3) == "D"
    assert resolve_gold(25) == "Z"
    assert resolve_gold(26) is None
    # more options than letters: the 27th has no letter
    many = tuple(f"option {i}" for i in range(30))
    assert resolve_gold(25, many) == "Z"
    assert resolve_gold(26, many) is None


def test_gold_text_beyond_the_letters_has_none():
    many = tuple(f"{i} chairs" for i in range(30))
    assert resolve_gold("25 chairs", many) == "Z"
    assert resolve_gold("26 chairs", many) is None
