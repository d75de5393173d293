"""The synthetic spatial world: answers recomputed independently from the boxes, exact rendering, pseudo-GT noise and
A.3 corruption, scene graphs, and reference completions read back by the rewards' own parsers."""

import dataclasses
import json
import math
import re

import numpy as np
import pytest

from spatial_jax import config as C
from spatial_jax.data import synthetic as syn
from spatial_jax.data.prompts import THINK_BOXES
from spatial_jax.data.sample import LETTERS
from spatial_jax.data.synthetic.scene import _apart

ALL = syn.SyntheticConfig(question_types=syn.QUESTION_TYPES)


@pytest.fixture(scope="module")
def samples():
    return syn.generate(ALL, "train", 160)


def _objects(s):
    return {o["label"]: o for o in s.meta["objects"]}


def _center(o):
    x1, y1, x2, y2 = o["bbox"]
    return (x1 + x2) / 2, (y1 + y2) / 2


def _area(o):
    x1, y1, x2, y2 = o["bbox"]
    return (x2 - x1) * (y2 - y1)


def _iou(a, b):
    iw = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    u = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
    return iw * ih / u


def _expected_answer(s):
    """The gold recomputed from the object boxes and the question text alone (independent of the generator)."""
    objs = _objects(s)
    q = s.question
    if s.category == "relative_position":
        a, b = re.fullmatch(r"Where is the (.+) relative to the (.+)\?", q).groups()
        (ax, ay), (bx, by) = _center(objs[a]), _center(objs[b])
        dx, dy = ax - bx, ay - by
        assert max(abs(dx), abs(dy)) >= 2 * min(abs(dx), abs(dy)), "ambiguous direction asked"
        return ("left" if dx < 0 else "right") if abs(dx) > abs(dy) else ("above" if dy < 0 else "below")
    if s.category == "size":
        which = re.fullmatch(r"Which of these objects is the (largest|smallest)\?", q).group(1)
        present = [o for o in s.options if o in objs]
        pick = max if which == "largest" else min
        return pick(present, key=lambda lab: _area(objs[lab]))
    if s.category == "nearest":
        ref = re.fullmatch(r"Which object is closest to the (.+)\?", q).group(1)
        rx, ry = _center(objs[ref])
        others = [lab for lab in objs if lab != ref]
        return min(others, key=lambda lab: math.dist(_center(objs[lab]), (rx, ry)))
    if s.category == "counting":
        m = re.fullmatch(r"How many (\w+?)s are there in the image\?", q)
        if m:
            return str(sum(o["shape"] == m.group(1) for o in objs.values()))
        colour = re.fullmatch(r"How many (\w+) objects are there in the image\?", q).group(1)
        return str(sum(o["color"] == colour for o in objs.values()))
    a, b = re.match(r"What is the distance in pixels between the centres of the (.+) and the (.+)\?", q).groups()
    return math.dist(_center(objs[a]), _center(objs[b]))


def test_answers_recomputed_from_boxes(samples):
    seen = set()
    for s in samples:
        seen.add(s.category)
        expected = _expected_answer(s)
        if s.answer_type == "number":
            assert abs(s.answer - expected) <= 0.5 + 1e-9, s.question
        else:
            assert len(s.options) == 4 and len(set(s.options)) == 4
            assert s.options[LETTERS.index(s.answer)] == expected, (s.question, s.options, s.answer)
    assert seen == set(syn.QUESTION_TYPES)
    letters = [s.answer for s in samples if s.answer_type == "choice"]
    assert all(letters.count(x) > len(letters) / 10 for x in "ABCD"), "gold letters should be spread over A-D"


def test_boxes_inside_image_and_rendering_exact():
    cfg = syn.SyntheticConfig(width=80, height=64)
    for i in range(30):
        s = syn.make_sample(cfg, "heldout", i)
        img = s.image
        assert img.shape == (64, 80, 3) and img.dtype == np.uint8
        objs = s.meta["objects"]
        assert len({o["label"] for o in objs}) == len(objs)
        for o in objs:
            x1, y1, x2, y2 = o["bbox"]
            assert 0 <= x1 < x2 <= 80 and 0 <= y1 < y2 <= 64
            mask = np.all(img == np.array(syn.COLORS[o["color"]], np.uint8), axis=-1)
            same = [p["bbox"] for p in objs if p["color"] == o["color"]]
            inside = np.zeros_like(mask)
            for bx1, by1, bx2, by2 in same:
                inside[by1:by2, bx1:bx2] = True
            assert not (mask & ~inside).any(), "colour outside its objects' boxes"
            own = mask[y1:y2, x1:x2]
            rows, cols = np.nonzero(own)
            # the shape reaches every side of its box (a triangle's apex within one pixel of the top)
            assert rows.min() <= 1 and rows.max() == y2 - y1 - 1 and cols.min() == 0 and cols.max() == x2 - x1 - 1
        for b in s.gt_boxes:
            x1, y1, x2, y2 = b.bbox
            assert 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000 and all(float(c).is_integer() for c in b.bbox)
            assert syn.SyntheticConfig().min_validity <= b.validity <= 1.0


def test_deterministic_and_splits_disjoint():
    a = syn.make_sample(ALL, "train", 7)
    b = syn.make_sample(ALL, "train", 7)
    assert a.to_json("x.png") == b.to_json("x.png") and np.array_equal(a.image, b.image)
    c = syn.make_sample(syn.SyntheticConfig(question_types=syn.QUESTION_TYPES, seed=1), "train", 7)
    assert c.to_json("x.png") != a.to_json("x.png")
    key = lambda s: (s.question, str(s.meta["objects"]))
    train = {key(s) for s in syn.generate(ALL, "train", 60, render_image=False)}
    held = {key(s) for s in syn.generate(ALL, "heldout", 60, render_image=False)}
    assert len(train) == 60 and not train & held


def test_validity_scales_noise():
    exact = syn.SyntheticConfig(min_validity=1.0)
    for i in range(10):
        s = syn.make_sample(exact, "train", i, render_image=False)
        objs = _objects(s)
        for b in s.gt_boxes:
            assert b.validity == 1.0
            assert b.bbox == tuple(float(c) for c in syn.to_norm(objs[b.label]["bbox"], 96, 96))
    cfg = syn.SyntheticConfig(min_validity=0.0, box_noise=0.3)
    v, ious = [], []
    for s in syn.generate(cfg, "train", 150, render_image=False):
        objs = _objects(s)
        for b in s.gt_boxes:
            v.append(b.validity)
            ious.append(_iou(b.bbox, syn.to_norm(objs[b.label]["bbox"], 96, 96)))
    v, ious = np.array(v), np.array(ious)
    assert ious[v > 0.8].mean() > ious[v < 0.3].mean() + 0.1
    assert np.corrcoef(v, ious)[0, 1] > 0.3


def test_corruption_rate_kinds_and_displacement():
    cfg = syn.SyntheticConfig(corrupt_fraction=0.4)
    kinds = []
    for s in syn.generate(cfg, "train", 400, render_image=False):
        objs = _objects(s)
        records = s.meta["corruption"]
        assert [r["label"] for r in records] == s.meta["relevant"]
        kept = [r for r in records if r["kind"] != "removed"]
        assert len(kept) == len(s.gt_boxes)
        for r, b in zip(kept, s.gt_boxes):
            if r["kind"] == "relabelled":
                assert b.label != r["label"] and b.label in objs
                assert list(b.bbox) == r["box"]
            elif r["kind"] == "displaced":
                assert b.label == r["label"] and _iou(b.bbox, r["box"]) < 0.6
                assert (b.bbox[2] - b.bbox[0], b.bbox[3] - b.bbox[1]) == (
                    r["box"][2] - r["box"][0],
                    r["box"][3] - r["box"][1],
                )
            else:
                assert b.label == r["label"] and list(b.bbox) == r["box"]
        kinds.extend(r["kind"] for r in records)
    n = len(kinds)
    assert n > 800
    rate = sum(k != "none" for k in kinds) / n
    assert abs(rate - 0.4) < 0.05, rate  # ~4.5 standard deviations at n > 800
    for k in syn.CORRUPTIONS:
        assert kinds.count(k) > 0.08 * n, k
    clean = syn.generate(syn.SyntheticConfig(), "train", 50, render_image=False)
    assert all(r["kind"] == "none" for s in clean for r in s.meta["corruption"])


def test_displace_reaches_iou_bound():
    rng = np.random.default_rng(0)
    for _ in range(300):
        w, h = rng.integers(1, 500, size=2)
        x, y = rng.integers(0, 1000 - w), rng.integers(0, 1000 - h)
        box = (int(x), int(y), int(x + w), int(y + h))
        moved = syn.displace(rng, box, 0.6)
        assert _iou(moved, box) < 0.6
        assert 0 <= moved[0] < moved[2] <= 1000 and 0 <= moved[1] < moved[3] <= 1000


def test_scene_graph(samples):
    for s in samples:
        objs = _objects(s)
        ids = [o["id"] for o in s.scene["objects"]]
        assert len(ids) == len(set(ids))
        for o in s.scene["objects"]:
            assert re.fullmatch(r"[a-zA-Z_]+\.\d+", o["id"])
            label = o["id"].rsplit(".", 1)[0].replace("_", " ")
            assert o["bbox"] == objs[label]["bbox"]
        for r in s.scene["relationships"]:
            assert r["subject"] in ids and r["object"] in ids
        if s.category == "relative_position":
            (rel,) = s.scene["relationships"]
            assert rel["predicate"] == syn.PREDICATES[s.options[LETTERS.index(s.answer)]]


def test_references_parse_with_the_reward_parsers(samples):
    from spatial_jax.rewards import parse_harness, parse_scene
    from spatial_jax.rewards.parse_think import parse_think

    for s in samples:
        gold = s.answer if s.answer_type == "choice" else None
        core = parse_think(s.reference["spatialcore"])
        assert set(s.reference) == {"spatialcore", "prosr", "spatialthinker", "allospatial"}
        # ProSR (App. A.6): SpatialCORE's reasoning and answer without its box lines
        prosr = parse_think(s.reference["prosr"])
        assert not prosr.boxes and "bbox_2d" not in s.reference["prosr"] and prosr.answer == core.answer
        assert s.reference["spatialcore"].endswith(s.reference["prosr"])
        assert [b.label for b in core.valid_boxes] == s.meta["relevant"]
        assert len(core.valid_boxes) == len(core.boxes)
        if gold:
            assert core.well_formed_tail and core.answer == gold
        thinker = parse_scene.parse(s.reference["spatialthinker"])
        assert thinker.format_ok, thinker.errors
        assert len(thinker.objects) == len(s.scene["objects"])
        harness = parse_harness.parse(s.reference["allospatial"])
        assert harness.has_step(1) and harness.has_step(5)
        if gold:
            assert harness.answer.strip() == gold
        else:
            assert float(harness.answer) == s.answer


def test_references_earn_full_answer_reward():
    from spatial_jax.rewards import allospatial, prosr, spatialcore, spatialthinker

    mc = syn.generate(syn.SyntheticConfig(min_validity=1.0), "heldout", 6, render_image=False)
    num = syn.generate(syn.SyntheticConfig(question_types=("distance",)), "heldout", 3, render_image=False)
    core = spatialcore.score_batch([s.to_rollout(s.reference["spatialcore"]) for s in mc])
    for r in core:
        # exact boxes at validity 1: IoU 1, label similarity 1 -> 0.8 * (1 - 0.25) + 0.2 = 0.8 (eq 3, tau 0.25)
        assert r["r_ans"] == 1.0 and r["well_formed"] == 1.0 and r["r_spatial"] == pytest.approx(0.8), r
    for r in prosr.score_batch([s.to_rollout(s.reference["prosr"]) for s in mc]):
        assert r["r_acc"] == 1.0 and r["r_fmt"] == 1.0, r
    for s in mc:
        r = spatialthinker.score(s.to_rollout(s.reference["spatialthinker"]))
        assert r["reward"] > 0.95, r
    for s in mc + num:
        r = allospatial.score(s.to_rollout(s.reference["allospatial"]))
        assert r["accuracy"] == 1.0, r


def test_config_validation():
    with pytest.raises(ValueError, match="question_types"):
        syn.SyntheticConfig(question_types=("colour",))
    with pytest.raises(ValueError, match="corrupt_fraction"):
        syn.SyntheticConfig(corrupt_fraction=1.5)
    with pytest.raises(ValueError, match=r"width must lie in \[32, 4096\], got 16"):
        syn.SyntheticConfig(width=16)
    with pytest.raises(ValueError, match="split"):
        syn.make_sample(ALL, "test", 0)


GRID = syn.SyntheticConfig(width=128, height=128, grid=4, min_objects=2, max_objects=4, distinct_colors=True,
                           shuffle_options=False, question_types=("relative_position", "nearest", "counting"))


def test_grid_world_puts_each_object_in_its_own_cell_with_answers_from_the_boxes():
    for s in syn.generate(GRID, "train", 40):
        cells = set()
        for o in s.meta["objects"]:
            x1, y1, x2, y2 = o["bbox"]
            c, r = x1 // 32, y1 // 32
            assert (x1, y1, x2, y2) == (32 * c + 2, 32 * r + 2, 32 * c + 30, 32 * r + 30)
            cells.add((r, c))
        colours = [o["color"] for o in s.meta["objects"]]
        assert len(cells) == len(colours) == len(set(colours))
        assert 2 <= len(colours) <= 4
        assert s.options[LETTERS.index(s.answer)] == _expected_answer(s)
        assert list(s.options) == sorted(s.options)
        scene = [syn.SceneObject(o["shape"], o["color"], tuple(o["bbox"])) for o in s.meta["objects"]]
        assert np.array_equal(syn.render(scene, 128, 128), s.image)


def test_grid_and_colour_knobs_validated_and_defaults_unchanged():
    default = syn.SyntheticConfig()
    assert (default.grid, default.distinct_colors, default.shuffle_options) == (0, False, True)
    with pytest.raises(ValueError, match=r"grid must lie in \[0, 12\], got 13"):
        syn.SyntheticConfig(width=96, height=128, grid=13)
    with pytest.raises(ValueError, match="max_objects"):
        syn.SyntheticConfig(grid=2, max_objects=5)
    with pytest.raises(ValueError, match="max_objects"):
        syn.SyntheticConfig(distinct_colors=True, min_objects=2, max_objects=7)


def _box_lines(completion: str) -> list[dict]:
    return [json.loads(line) for line in completion.split("\n") if line.startswith("{")]


def test_reading_order_lists_the_question_boxes_top_to_bottom_then_left_to_right():
    reading = dataclasses.replace(GRID, box_order="reading")
    for i in range(40):
        asked, read = syn.make_sample(GRID, "train", i), syn.make_sample(reading, "train", i)
        assert (asked.question, asked.gt_boxes, asked.image.tobytes()) == (read.question, read.gt_boxes,
                                                                             read.image.tobytes())
        a, r = _box_lines(asked.reference["spatialcore"]), _box_lines(read.reference["spatialcore"])
        assert [b["label"] for b in a] == asked.meta["relevant"]  # the question's order
        assert sorted(map(json.dumps, a)) == sorted(map(json.dumps, r))  # the same boxes
        centres = [((b[1] + b[3]) / 2, (b[0] + b[2]) / 2) for b in (x["bbox_2d"] for x in r)]
        assert centres == sorted(centres)
        # the rest of the completion (reasoning, answer) is the question-order one
        tail = lambda c: c[c.index(syn.BOX_LEAD):]
        assert tail(asked.reference["spatialcore"]) == tail(read.reference["spatialcore"])
    with pytest.raises(ValueError, match="box_order"):
        C.from_dict(syn.SyntheticConfig, {"box_order": "random"})


def test_shapes_knob_limits_the_shapes_and_is_validated():
    one = dataclasses.replace(GRID, shapes=("square",))
    for s in syn.generate(one, "train", 30, render_image=False):
        assert {o["shape"] for o in s.meta["objects"]} == {"square"}
        assert all(opt.endswith(" square") for opt in s.options if opt.split()[0] in syn.COLORS)
    assert syn.SyntheticConfig().shapes == syn.SHAPES
    for bad in ((), ("hexagon",), ("square", "square")):
        with pytest.raises(ValueError, match="shapes"):
            syn.SyntheticConfig(shapes=bad)


def test_anchor_is_in_every_scene_and_every_relative_question_is_about_it():
    anchored = dataclasses.replace(GRID, anchor="blue", question_types=("relative_position",))
    for s in syn.generate(anchored, "train", 40):
        colours = [o["color"] for o in s.meta["objects"]]
        assert colours.count("blue") == 1 and colours[0] == "blue"
        subject, reference = s.meta["relevant"]
        assert reference == s.meta["objects"][0]["label"] and subject != reference
        assert s.question.endswith(f"relative to the {reference}?")
        assert s.options[LETTERS.index(s.answer)] == _expected_answer(s)
    assert {syn.make_sample(anchored, "train", i).answer for i in range(40)} == set(LETTERS[:4])
    # without an anchor the world is as it was: the same scenes from the same seeds
    assert syn.make_sample(GRID, "train", 3).question == syn.make_sample(
        dataclasses.replace(GRID, anchor=""), "train", 3).question
    with pytest.raises(ValueError, match="anchor"):
        syn.SyntheticConfig(anchor="grey")
    syn.SyntheticConfig(min_objects=2, max_objects=17)
    with pytest.raises(ValueError, match="max_objects"):  # one object of the anchor's colour, 5 x 3 of the others
        syn.SyntheticConfig(anchor="red", min_objects=2, max_objects=17)


def test_biased_annotator_mirrors_the_targets_of_its_colours_and_leaves_the_truth():
    base = dataclasses.replace(GRID, anchor="blue", question_types=("relative_position", "counting"))
    biased = dataclasses.replace(base, mirror_colors=("green", "red"), mirror_rate=0.6)
    mirrored = biased_questions = 0
    for i in range(200):
        s, t = syn.make_sample(biased, "train", i), syn.make_sample(base, "train", i)
        # image, question, gold answer and pseudo-GT are the true scene's, and the same scene as without the bias
        assert (s.question, s.answer, s.gt_boxes, s.meta["objects"]) == (t.question, t.answer, t.gt_boxes,
                                                                        t.meta["objects"])
        assert np.array_equal(s.image, t.image)
        about = {o["color"] for o in s.meta["objects"] if o["label"] in s.meta["relevant"]}
        biased_questions += bool(about & {"green", "red"})
        if not s.meta["mirrored"]:
            assert s.reference == t.reference and s.meta["annotated_answer"] == s.answer
            continue
        mirrored += 1
        assert about & {"green", "red"}
        target = s.reference[THINK_BOXES.reference_key]
        lines = [json.loads(line) for line in target.splitlines() if line.startswith("{")]
        true = {o["label"]: syn.to_norm(o["bbox"], 128, 128) for o in s.meta["objects"]}
        for line in lines:  # the other column: x mirrored about the centre, y kept
            x1, y1, x2, y2 = true[line["label"]]
            assert line["bbox_2d"] == [1000 - x2, y1, 1000 - x1, y2]
        letter = target.rsplit("\n", 1)[-1]
        swap = {"left": "right", "right": "left"}
        gold = s.options[LETTERS.index(s.answer)]
        assert s.options[LETTERS.index(letter)] == (swap.get(gold, gold) if s.category == "relative_position"
                                                    else gold)
        assert s.meta["annotated_answer"] == letter  # the answer every format's target gives
    # about 0.6 of the questions about a green or red object
    assert 0.45 * biased_questions < mirrored < 0.75 * biased_questions
    with pytest.raises(ValueError, match="mirror_colors"):
        syn.SyntheticConfig(mirror_colors=("grey",))
    with pytest.raises(ValueError, match="mirror_rate"):
        syn.SyntheticConfig(mirror_rate=1.5)


def test_language_prior_skews_training_answers_only_by_choosing_true_scenes():
    base = dataclasses.replace(GRID, grid=2, width=64, height=64, min_objects=2, max_objects=2, anchor="blue",
                               question_types=("relative_position",))
    prior = dataclasses.replace(base, prior_colors=("red", "green"), prior_rate=0.7)
    for split, low, high in (("train", 0.62, 0.78), ("heldout", 0.15, 0.35)):
        named = left = 0
        for i in range(600):
            s = syn.make_sample(prior, split, i, render_image=i < 40)
            gold = s.options[LETTERS.index(s.answer)]
            assert gold == _expected_answer(s)  # the answer is the true one of the objects' boxes
            if i < 40:  # and the image shows those objects
                scene = [syn.SceneObject(o["shape"], o["color"], tuple(o["bbox"])) for o in s.meta["objects"]]
                assert np.array_equal(syn.render(scene, 64, 64), s.image)
            about = {o["color"] for o in s.meta["objects"] if o["label"] in s.meta["relevant"]}
            if about & {"red", "green"}:
                named += 1
                left += gold == "left"
                assert syn.names_prior(prior, s) and syn.prior_is_wrong(prior, s) == (gold != "left")
            else:  # a question the prior does not name is the world's own sample
                assert not syn.names_prior(prior, s) and not syn.prior_is_wrong(prior, s)
                t = syn.make_sample(base, split, i, render_image=False)
                assert (s.question, s.answer, s.gt_boxes, s.reference) == (t.question, t.answer, t.gt_boxes,
                                                                          t.reference)
        assert named > 150 and low < left / named < high, (split, left, named)
    # the held-out split is the world without the prior, sample for sample
    assert syn.make_sample(prior, "heldout", 7).reference == syn.make_sample(base, "heldout", 7).reference
    assert syn.SyntheticConfig().prior_colors == ()
    for bad, match in (({"prior_colors": ("grey",)}, "prior_colors"),
                       ({"prior_colors": ("red", "red")}, "prior_colors"),
                       ({"prior_answer": "up"}, "prior_answer"), ({"prior_rate": 1.5}, "prior_rate"),
                       ({"prior_colors": ("red",), "question_types": ("counting",)}, "question_types")):
        with pytest.raises(ValueError, match=match):
            syn.SyntheticConfig(**bad)


def test_letter_reasoning_boxes_writes_the_box_lines_before_the_argument_and_one_letter():
    boxes = dataclasses.replace(GRID, letter_reasoning="boxes")
    for i in range(10):
        s, t = syn.make_sample(boxes, "train", i, render_image=False), syn.make_sample(GRID, "train", i, False)
        letter = s.reference["prosr"]
        assert letter == s.reference[THINK_BOXES.reference_key]  # box lines, lead, argument, </think>, letter
        assert letter.endswith(f"</think>\n{s.answer}") and _box_lines(letter)
        assert not _box_lines(t.reference["prosr"]) and t.reference["prosr"].startswith(("Centres", "Widths", "Match"))
        assert letter.endswith(t.reference["prosr"])  # the same argument and letter after the boxes
        assert (s.question, s.answer, s.gt_boxes) == (t.question, t.answer, t.gt_boxes)
    with pytest.raises(ValueError, match="letter_reasoning"):
        C.from_dict(syn.SyntheticConfig, {"letter_reasoning": "prose"})


def _render_meta(s):
    scene = [syn.SceneObject(o["shape"], o["color"], tuple(o["bbox"])) for o in s.meta["objects"]]
    return syn.render(scene, *s.image_size)


@pytest.mark.parametrize("grid", [2, 0])
def test_distractors_add_unnamed_objects_and_leave_the_question_its_answer_and_reference_scene(grid):
    """SpatialThinker's over-generation needs objects the question does not name: each scene gets exactly
    `distractors` more, drawn, with labels of their own, and listed in the observation; the question, answer,
    pseudo-GT and reference scene graph (the question's objects, which the count term counts) are the world's."""
    base = syn.SyntheticConfig(width=64, height=64, grid=grid, min_objects=2, max_objects=2, distinct_colors=True,
                               anchor="blue", question_types=("relative_position", "distance"))
    world = dataclasses.replace(base, distractors=2)
    for i in range(30):
        s, t = syn.make_sample(world, "train", i), syn.make_sample(base, "train", i)
        assert (s.question, s.answer, s.gt_boxes, s.scene) == (t.question, t.answer, t.gt_boxes, t.scene)
        assert s.meta["objects"][:2] == t.meta["objects"] and len(s.meta["objects"]) == 4
        labels = [o["label"] for o in s.meta["objects"]]
        extra = labels[2:]
        assert len(set(labels)) == 4 and not set(extra) & set(s.meta["relevant"])
        assert all(o["color"] != "blue" for o in s.meta["objects"][2:]) and len({o["color"] for o in
                                                                                    s.meta["objects"]}) == 4
        assert not any(label in s.question for label in extra)
        assert np.array_equal(_render_meta(s), s.image)  # the image shows every object, distractors included
        boxes = [o["bbox"] for o in s.meta["objects"]]
        assert all(_apart(a, b, 2) for k, a in enumerate(boxes) for b in boxes[k + 1:])
        assert s.category != "relative_position" or s.options[LETTERS.index(s.answer)] == _expected_answer(s)
        assert "The image shows 4 objects" in s.reference["spatialthinker"]
        assert len(json.loads(s.reference["spatialthinker"].split("<scene>\n")[1].split("\n</scene>")[0])[
            "objects"]) == len(s.meta["relevant"])
    for bad, match in (({"distractors": 5}, "distractors"), ({"distractors": -1}, "distractors"),
                       ({"question_types": ("counting",)}, "question_types")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(world, **bad)
    assert syn.SyntheticConfig().distractors == 0


def test_hard_images_fade_and_blur_a_share_of_questions_and_keep_them_true():
    """ProSR's prior pays where the image is hard to read: with hard_rate r, a coin independent of the scene picks
    ~r of the questions in both splits (held-out answers stay balanced); their images keep the objects where they
    are, faded toward the background with noise, and every answer, box and reference stays the world's."""
    base = syn.SyntheticConfig(width=64, height=64, grid=2, min_objects=2, max_objects=2, distinct_colors=True,
                               anchor="blue", question_types=("relative_position",), prior_colors=("red",),
                               prior_rate=0.7)
    world = dataclasses.replace(base, hard_rate=0.4, hard_contrast=0.2, hard_noise=24.0)
    for split in ("train", "heldout"):
        hard, left = [], []
        for i in range(500):
            s = syn.make_sample(world, split, i, render_image=i < 40)
            t = syn.make_sample(base, split, i, render_image=i < 40)
            assert (s.question, s.answer, s.gt_boxes, s.reference) == (t.question, t.answer, t.gt_boxes,
                                                                      t.reference)
            hard.append(s.meta["hard"])
            if s.meta["hard"] and syn.names_prior(world, s):
                left.append(s.options[LETTERS.index(s.answer)] == "left")
            if i >= 40:
                continue
            if not s.meta["hard"]:
                assert np.array_equal(s.image, t.image)
                continue
            background = np.asarray(syn.BACKGROUND, np.float64)
            for o in s.meta["objects"]:  # each object is still there, in its own colour, faded
                x1, y1, x2, y2 = o["bbox"]
                shape = np.any(t.image[y1:y2, x1:x2] != syn.BACKGROUND, axis=-1)  # its pixels in the clear image
                seen = s.image[y1:y2, x1:x2][shape].mean(0) - background
                want = 0.2 * (np.asarray(syn.COLORS[o["color"]]) - background)
                assert np.all(np.abs(seen - want) < 5 + 0.05 * np.abs(want)), (o, seen, want)
            residual = s.image.astype(np.float64) - (background + 0.2 * (t.image - background))
            assert 20 < residual.std() < 28  # the noise (clipping at 0 and 255 trims it a little)
        # 500 coins: 3 standard errors of a share of 0.4 are 0.066
        assert abs(np.mean(hard) - 0.4) < 0.066, split
        if split == "heldout":  # the hard held-out questions are as balanced as the split: "left" ~1 in 4 or 5
            assert len(left) > 30 and np.mean(left) < 0.4, left
        else:  # the prior holds among the hard training questions too
            assert np.mean(left) > 0.55, left
    assert "hard" not in syn.make_sample(base, "train", 0).meta  # the world without them is unchanged
    for bad in ({"hard_rate": 1.5}, {"hard_contrast": 0.0}, {"hard_noise": -1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            dataclasses.replace(world, **bad)
