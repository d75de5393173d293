"""Real datasets as users bring them, second pass (issue 53): framework defaults, short text golds scored by every
method, golds read as their text before their letter, splits a copy does not have, the pixel bound on embedded
pictures, duplicate ids, paths leaving a copy, and the bad-row policy in `data check` and in training's preflight."""

from __future__ import annotations

import json
from pathlib import Path

import layout_copies as L
import numpy as np
import pytest

from spatial_jax.cli import main
from spatial_jax.data.sample import DatasetError
from spatial_jax.data.sources import open_spec
from spatial_jax.records import Rollout
from spatial_jax.rewards import allospatial, prosr, spatialcore, spatialthinker
from spatial_jax.rewards.text import normalise_short_answer, short_answer_score


def _rows(spec, capsys, n=50):
    assert main(["data", "show", spec, "-n", str(n), "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _check(spec, capsys, *overrides):
    rc = main(["data", "check", spec, *overrides])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    return rc, json.loads(lines[0]), lines[1:], err


def _easyr1_parquet(root: Path, rows: list[dict]) -> str:
    """EasyR1's reference sets as the Hub holds them (hiyouga/geometry3k: data/train-*.parquet with `problem`,
    `answer` and `images` as embedded image structs); EasyR1's examples/config.yaml reads them with prompt_key
    problem, answer_key answer, image_key images."""
    L._parquet(rows, root / "data" / "train-00000-of-00001.parquet")
    return f"easyr1:{root}"


def _image(seed=0, size=(24, 32)):
    return {"bytes": L.png(np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)), "path": None}


# --- short text answers: SPEC section 10's normalised match -------------------------------------------------------

@pytest.mark.parametrize("pred,gold,score", [
    ("The left.", "left", 1.0), ("  LEFT ", "Left", 1.0), ("an apple!", "Apple", 1.0), ("(left)", "left", 1.0),
    ("left side", "left", 0.0), ("right", "left", 0.0), ("3", "3.0", 1.0), ("-3", "3", 0.0), ("3.", "3", 1.0),
    ("the", "the", 0.0), (None, "left", 0.0), ("", "left", 0.0), ("theatre", "the atre", 0.0)])
def test_short_answer_score_pinned(pred, gold, score):
    assert short_answer_score(pred, gold) == score


def test_short_answer_numbers_use_the_methods_number_score():
    assert short_answer_score("2.5", "2", lambda p, g: 0.5) == 0.5
    assert short_answer_score("2", "0", lambda p, g: 1 / g) == 0.0  # a zero gold compares exactly, never divides
    assert normalise_short_answer("  The  Red   Cube. ") == "red cube"


COMPLETIONS = {  # method -> (a completion whose final answer is `the Left.`, the score key of its accuracy)
    "spatialcore": ("<think>the cube is on the left</think> the Left.", "r_ans"),
    "prosr": ("<think>the cube is on the left</think> the Left.", "r_acc"),
    "spatialthinker": ('<observe>x</observe><scene>{"objects": [], "relationships": []}</scene><think>t</think>'
                       "<answer>the Left.</answer>", "accuracy"),
    "allospatial": ("Step1: Visual Clues: a cube.\nStep5: Final Answer <Answer>the Left.</Answer>", "accuracy_ungated"),
}
SCORERS = {"spatialcore": lambda r: spatialcore.score_batch(r), "prosr": lambda r: prosr.score_batch(r),
           "spatialthinker": lambda r: spatialthinker.score_batch(r),
           "allospatial": lambda r: [allospatial.score(x) for x in r]}


@pytest.mark.parametrize("method", list(COMPLETIONS))
def test_every_method_rewards_a_text_gold_by_its_normalised_match(method):
    completion, key = COMPLETIONS[method]
    ros = [Rollout(id=str(k), completion=completion, answer=gold, answer_type="text", image_size=(100, 100))
           for k, gold in enumerate(("left", "LEFT", "right", "left of the cube"))]
    scores = [s[key] for s in SCORERS[method](ros)]
    assert scores == [1.0, 1.0, 0.0, 0.0], (method, scores)
    # the same gold without the text type is read as SPEC 2 / 5 read a letter: never credited for this answer
    as_letter = SCORERS[method]([Rollout(id="x", completion=completion, answer="left", image_size=(100, 100))])
    assert as_letter[0][key] == 0.0


def test_a_text_gold_asks_for_a_one_line_answer_not_a_letter():
    ok = Rollout(id="a", completion="<think>r</think> left", answer="left", answer_type="text")
    two_lines = Rollout(id="b", completion="<think>r</think> left\nbecause", answer="left", answer_type="text")
    fmt = [s["format"] for s in spatialcore.score_batch([ok, two_lines])]
    assert fmt[0] > 0 and fmt[1] == 0
    assert [s["r_fmt"] for s in prosr.score_batch([ok, two_lines])] == [1.0, 0.0]


def test_rollout_records_carry_the_text_type():
    r = Rollout.from_json({"id": "a", "completion": "x", "answer": "left", "answer_type": "text"})
    assert r.answer_type == "text"
    with pytest.raises(Exception, match="answer_type"):
        Rollout.from_json({"id": "a", "completion": "x", "answer": "left", "answer_type": "prose"})
    with pytest.raises(Exception, match="non-empty"):
        Rollout.from_json({"id": "a", "completion": "x", "answer": 3, "answer_type": "text"})


# --- each framework's own defaults; text golds as the sets hold them ---------------------------------------------

def test_easyr1_as_published_reads_with_no_key_given(tmp_path, capsys):
    """hiyouga/geometry3k's columns (problem / answer / images) with a short text answer, a numeric one and a
    lettered one; a JSON-lines copy with `videos` next to its `videos/` folder reads the same way (EasyR1 joins
    relative media paths to image_dir, here the copy's folder)."""
    spec = _easyr1_parquet(tmp_path / "geo", [
        {"problem": "<image>Which side is the cube on?", "answer": "Left", "images": [_image(0)]},
        {"problem": "<image>Find x.", "answer": "12", "images": [_image(1)]},
        {"problem": "<image>Which is larger?\nA. the cube\nB. the ball", "answer": "B", "images": [_image(2)]}])
    rows = _rows(spec, capsys)
    assert [(r["answer"], r["answer_type"]) for r in rows] == [("Left", "text"), (12, "number"), ("B", "choice")]
    assert [r["images"] for r in rows] == [[{"width": 32, "height": 24}]] * 3
    frames = [np.full((16, 16, 3), 40 * k, np.uint8) for k in range(4)]
    L.mp4(frames, tmp_path / "v" / "videos" / "clip.mp4")
    L._jsonl([{"problem": "<video>How many frames show a cube?", "answer": "3", "videos": ["videos/clip.mp4"]}],
             tmp_path / "v" / "train.jsonl")
    (row,) = _rows(f"easyr1:{tmp_path / 'v' / 'train.jsonl'}", capsys)
    assert row["video"]["frames"] == 4 and row["answer"] == 3


def test_check_counts_choice_numeric_and_text_rows(tmp_path, capsys):
    spec = _easyr1_parquet(tmp_path / "geo", [
        {"problem": "<image>Where?", "answer": "left", "images": [_image(0)]},
        {"problem": "<image>How far?", "answer": "1.5", "images": [_image(1)]},
        {"problem": "<image>Which?\nA. x\nB. y", "answer": "A", "images": [_image(2)]}])
    rc, counts, fails, _ = _check(spec, capsys)
    assert rc == 0 and not fails
    assert (counts["multiple-choice"], counts["numeric"], counts["text"]) == (1, 1, 1)


# --- golds read right or refused ------------------------------------------------------------------------------

def _gold_of(tmp_path, options, answer):
    L._jsonl([{"problem": "<image>Which?\n" + "\n".join(f"{'ABCD'[k]}. {o}" for k, o in enumerate(options)),
               "answer": answer, "images": ["p.png"]}], tmp_path / "train.jsonl")
    L._save(np.zeros((8, 8, 3), np.uint8), tmp_path / "p.png")
    return open_spec(f"easyr1:{tmp_path / 'train.jsonl'}")[0]


@pytest.mark.parametrize("options,answer,letter", [
    (["The dog", "A cat"], "A cat", "B"),  # the option's text, not the letter it starts with
    (["right", "left"], "(B) left", "B"), (["right", "left"], "B. Left.", "B"), (["right", "left"], "B", "B"),
    (["1", "2", "3"], 2, "B"), (["1", "2", "3"], "2", "B"), (["1.0", "2.5"], 2.5, "B"),  # numbers by value
])
def test_a_gold_is_its_options_text_first(tmp_path, options, answer, letter):
    assert _gold_of(tmp_path, options, answer).answer == letter


@pytest.mark.parametrize("options,answer,message", [
    (["right", "left"], "(B) right", "names option B, which reads 'left'"),
    (["left", "left", "up"], "left", "is the text of options A, B, which read the same"),
    (["up", "down", "left"], 1, "is none of the 3 options"),  # an integer is an index only where a layout says so
    (["up", "down"], "E", "is none of the 2 options"),
])
def test_a_gold_that_contradicts_its_options_is_a_bad_row(tmp_path, options, answer, message):
    with pytest.raises(DatasetError, match=message):
        _gold_of(tmp_path, options, answer)


# --- splits, folders and paths -------------------------------------------------------------------------------

def test_a_split_the_copy_does_not_have_is_refused_naming_its_splits(tmp_path, capsys):
    ss = L.samples(2)
    spec = L.trl(tmp_path / "t", ss)  # data/train-00000-of-00001.parquet
    L._parquet([{"prompt": "x"}], tmp_path / "t" / "data" / "val-00000-of-00001.parquet")
    assert len(open_spec(spec)) == 2 and len(open_spec(f"trl:{tmp_path / 't'}:val")) == 1
    for spec in (f"trl:{tmp_path / 't'}:validation", f"verl:{tmp_path / 't'}:test"):
        with pytest.raises(DatasetError, match=r"no split '(validation|test)'; the copy's files name the splits "
                                               r"\['train', 'val'\]"):
            open_spec(spec)
    (tmp_path / "t" / "data" / "train-00000-of-00001.parquet").unlink()  # the default split absent: refused too
    with pytest.raises(DatasetError, match=r"no split 'train'; .*\['val'\]"):
        open_spec(f"trl:{tmp_path / 't'}")


def test_a_folder_of_parquet_and_json_lines_is_refused_not_half_read(tmp_path):
    L._parquet([{"problem": "x"}], tmp_path / "rows.parquet")
    L._jsonl([{"problem": "y"}], tmp_path / "more.jsonl")
    with pytest.raises(DatasetError, match="holds both parquet .* and JSON-lines .* one kind would be ignored"):
        open_spec(f"easyr1:{tmp_path}")


def test_a_media_path_leaving_the_copy_is_a_bad_row(tmp_path):
    L._save(np.zeros((8, 8, 3), np.uint8), tmp_path / "outside.png")
    L._jsonl([{"problem": "<image>Where?", "answer": "left", "images": ["../outside.png"]}],
             tmp_path / "copy" / "train.jsonl")
    with pytest.raises(DatasetError, match=r"train.jsonl:1: field 'images\[0\]': image path '../outside.png' leaves"):
        open_spec(f"easyr1:{tmp_path / 'copy' / 'train.jsonl'}")[0]


# --- data check: pixel bound, duplicate ids, empty sources, the bad-row policy -----------------------------------

def test_check_holds_embedded_pictures_to_the_pixel_bound(tmp_path, capsys):
    spec = _easyr1_parquet(tmp_path / "g", [{"problem": "<image>Where?", "answer": "left", "images": [_image(0)]}])
    assert _check(spec, capsys)[0] == 0
    rc, counts, fails, _ = _check(spec, capsys, "data.max_image_pixels=700")
    assert rc == 1 and fails == [f"FAIL {tmp_path}/g/data/train-00000-of-00001.parquet row 0: embedded image of "
                                 "32x24 = 768 pixels, over data.max_image_pixels = 700"]


def test_check_names_duplicate_ids_and_refuses_an_empty_source(tmp_path, capsys):
    L._save(np.zeros((8, 8, 3), np.uint8), tmp_path / "p.png")
    row = {"id": "q1", "problem": "<image>Where?", "answer": "left", "images": ["p.png"]}
    L._jsonl([row, row], tmp_path / "train.jsonl")
    rc, counts, fails, _ = _check(f"easyr1:{tmp_path / 'train.jsonl'}", capsys)
    assert rc == 1 and fails == [f"FAIL {tmp_path}/train.jsonl:2: duplicate id 'q1', first at {tmp_path}/train.jsonl:1"]
    (tmp_path / "empty.jsonl").write_text("")
    rc, counts, _, err = _check(f"easyr1:{tmp_path / 'empty.jsonl'}", capsys)
    assert rc == 1 and counts["rows"] == 0 and "holds no row" in err


def _with_bad_rows(root: Path, good: int, bad: int) -> str:
    L._save(np.zeros((8, 8, 3), np.uint8), root / "p.png")
    rows = [{"id": f"g{k}", "problem": "<image>Where?", "answer": "left", "images": ["p.png"]} for k in range(good)]
    rows += [{"id": f"b{k}", "problem": "<image>Where?", "images": ["p.png"]} for k in range(bad)]  # no gold
    rows += [{"id": "g0", "problem": "<image>Where?", "answer": "up", "images": ["p.png"]}] if bad else []
    L._jsonl(rows, root / "train.jsonl")
    return f"easyr1:{root / 'train.jsonl'}"


def test_skip_counts_bad_rows_by_reason_and_the_share_limit_refuses(tmp_path, capsys):
    spec = _with_bad_rows(tmp_path, good=20, bad=2)
    rc, counts, fails, err = _check(spec, capsys, "data.bad_rows=skip", "data.max_bad_share=0.2")
    assert rc == 0 and counts["skipped"] == {"field answer": 2, "duplicate id": 1} and len(fails) == 3
    assert "training skips 3 of 23 rows" in err
    rc, counts, fails, err = _check(spec, capsys, "data.bad_rows=skip")  # 3 of 23 is over the default 1%
    assert rc == 1 and "3 of 23 rows are bad (13.04%), over data.max_bad_share = 0.01" in err
    assert _check(spec, capsys)[0] == 1  # fail, the default: every bad row listed, status 1


def test_training_skips_the_screened_rows_and_refuses_over_the_share(tmp_path):
    from spatial_jax import config as C
    from spatial_jax.data.pipeline import data_source
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.train import open_inputs

    spec = _with_bad_rows(tmp_path, good=20, bad=2)
    base = [f"run_dir={tmp_path / 'run'}", f"data.train={spec}", "sft.steps=0", "eval.after_rl=false"]
    cfg = C.load(TrainConfig, None, [*base, "data.bad_rows=skip", "data.max_bad_share=0.2"])
    assert open_inputs(cfg) == {"data.train": {"field answer": 2, "duplicate id": 1}}
    kept = data_source(cfg.data, spec)
    assert len(kept) == 20 and [s.id for s in kept] == [f"g{k}" for k in range(20)]
    with pytest.raises(DatasetError, match=r"data.train: 3 of 23 rows are bad \(13.04%\), over data.max_bad_share"):
        open_inputs(C.load(TrainConfig, None, [*base, "data.bad_rows=skip"]))
    with pytest.raises(DatasetError, match=r"data.train: .*train.jsonl:21: missing field 'answer'"):
        open_inputs(C.load(TrainConfig, None, base))


# --- text-only rows train beside image rows ---------------------------------------------------------------------

def text_only_copy(root: Path, bad: bool = False) -> str:
    """EasyR1 JSON lines mixing image rows with text-only ones (`images: []`, or no images value at all), as verl's
    and EasyR1's RLHFDataset accept them (a row without the image key is a text prompt); text golds on the latter."""
    ss = L.samples(2)
    rows = []
    for i, s in enumerate(ss):
        L._save(s.image, root / f"{i}.png")
        rows.append({"id": f"i{i}", "problem": "<image>" + s.question + "\n" + L.lettered(s), "answer": s.answer,
                     "images": [f"{i}.png"], "cot": L.cot(s)})
    talk = ('<observe>no picture</observe><scene>{"objects": [], "relationships": []}</scene><think>snow is white'
            "</think><answer>white</answer>")
    rows.append({"id": "t0", "problem": "What colour is snow? One word.", "answer": "White", "images": [], "cot": talk})
    rows.append({"id": "t1", "problem": "What colour is fresh snow?", "answer": "white", "cot": talk})
    if bad:
        rows.append({"id": "t2", "problem": "What colour is coal?", "cot": talk})  # no gold
    L._jsonl(rows, root / "train.jsonl")
    return f"easyr1:{root / 'train.jsonl'}?reference=cot"


def test_text_only_rows_are_read_and_counted(tmp_path, capsys):
    spec = text_only_copy(tmp_path)
    rows = _rows(spec, capsys)
    assert [len(r["images"]) for r in rows] == [1, 1, 0, 0] and [r["video"] for r in rows] == [None] * 4
    assert [r["answer_type"] for r in rows[2:]] == ["text", "text"]
    rc, counts, _, _ = _check(spec, capsys)
    assert rc == 0 and counts["text-only"] == 2 and counts["text"] == 2


def test_spatialthinker_states_no_image_size_for_a_text_only_row(tmp_path):
    from spatial_jax.data.prompts import SCENE_GRAPH, user_text

    rows = {s.id: s for s in open_spec(text_only_copy(tmp_path))}
    assert "Image size" not in user_text(rows["t0"], SCENE_GRAPH)
    with pytest.raises(ValueError, match="image size, which is unknown"):  # a picture's size is never left out
        user_text(rows["i0"], SCENE_GRAPH)


def test_a_text_only_row_round_trips_through_the_projects_jsonl(tmp_path):
    from spatial_jax.data.jsonl import read_jsonl

    (sample,) = [s for s in open_spec(text_only_copy(tmp_path)) if s.id == "t0"]
    (tmp_path / "rows.jsonl").write_text(json.dumps(sample.to_json()) + "\n")
    (back,) = read_jsonl(tmp_path / "rows.jsonl")
    assert (back.image, back.images, back.video) == (None, (), None)
    assert (back.question, back.answer, back.answer_type) == (sample.question, "White", "text")
