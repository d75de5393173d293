"""SpatialThinker dense reward (SPEC 4): parser, F/C/A/S terms, gates, torch parity, robustness."""

import json
import math
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spatial_jax.config import ConfigError, apply_overrides
from spatial_jax.records import RecordError, Rollout
from spatial_jax.reference import spatialthinker_torch as ref_torch
from spatial_jax.rewards import parse_scene as ps
from spatial_jax.rewards import spatialthinker as stk

CFG = stk.SpatialThinkerConfig()
REF_SCENE = {
    "objects": [{"id": "car.1", "bbox": [100, 200, 300, 300]}, {"id": "tree.2", "bbox": [400, 50, 480, 350]}],
    "relationships": [{"subject": "car.1", "predicate": "left of", "object": "tree.2"}],
}


def completion(scene=REF_SCENE, answer="(B) behind", *, observe="a car and a tree", think="the car is behind"):
    scene_text = scene if isinstance(scene, str) else json.dumps(scene)
    return (f"<observe>{observe}</observe>\n<scene>{scene_text}</scene>\n<think>{think}</think>\n"
            f"<answer>{answer}</answer>")


def rollout(text, scene=REF_SCENE, answer="(B) behind", question="Image size: (640 x 480)\nWhere is the car?", **kw):
    return Rollout(id="r", completion=text, question=question, answer=answer, scene=scene, **kw)


def ciou_by_hand(a, b):
    """SPEC 4 CIoU without eps."""
    wa, ha, wb, hb = a[2] - a[0], a[3] - a[1], b[2] - b[0], b[3] - b[1]
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    iou = inter / (wa * ha + wb * hb - inter)
    rho2 = ((a[0] + a[2]) / 2 - (b[0] + b[2]) / 2) ** 2 + ((a[1] + a[3]) / 2 - (b[1] + b[3]) / 2) ** 2
    c2 = (max(a[2], b[2]) - min(a[0], b[0])) ** 2 + (max(a[3], b[3]) - min(a[1], b[1])) ** 2
    v = 4 / math.pi**2 * (math.atan(wb / hb) - math.atan(wa / ha)) ** 2
    return iou - rho2 / c2 - v / ((1 - iou) + v) * v


# ---- parser ----

def test_parser_reads_tags_objects_and_relations():
    p = ps.parse(completion())
    assert p.format_ok and p.errors == ()
    assert p.observe == "a car and a tree" and p.think == "the car is behind" and p.answer == "(B) behind"
    assert [(o.id, o.label, o.bbox) for o in p.objects] == [
        ("car.1", "car", (100.0, 200.0, 300.0, 300.0)), ("tree.2", "tree", (400.0, 50.0, 480.0, 350.0))]
    assert p.relationships == (ps.Relation("car.1", "left of", "tree.2"),)
    assert ps.id_label("traffic_Light.12") == "traffic light"


def obj(oid="car.1", bbox=(1, 2, 3, 4)):
    return {"id": oid, "bbox": list(bbox)}


@pytest.mark.parametrize(
    "text,reason",
    [
        (completion().replace("<think>", ""), "<think>"),
        (completion() + "<answer>A</answer>", "<answer>"),
        ("<scene>{}</scene><observe>x</observe><think>t</think><answer>a</answer>", "order"),
        (completion("{not json"), "JSON"),
        (completion('{"objects": [{"id": "car.1", "bbox": [1, 2, NaN, 4]}], "relationships": []}'), "JSON"),
        (completion("[1, 2]"), "not an object"),
        (completion({"objects": [obj()]}), "relationships"),
        (completion({"objects": {}, "relationships": []}), "objects"),
        (completion({"objects": [obj("car1")], "relationships": []}), "does not match"),
        (completion({"objects": [obj("car.1"), obj("car.1")], "relationships": []}), "repeated"),
        (completion({"objects": [obj(bbox=(3, 2, 3, 4))], "relationships": []}), "x2 > x1"),
        (completion({"objects": [obj(bbox=(1, 2, 3))], "relationships": []}), "x2 > x1"),
        (completion({"objects": [obj(bbox=(1, "2", 3, 4))], "relationships": []}), "x2 > x1"),
        (completion({"objects": [obj(bbox=(1, 2, 3, 10**400))], "relationships": []}), "x2 > x1"),
        (completion({"objects": [{"id": "car.1"}], "relationships": []}), "keys id and bbox"),
        (completion({"objects": [obj()], "relationships": [{"subject": "car.1", "predicate": "near",
                                                            "object": "tree.9"}]}), "unknown id"),
        (completion({"objects": [obj()], "relationships": [{"subject": "car.1", "object": "car.1"}]}), "string"),
    ],
)
def test_format_violations(text, reason):
    p = ps.parse(text)
    assert not p.format_ok
    assert any(reason in e for e in p.errors), p.errors


@pytest.mark.parametrize(
    "prompt,size",
    [("Image size: (640 x 480)", (640.0, 480.0)), ("image size: 1024x768.", (1024.0, 768.0)),
     ("Image size: (0 x 480)", None), ("no size", None), (None, None)],
)
def test_parse_image_size(prompt, size):
    assert ps.parse_image_size(prompt) == size


@pytest.mark.parametrize(
    "pred,gold,options,ok",
    [
        ("(B) behind", "(B) behind", (), True),
        ("  (b)   Behind ", "(B) behind", (), True),
        ("B", "(B) behind", (), True),
        ("(b)", "(B) behind", (), True),
        ("b.", "(B) behind", (), True),
        ("behind", "(B) behind", (), False),
        ("(A) front", "(B) behind", (), False),
        ("(B) behind", "B", ("front", "behind"), True),
        ("(B) behind", "B", ("(A) front", "(B) behind"), True),
        ("b", "behind", ("front", "behind"), True),
        ("a", None, (), False),
    ],
)
def test_answer_matching(pred, gold, options, ok):
    assert ps.answer_matches(pred, ps.gold_option(gold, options)) is ok


# ---- terms ----

def test_ciou_of_known_boxes_through_the_spatial_term():
    for a, b in [((0, 0, 2, 2), (1, 1, 3, 3)), ((0, 0, 1, 1), (0, 0, 2, 1)), ((0, 0, 1, 2), (3, 3, 5, 4))]:
        s = stk.spatial_score(np.array([a], float), ["car"], np.array([b], float), ["car"], CFG)
        assert s == pytest.approx((ciou_by_hand(a, b) + 1) / 2, abs=1e-6)
    # Overlapping equal squares: IoU 1/7, rho^2/c^2 = 2/18, v = 0.
    assert ciou_by_hand((0, 0, 2, 2), (1, 1, 3, 3)) == pytest.approx(1 / 7 - 1 / 9)


@pytest.mark.parametrize(
    "p_obj,g_obj,p_rel,g_rel,expected",
    [(2, 2, 1, 1, 1.0), (1, 2, 0, 1, 0.35), (3, 2, 2, 1, 0.35), (5, 2, 1, 1, 0.3), (0, 0, 0, None, 1.0),
     (2, 0, 0, None, 0.0), (3, 4, 7, None, 0.75), (3, 4, 0, 2, 0.7 * 0.75)],
)
def test_count_term(p_obj, g_obj, p_rel, g_rel, expected):
    assert stk.count_score(p_obj, g_obj, p_rel, g_rel, CFG) == pytest.approx(expected, abs=1e-12)


def test_full_score_perfect_scene():
    out = stk.score(rollout(completion()))
    assert (out["format"], out["count"], out["accuracy"]) == (1.0, 1.0, 1.0)
    assert out["spatial"] == pytest.approx(1.0, abs=1e-4)  # identical boxes: CIoU = 1 up to eps / area
    assert out["reward"] == pytest.approx(0.1 + 0.2 + 0.5 + 0.2 * out["spatial"], abs=1e-12)


def test_lexicographic_gate_zeroes_count_accuracy_and_spatial():
    out = stk.score(rollout(completion().replace("</observe>", "")))
    assert out == {**out, "reward": 0.0, "format": 0.0, "count": 0.0, "accuracy": 0.0, "spatial": 0.0}


def test_spatial_only_when_answer_correct():
    out = stk.score(rollout(completion(answer="(A) front")))
    assert out["accuracy"] == 0.0 and out["spatial"] == 0.0 and out["reward"] == pytest.approx(0.1 + 0.2)
    loose = stk.SpatialThinkerConfig(spatial_requires_correct=False)
    assert stk.score(rollout(completion(answer="(A) front")), loose)["spatial"] > 0.99


def test_no_reference_objects():
    empty = {"objects": [], "relationships": []}
    assert stk.score(rollout(completion(empty), scene=empty))["spatial"] == 1.0
    out = stk.score(rollout(completion(), scene=empty))
    assert out["spatial"] == 0.0 and out["count"] == 0.0


def test_matching_prefers_labels_and_unmatched_references_score_zero():
    swapped = {"objects": [{"id": "car.1", "bbox": [400, 50, 480, 350]},
                           {"id": "tree.2", "bbox": [100, 200, 300, 300]}], "relationships": []}
    size = (640.0, 480.0)
    a = stk.normalise_boxes(np.array([o["bbox"] for o in REF_SCENE["objects"]], float), size)
    expected = ((ciou_by_hand(a[1], a[0]) + 1) / 2 + (ciou_by_hand(a[0], a[1]) + 1) / 2) / 2
    assert stk.score(rollout(completion(swapped)))["spatial"] == pytest.approx(expected, abs=1e-6)
    one = {"objects": [REF_SCENE["objects"][0]], "relationships": []}
    assert stk.score(rollout(completion(one)))["spatial"] == pytest.approx(0.5, abs=1e-4)


def norm(box, w, h):
    return (box[0] / w, box[1] / h, box[2] / w, box[3] / h)


def test_boxes_are_normalised_by_the_stated_image_size():
    pred = {"objects": [{"id": "car.1", "bbox": [100, 200, 300, 280]}], "relationships": []}
    ref = {"objects": [{"id": "car.1", "bbox": [100, 200, 250, 300]}], "relationships": []}
    a, b = (100, 200, 300, 280), (100, 200, 250, 300)
    by_question = stk.score(rollout(completion(pred), scene=ref, question="Image size: (1000 x 200)"))["spatial"]
    assert by_question == pytest.approx((ciou_by_hand(norm(a, 1000, 200), norm(b, 1000, 200)) + 1) / 2, abs=1e-6)
    by_field = stk.score(rollout(completion(pred), scene=ref, question="Image size: (1 x 1)", image_size=(1000, 200)))
    assert by_field["spatial"] == pytest.approx(by_question, abs=1e-12)
    unsized = stk.score(rollout(completion(pred), scene=ref, question=""))["spatial"]
    assert unsized == pytest.approx((ciou_by_hand(a, b) + 1) / 2, abs=1e-6) and unsized != pytest.approx(by_question)


def test_gt_boxes_reference_and_json_records():
    row = {"id": "g", "completion": completion(), "answer": "B", "options": ["front", "behind"],
           "image_size": [640, 480],
           "gt_boxes": [{"bbox_2d": o["bbox"], "label": o["id"].split(".")[0]} for o in REF_SCENE["objects"]]}
    assert stk.score_batch([]) == [] and ref_torch.score_batch([]) == []
    out = stk.score_batch([Rollout.from_json(row)])[0]
    assert out["count"] == 1.0 and out["accuracy"] == 1.0 and out["spatial"] == pytest.approx(1.0, abs=1e-4)


def test_absurd_coordinates_stay_finite():
    huge = {"objects": [{"id": "car.1", "bbox": [-1e300, 0, 1e300, 1e308]}], "relationships": []}
    out = stk.score(rollout(completion(huge)))
    assert all(math.isfinite(v) for v in out.values()) and out["format"] == 1.0


def test_bad_reference_is_a_clear_error():
    bad = rollout("junk", scene={"objects": [{"id": "car.1", "bbox": [1, 2]}]})
    with pytest.raises(ValueError, match=r"scene.objects\[0\].bbox"):
        stk.score(bad)
    with pytest.raises(ValueError, match=r"scene.objects\[0\].bbox"):
        ref_torch.score_batch([bad])


def test_config_defaults_validation_and_overrides():
    assert (CFG.w_format, CFG.w_count, CFG.w_accuracy, CFG.w_spatial) == (0.1, 0.2, 0.5, 0.2)
    assert (CFG.count_object_weight, CFG.count_relation_weight, CFG.label_cost_weight) == (0.7, 0.3, 2.0)
    with pytest.raises(ValueError, match="count_object_weight"):
        stk.SpatialThinkerConfig(count_object_weight=0.5)
    with pytest.raises(ConfigError):
        apply_overrides(CFG, ["w_spatial=-1"])
    assert apply_overrides(CFG, ["spatial_requires_correct=false"]).spatial_requires_correct is False


# ---- parity with the torch reference (tolerance 1e-6) ----

LABELS = ["car", "tree", "traffic light", "red car", "light", "person", ""]


def random_boxes(rng: random.Random, n: int) -> np.ndarray:
    out = []
    for _ in range(n):
        kind = rng.random()
        if out and kind < 0.15:
            out.append(list(rng.choice(out)))  # identical boxes
            continue
        x1, y1 = rng.uniform(-0.1, 1.0), rng.uniform(-0.1, 1.0)
        w = 0.0 if kind < 0.25 else rng.uniform(0.001, 0.8)  # zero-area boxes
        h = rng.uniform(0.0, 0.8) if kind < 0.3 else rng.uniform(0.001, 0.8)
        out.append([x1, y1, x1 + w, y1 + h])
    return np.asarray(out, dtype=np.float64).reshape(-1, 4)


def test_count_term_parity_1000_random():
    rng = np.random.default_rng(0)
    p_obj, g_obj, p_rel, g_rel = (rng.integers(0, 8, 1000) for _ in range(4))
    main = [stk.count_score(int(a), int(b), int(c), int(d) or None, CFG)
            for a, b, c, d in zip(p_obj, g_obj, p_rel, g_rel)]
    ref = ref_torch.count_term(*(torch.as_tensor(x) for x in (p_obj, g_obj, p_rel, g_rel)), CFG)
    assert np.allclose(main, ref.numpy(), rtol=0, atol=1e-6)


def test_spatial_term_parity_1000_random():
    rng = random.Random(1)
    for _ in range(1000):
        n, m = rng.randint(0, 5), rng.randint(0, 5)
        pb, rb = random_boxes(rng, n), random_boxes(rng, m)
        pl, rl = [rng.choice(LABELS) for _ in range(n)], [rng.choice(LABELS) for _ in range(m)]
        main = stk.spatial_score(pb, pl, rb, rl, CFG)
        ref = float(ref_torch.spatial_term(torch.as_tensor(pb), pl, torch.as_tensor(rb), rl, CFG))
        assert main == pytest.approx(ref, abs=1e-6), (pb, pl, rb, rl)


def random_scene(rng: random.Random, size=(640, 480)):
    n = rng.randint(0, 4)
    boxes = random_boxes(rng, n) * np.array([size[0], size[1], size[0], size[1]])
    names = rng.sample(["car", "tree", "traffic_light", "person", "dog"], n)
    objects = [{"id": f"{name}.{i}", "bbox": [round(float(c), 1) for c in b]}
               for i, (name, b) in enumerate(zip(names, boxes))]
    rels = [{"subject": objects[0]["id"], "predicate": "near", "object": o["id"]} for o in objects[1:rng.randint(1, 4)]]
    return {"objects": objects, "relationships": rels}


def test_score_batch_parity_random_rollouts():
    rng = random.Random(2)
    rollouts = []
    for i in range(400):
        pred, ref = random_scene(rng), random_scene(rng)
        text = completion(pred, answer=rng.choice(["(B) behind", "b", "(A) front"]))
        if rng.random() < 0.2:
            text = text.replace(rng.choice(["<think>", "</scene>", "<observe>"]), "")
        size = rng.choice([None, (640, 480)])
        rollouts.append(Rollout(id=str(i), completion=text, answer="(B) behind", scene=ref, image_size=size))
    main, ref = stk.score_batch(rollouts), ref_torch.score_batch(rollouts)
    for m, r in zip(main, ref):
        assert set(m) == set(r)
        for k in r:
            assert m[k] == pytest.approx(r[k], abs=1e-6), k
    assert len({round(m["reward"], 6) for m in main}) > 50


# ---- robustness ----

scene_text = st.lists(
    st.sampled_from(["<observe>", "</observe>", "<scene>", "</scene>", "<think>", "</think>", "<answer>",
                     "</answer>", '{"objects": [', '{"id": "car.1", "bbox": [1, 2, 3, 4]}', "]", ", ",
                     '"relationships": [{"subject": "car.1", "predicate": "on", "object": "car.1"}]}', "(B) behind"])
    | st.text(max_size=10),
    max_size=16,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=300) | scene_text, question=st.text(max_size=40))
def test_never_raises_and_stays_in_bounds(text, question):
    ps.parse(text)
    out = stk.score(rollout(text, question=question))
    assert all(math.isfinite(v) for v in out.values())
    assert 0.0 <= out["reward"] <= 1.0 + 1e-12 and out["format"] in (0.0, 1.0)
    assert 0.0 <= out["count"] <= 1.0 and -0.25 < out["spatial"] <= 1.0


def test_unusable_image_size_falls_back_and_is_rejected_in_records():
    """A size below one pixel (0 once kept as whole pixels) must not divide the boxes by zero."""
    pred = {"objects": [{"id": "car.1", "bbox": [100, 200, 300, 300]}], "relationships": []}
    ref = {"objects": [{"id": "car.1", "bbox": [100, 200, 300, 320]}, {"id": 7, "bbox": [1, 1, 2, 2]}],
           "relationships": []}
    r = rollout(completion(pred), scene=ref, image_size=(0, 0))
    main, torch_ref = stk.score(r), ref_torch.score_batch([r], CFG)[0]
    assert main["spatial"] == pytest.approx(stk.score(rollout(completion(pred), scene=ref))["spatial"], abs=1e-12)
    for key, value in main.items():
        assert math.isfinite(value) and torch_ref[key] == pytest.approx(value, abs=1e-9), key
    row = {"id": "r", "completion": completion(pred), "answer": "(B) behind", "scene": ref}
    with pytest.raises(RecordError, match="image_size"):
        Rollout.from_json({**row, "image_size": [0.5, 480]})
