"""SpatialThinker completion reader at its edges (spatial_jax/rewards/parse_scene.py, SPEC 1.2 and 4): a scene graph
with several faults at once (every fault named, every good entry kept), JSON that is no number, tags missing, stray
or out of order, reference ids with more than one dot, stated image sizes at the edge of positive, and gold answers
resolved from options by letter or text at both ends of the option range. Each case pins the whole result."""

from __future__ import annotations

import json

import pytest

from spatial_jax.records import Rollout
from spatial_jax.rewards import parse_scene as ps
from spatial_jax.rewards import spatialthinker as stk

ALL_ONCE = (("observe", 1, 1), ("scene", 1, 1), ("think", 1, 1), ("answer", 1, 1))
BOX_ERROR = "objects[{}].bbox is not 4 numbers with x2 > x1 and y2 > y1"


def completion(scene: str, answer: str = "(B) behind", think: str = "the car is behind the tree") -> str:
    return (f"<observe>a car and a tree</observe>\n<scene>{scene}</scene>\n<think>{think}</think>\n"
            f"<answer>{answer}</answer>")


def test_every_fault_is_named_and_every_good_entry_kept():
    # A model's scene with one of each fault between good entries: a fault never hides what follows it.
    objects = [
        '{"id": "car.1"}',  # no bbox
        '{"id": "car.1", "bbox": [10, 20, 110, 90]}',
        '{"id": "Car 2", "bbox": [1, 2, 3, 4]}',  # id off the pattern
        '{"id": "tree.2", "bbox": [200, 10, 260, 300]}',
        '{"id": "car.1", "bbox": [10, 20, 110, 90]}',  # repeated
        '{"id": "person.3", "bbox": [300, 100, 340, 220]}',
        '{"id": "sign.4", "bbox": [5, 50, 45, 50]}',  # zero height
        '{"id": "sign.5", "bbox": [0, 0, 1e400, 50]}',  # a JSON number that overflows to inf
        '{"id": "bus.6", "bbox": [400, 80, 620, 260]}',
        "null",
        "2",
    ]
    relations = [
        '"car.1 left of tree.2"',  # a relation written as a sentence
        '{"subject": "car.1", "predicate": "left of", "object": "tree.9"}',
        '{"subject": "car.1", "predicate": "left of", "object": "tree.2"}',
        '{"subject": "sign.4", "predicate": "on", "object": "bus.6"}',  # sign.4 failed its own check
        '{"subject": "person.3", "predicate": "near", "object": "bus.6"}',
    ]
    scene = '{"objects": [' + ", ".join(objects) + '], "relationships": [' + ", ".join(relations) + "]}"
    p = ps.parse(completion(scene))
    assert p == ps.ParsedScene(
        tag_counts=ALL_ONCE,
        observe="a car and a tree",
        scene_text=scene,
        think="the car is behind the tree",
        answer="(B) behind",
        objects=(
            ps.SceneObject("car.1", (10.0, 20.0, 110.0, 90.0), "car"),
            ps.SceneObject("tree.2", (200.0, 10.0, 260.0, 300.0), "tree"),
            ps.SceneObject("person.3", (300.0, 100.0, 340.0, 220.0), "person"),
            ps.SceneObject("bus.6", (400.0, 80.0, 620.0, 260.0), "bus"),
        ),
        relationships=(ps.Relation("car.1", "left of", "tree.2"), ps.Relation("person.3", "near", "bus.6")),
        errors=(
            "objects[0] is not an object with keys id and bbox",
            "objects[2].id 'Car 2' does not match [a-zA-Z_]+\\.\\d+",
            "objects[4].id 'car.1' is repeated",
            BOX_ERROR.format(6),
            BOX_ERROR.format(7),
            "objects[9] is not an object with keys id and bbox",
            "objects[10] is not an object with keys id and bbox",
            "relationships[0] needs string subject, predicate and object",
            "relationships[1] refers to unknown id(s) ['tree.9']",
            "relationships[3] refers to unknown id(s) ['sign.4']",
        ),
    )
    assert not p.format_ok


@pytest.mark.parametrize("scene, errors", [
    ("[1, 2]", ("scene JSON is not an object",)),
    ('{"objects": {}, "relationships": "none"}',
     ("scene 'objects' is not a list", "scene 'relationships' is not a list")),
    ("{not json", ("scene is not valid JSON (JSONDecodeError)",)),
    ('{"objects": [{"id": "car.1", "bbox": [1, 2, NaN, 4]}], "relationships": []}',
     ("scene is not valid JSON (ValueError)",)),
    ("[" * 100_000, ("scene is not valid JSON (RecursionError)",)),
])
def test_scene_json_errors_in_full(scene, errors):
    p = ps.parse(completion(scene))
    assert (p.errors, p.objects, p.relationships, p.scene_text) == (errors, (), (), scene)


def test_missing_scene_and_non_string():
    empty = ps.ParsedScene(
        tag_counts=(("observe", 0, 0), ("scene", 0, 0), ("think", 0, 0), ("answer", 0, 0)),
        observe=None, scene_text=None, think=None, answer=None, objects=(), relationships=(),
        errors=tuple(f"<{t}> appears 0 time(s) and </{t}> 0 time(s); need once each" for t in ps.TAGS)
        + ("no <scene>...</scene> block",),
    )
    assert ps.parse(None) == empty
    assert ps.parse(3) == empty
    p = ps.parse("<observe>a car</observe>\n<think>it is behind</think>\n<answer>(B) behind</answer>")
    assert p == ps.ParsedScene(
        tag_counts=(("observe", 1, 1), ("scene", 0, 0), ("think", 1, 1), ("answer", 1, 1)),
        observe="a car", scene_text=None, think="it is behind", answer="(B) behind", objects=(), relationships=(),
        errors=("<scene> appears 0 time(s) and </scene> 0 time(s); need once each", "no <scene>...</scene> block"),
    )


def test_stray_and_unclosed_tags():
    scene = '{"objects": [], "relationships": []}'
    # a closing tag named in the reasoning before the answer opens: the answer is still what <answer> holds
    p = ps.parse(completion(scene, think="I will close with </answer> after the answer"))
    assert p.answer == "(B) behind"
    assert p.tag_counts == (("observe", 1, 1), ("scene", 1, 1), ("think", 1, 1), ("answer", 1, 2))
    assert p.errors == ("<answer> appears 1 time(s) and </answer> 2 time(s); need once each",)
    assert ps.final_answer(completion(scene, think="then </answer>")) == "B"
    # truncated inside the answer: no answer
    truncated = completion(scene).removesuffix("d</answer>")
    p = ps.parse(truncated)
    assert (p.answer, p.think, p.errors) == (
        None, "the car is behind the tree", ("<answer> appears 1 time(s) and </answer> 0 time(s); need once each",))
    # every tag once but the answer before the reasoning
    swapped = f"<observe>o</observe><scene>{scene}</scene><answer>(A) front</answer><think>t</think>"
    p = ps.parse(swapped)
    assert (p.tag_counts, p.errors, p.answer, p.think) == (
        ALL_ONCE, ("tags are not in the order observe, scene, think, answer",), "(A) front", "t")


@pytest.mark.parametrize("object_id, label", [
    ("traffic_light.2", "traffic light"),
    ("u.s._flag.1", "u.s. flag"),  # a reference id with dots in its category: only the last one goes
    ("Person", "person"),  # no index at all
])
def test_id_label(object_id, label):
    assert ps.id_label(object_id) == label


@pytest.mark.parametrize("prompt, size", [
    ("Image size: (1 x 480)", (1.0, 480.0)),
    ("Image size: (640 x 1)", (640.0, 1.0)),
    ("Image size: (0.5 x 0.5)", (0.5, 0.5)),
    ("Image size: (640 x 0)", None),
    ("Image size: (0 x 0)", None),
])
def test_image_size_at_the_edge_of_positive(prompt, size):
    assert ps.parse_image_size(prompt) == size


@pytest.mark.parametrize("answer, options, gold", [
    ("A", ("front", "behind"), ("a", "(a) front")),  # the first option
    ("(b)", ("front", "behind"), ("b", "(b) behind")),
    ("C", ("front", "behind"), ("c", "(c)")),  # a letter past the options: no text for it
    ("front", ("front", "behind"), ("a", "(a) front")),
    ("Behind", ("(A) front", "(B) behind"), ("b", "(b) behind")),  # options that carry their own letter
    ("front", ("(A) front", "(B) behind"), ("a", "(a) front")),
    ("front", ("(B) behind", "(A) front"), ("a", "(a) front")),  # the option's own letter, not its place
    ("(A) front", ("(B) behind", "(A) front"), ("a", "(a) front")),
    ("left", ("front", "behind"), None),
    ("   ", ("front",), None),
])
def test_gold_option(answer, options, gold):
    assert ps.gold_option(answer, options) == gold


@pytest.mark.parametrize("gold", ["B", "(B)", "(b).", "( B )"])
def test_a_bracketed_letter_gold_takes_its_option_text(gold):
    # A dataset's gold "(B)" names option B as "B" does, so the completion SPEC 1.2 asks for, "(B) behind", matches
    # it. (Until 2026-12-07 "(B)" read as the option "(b)" with no text, and "(B) behind" scored A = 0.)
    assert ps.gold_option(gold, ("front", "behind")) == ("b", "(b) behind")
    assert ps.answer_matches("(B) behind", ps.gold_option(gold, ("front", "behind")))
    assert ps.gold_option(gold) == ("b", "(b)")  # no options: the letter alone
    assert ps.answer_matches("b", ps.gold_option(gold)) and not ps.answer_matches("(B) behind", ps.gold_option(gold))


def test_a_bracketed_letter_gold_scores_the_full_answer():
    # CV-Bench writes its gold as "(B)" beside its choices; a correct "(B) tv" earned A = 0 and S = 0 (reward 0.3)
    scene = {"objects": [{"id": "sofa.1", "bbox": [100, 200, 300, 300]}, {"id": "tv.2", "bbox": [400, 50, 480, 350]}],
             "relationships": []}
    text = completion(json.dumps(scene), answer="(B) tv", think="the tv is nearer the table")
    rollout = Rollout(id="r", completion=text, question="Image size: (640 x 480)\nWhich is nearer the table?",
                      answer="(B)", options=("sofa", "tv"), scene=scene)
    out = stk.score(rollout, stk.SpatialThinkerConfig())
    assert (out["format"], out["count"], out["accuracy"]) == (1.0, 1.0, 1.0)
    assert out["spatial"] == pytest.approx(1.0, abs=1e-5)  # the boxes are the reference's own (CIoU eps aside)
    assert out["reward"] == pytest.approx(1.0, abs=1e-5)


def test_gold_text_beyond_the_letters_has_none():
    many = tuple(f"{i} chairs" for i in range(30))
    assert ps.gold_option("25 chairs", many) == ("z", "(z) 25 chairs")
    assert ps.gold_option("26 chairs", many) is None
    assert ps.gold_option("27 chairs", many) is None


def test_scene_json_as_a_model_writes_it():
    # whitespace around the JSON is no fault; an integer box reads as floats
    scene = '\n  {"objects": [{"id": "traffic_light.12", "bbox": [5, 0, 25, 60]}], "relationships": []}\n'
    p = ps.parse(completion(scene, answer="(A) left"))
    assert p.objects == (ps.SceneObject("traffic_light.12", (5.0, 0.0, 25.0, 60.0), "traffic light"),)
    assert (p.scene_text, p.errors, p.answer) == (scene, (), "(A) left")
