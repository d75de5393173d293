"""The data-source registry (data/sources/__init__.py) as configs and command lines give it specs: a bare path,
`FORMAT:PATH[:split][?field=column&...]`, `synthetic:<split>:<n>` and `mix:W*SPEC|...`; each parsed whole, each
malformed one refused by its full message; what a spec opens (its columns over data.columns, its pictures checked or
not, a mixture's parts drawn per seed), the paths it reads and the outputs it refuses to write into a copy."""

import hashlib
import json
import os
from pathlib import Path

import layout_copies as L
import pytest

from spatial_jax.config import ConfigError
from spatial_jax.data.sample import DatasetError
from spatial_jax.data.sources import (
    Mixture,
    Spec,
    open_spec,
    parse_mixture,
    parse_spec,
    refuse_writing_into_copies,
    spec_digest,
    spec_paths,
)
from spatial_jax.data.synthetic import SyntheticConfig
from spatial_jax.digests import sha256
from spatial_jax.records import brief

KNOWN = "jsonl, synthetic, verl, easyr1, trl, hf-disk, stvqa7k, omnispatial-train, mindcube-train, spar7m, vsi590k, mix"


def refusal(fn, *args, **kw) -> str:
    with pytest.raises(DatasetError) as e:
        fn(*args, **kw)
    return str(e.value)


# --- specs ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, parsed", [
    ("data/stvqa_7k.jsonl", Spec("jsonl", "data/stvqa_7k.jsonl")),
    ("/data/runs:v2/rows.jsonl", Spec("jsonl", "/data/runs:v2/rows.jsonl")),  # a path with a colon
    ("C:/data/rows.jsonl", Spec("jsonl", "C:/data/rows.jsonl")),
    ("Verl:/data/train.parquet", Spec("jsonl", "Verl:/data/train.parquet")),
    ("2024:/data/rows.jsonl", Spec("jsonl", "2024:/data/rows.jsonl")),
    ("jsonl:/data/rows.jsonl", Spec("jsonl", "/data/rows.jsonl")),
    ("synthetic:train:8", Spec("synthetic", "train:8")),
    ("mix:1*a.jsonl|2*verl:/d/v:val?question=q", Spec("mix", "1*a.jsonl|2*verl:/d/v:val?question=q")),
    ("verl:/data/geo3k/train.parquet", Spec("verl", "/data/geo3k/train.parquet")),
    ("stvqa7k:/d/STVQA-7K:val", Spec("stvqa7k", "/d/STVQA-7K", "val")),
    ("hf-disk:/d/saved:validation_2.v-1", Spec("hf-disk", "/d/saved", "validation_2.v-1")),
    ("omnispatial-train:/d/OmniSpatial-train.zip", Spec("omnispatial-train", "/d/OmniSpatial-train.zip")),
    ("easyr1:/d/my:copy/train.jsonl", Spec("easyr1", "/d/my:copy/train.jsonl")),  # no split holds a slash
    ("easyr1:/d/copy:", Spec("easyr1", "/d/copy:")),
    ("stvqa7k:/mnt/d:shared/STVQA-7K:val", Spec("stvqa7k", "/mnt/d:shared/STVQA-7K", "val")),
    ("hf-disk:/d/saved:Validation", Spec("hf-disk", "/d/saved", "Validation")),
    ("easyr1::val", Spec("easyr1", ":val")),
    ("stvqa7k:/d/STVQA-7K:val?question=question_with_options&&answer=answer_option_text_only&",
     Spec("stvqa7k", "/d/STVQA-7K", "val", ("question=question_with_options", "answer=answer_option_text_only"))),
    ("easyr1:/d/train.jsonl?image_dir=/d/img", Spec("easyr1", "/d/train.jsonl", "", ("image_dir=/d/img",))),
    ("spar7m:/d/SPAR-7M?", Spec("spar7m", "/d/SPAR-7M")),
])
def test_a_spec_is_parsed_into_format_path_split_and_columns(spec, parsed):
    assert parse_spec(spec) == parsed


@pytest.mark.parametrize("spec, message", [
    ("", f"empty data source; give a JSONL path or FORMAT:PATH (formats: {KNOWN})"),
    ("  \t", f"empty data source; give a JSONL path or FORMAT:PATH (formats: {KNOWN})"),
    (None, f"empty data source; give a JSONL path or FORMAT:PATH (formats: {KNOWN})"),
    ("parket:/data/x", f"unknown data format 'parket' in 'parket:/data/x'; known: {KNOWN}"),
    ("hf-disc:/data/x:train", f"unknown data format 'hf-disc' in 'hf-disc:/data/x:train'; known: {KNOWN}"),
    ("verl:", "data source 'verl:' names no path (verl:PATH)"),
    ("easyr1:?question=problem", "data source 'easyr1:?question=problem' names no path (easyr1:PATH)"),
])
def test_a_spec_naming_no_source_is_refused(spec, message):
    assert refusal(parse_spec, spec) == message


def test_a_mixture_is_its_weighted_parts():
    assert parse_mixture("1*a.jsonl|2.5*verl:/d/v:train?question=q|1e-3*synthetic:train:4") == [
        (1.0, "a.jsonl"), (2.5, "verl:/d/v:train?question=q"), (0.001, "synthetic:train:4")]
    assert parse_mixture("3*a.jsonl|3*a*b.jsonl") == [(3.0, "a.jsonl"), (3.0, "a*b.jsonl")]
    # the smallest share that can be drawn
    assert parse_mixture("1e-9*a.jsonl|1*b.jsonl") == [(1e-9, "a.jsonl"), (1.0, "b.jsonl")]


@pytest.mark.parametrize("body, message", [
    ("a.jsonl|1*b.jsonl", "mixture part 'a.jsonl' must read WEIGHT*SPEC with a positive weight"),
    ("1*|1*b.jsonl", "mixture part '1*' must read WEIGHT*SPEC with a positive weight"),
    ("1*a.jsonl|0*b.jsonl", "mixture part '0*b.jsonl' must read WEIGHT*SPEC with a positive weight"),
    ("-1*a.jsonl|1*b.jsonl", "mixture part '-1*a.jsonl' must read WEIGHT*SPEC with a positive weight"),
    ("half*a.jsonl|1*b.jsonl", "mixture part 'half*a.jsonl' must read WEIGHT*SPEC with a positive weight"),
    ("nan*a.jsonl|1*b.jsonl", "mixture part 'nan*a.jsonl' must read WEIGHT*SPEC with a positive weight"),
    ("inf*a.jsonl|1*b.jsonl", "mixture part 'inf*a.jsonl' must read WEIGHT*SPEC with a positive weight"),
    ("1*mix:1*a.jsonl|1*b.jsonl", "mixture part '1*mix:1*a.jsonl': a mixture inside a mixture is not supported"),
    ("1*a.jsonl", "a mixture needs two or more parts, got '1*a.jsonl'"),
    ("", "mixture part '' must read WEIGHT*SPEC with a positive weight"),
    ("1e5*a.jsonl|1e-5*b.jsonl",
     "mixture part '1e-5*b.jsonl': its weight is below 1e-09 of the largest part's, so it would never be drawn; "
     "drop the part or raise its weight"),
    ("1*a.jsonl|1e-10*b.jsonl|0.5*c.jsonl",
     "mixture part '1e-10*b.jsonl': its weight is below 1e-09 of the largest part's, so it would never be drawn; "
     "drop the part or raise its weight"),
])
def test_a_malformed_mixture_is_refused_naming_its_part(body, message):
    assert refusal(parse_mixture, body) == message


# --- mixtures ------------------------------------------------------------------------------------------------------

A = [f"a{i}" for i in range(6)]
B = [f"b{i}" for i in range(4)]


class Part(list):
    files = ("part.jsonl",)


def test_a_mixture_draws_its_parts_per_seed_and_ends_with_its_first_part():
    m = Mixture([(3.0, A), (1.0, B)], seed=0)
    # pinned: grain's mix of the parts shuffled by seed 0 and 1; six of A (all of it) to two of B
    assert len(m) == 8 and m[:] == ["a0", "a4", "a1", "b1", "a2", "a5", "a3", "b2"]
    assert Mixture([(3.0, A), (1.0, B)], seed=1)[:] == ["a5", "a2", "a3", "b0", "a0", "a4", "a1", "b3"]
    assert (m[-1], m[-8], m[1:7:2], m[6:20]) == ("b2", "a0", ["a4", "b1", "a5"], ["a3", "b2"])
    for i in (8, -9):
        with pytest.raises(IndexError, match=f"^{i}$"):
            m[i]
    assert m.files == () and Mixture([(1.0, Part(A)), (1.0, B), (1.0, Part(B))], 0).files == (
        "part.jsonl", "part.jsonl")


def test_weights_too_far_apart_for_grains_scaling_draw_as_their_ratio():
    # grain scales by 100 / the smallest weight: 1e-307 overflows it, so the weights are taken relative to the largest
    assert Mixture([(3e-307, A), (1e-307, B)], seed=0)[:] == ["a0", "a4", "a1", "b1", "a2", "a5", "a3", "b2"]
    assert Mixture([(3e300, A), (1e300, B)], seed=0)[:] == ["a0", "a4", "a1", "b1", "a2", "a5", "a3", "b2"]


def test_weights_at_the_edge_of_grains_scaling_are_taken_as_given():
    """100 / 5.57e-307 is still finite: grain scales these weights itself, to 100:700 as it scales 1:7 (taken
    relative to the largest they would round to 100:699, another draw)."""
    a, b = [f"a{i}" for i in range(8)], [f"b{i}" for i in range(60)]
    edge = Mixture([(5.570858282348564e-307, a), (3.8996007976439945e-306, b)], seed=0)
    assert len(edge) == 64 and edge[:9] == ["a0", "b35", "b7", "b50", "b32", "b31", "b40", "b44", "a4"]
    assert edge[:] == Mixture([(1.0, a), (7.0, b)], seed=0)[:]


# --- opening a spec ------------------------------------------------------------------------------------------------


def easyr1_copy(root: Path) -> Path:
    """EasyR1's JSON lines: the question in `problem`, a second prompt column a config may name instead."""
    L._save(L.BLANK, root / "img" / "0.png")
    return L._jsonl([{"problem": "<image>Which object is nearer?\nA. the cube\nB. the ball", "answer": "B",
                      "asked": "How far is the ball?", "dist": 2.5, "images": ["0.png"]},
                     {"problem": "Which way is the door?", "answer": "left", "asked": "How far is the door?",
                      "dist": 4.0, "images": ["9.png"]}], root / "train.jsonl")


def test_a_layout_spec_reads_its_columns_over_data_columns(tmp_path):
    rows = easyr1_copy(tmp_path)
    s = open_spec(f"easyr1:{rows}?image_dir={tmp_path / 'img'}")[0]
    assert (s.id, s.question, s.options, s.answer, s.image, s.origin) == (
        "easyr1-0", "Which object is nearer?", ("the cube", "the ball"), "B", str(tmp_path / "img" / "0.png"),
        f"{rows}:1")
    # the spec's own columns win over the config's; the config's others stand
    s = open_spec(f"easyr1:{rows}?prompt=asked", columns=("prompt=problem", "answer=dist",
                                                          f"image_dir={tmp_path / 'img'}"))[0]
    assert (s.question, s.options, s.answer, s.answer_type) == ("How far is the ball?", (), 2.5, "number")
    assert refusal(open_spec, f"easyr1:{rows}?qestion=asked", columns=("answr=dist",)) == (
        "data.columns names unknown fields ['answr', 'qestion']; known: ['answer', 'category', 'conversations', "
        "'id', 'image', 'image_dir', 'images', 'layout', 'options', 'prompt', 'question', 'reference', 'video', "
        "'video_fps', 'videos']")
    assert refusal(open_spec, f"easyr1:{rows}", columns=("prompt",)) == (
        "data.columns entry 'prompt' must read field=column")


def test_a_layout_spec_reads_the_split_it_names(tmp_path):
    L._jsonl([{"problem": "How far is the door?", "answer": 4.0}], tmp_path / "train.jsonl")
    L._jsonl([{"problem": "How far is the chair?", "answer": 2.5}], tmp_path / "val.jsonl")
    assert [(x.question, x.answer) for x in open_spec(f"easyr1:{tmp_path}:val")] == [("How far is the chair?", 2.5)]
    assert [(x.question, x.answer) for x in open_spec(f"easyr1:{tmp_path}")] == [("How far is the door?", 4.0)]


def test_pictures_are_checked_unless_asked_not_to(tmp_path):
    rows = easyr1_copy(tmp_path)
    spec = f"easyr1:{rows}?image_dir={tmp_path / 'img'}"
    assert L.row_error(spec, 1) == f"{rows}:2: field 'images[0]': image {tmp_path / 'img' / '9.png'} does not exist"
    s = open_spec(spec, check_images=False)[1]
    assert (s.image, s.answer, s.answer_type) == (str(tmp_path / "img" / "9.png"), "left", "text")


def test_a_layout_path_is_a_folder_or_a_file_and_a_home_path_is_expanded(tmp_path, monkeypatch):
    rows = easyr1_copy(tmp_path / "home" / "copy")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    s = open_spec("easyr1:~/copy/train.jsonl?image_dir=img")
    assert len(s) == 2 and s.files == (str(rows),)
    folder = open_spec("easyr1:~/copy", check_images=False)
    assert folder.files == (str(rows),) and folder[0].image == str(tmp_path / "home" / "copy" / "0.png")
    missing = tmp_path / "none.parquet"
    assert refusal(open_spec, f"verl:{missing}:train") == (
        f"{missing}: data source 'verl:{missing}:train' does not exist")
    os.mkfifo(tmp_path / "pipe.jsonl")
    assert refusal(open_spec, f"easyr1:{tmp_path / 'pipe.jsonl'}") == (
        f"{tmp_path / 'pipe.jsonl'}: data source 'easyr1:{tmp_path / 'pipe.jsonl'}' is not a regular file (a device "
        "or a pipe)")


def test_a_project_jsonl_is_read_with_its_pictures_checked_or_not(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "r1", "question": "Which object is nearer?", "options": ["cube", "ball"],
                                "answer": "B", "image": "p.png"}) + "\n")
    assert refusal(open_spec, str(rows)) == (
        f"{rows}:1: field 'image': {brief(str(tmp_path / 'p.png'))} does not exist")  # the path shortened
    s = open_spec(f"jsonl:{rows}", check_images=False)
    assert [(x.id, x.answer, x.image) for x in s] == [("r1", "B", str(tmp_path / "p.png"))]


def test_the_synthetic_world_is_opened_by_split_and_count_with_its_settings():
    default = open_spec("synthetic:train:3")
    assert len(default) == 3 and [s.id for s in default] == ["train-000000", "train-000001", "train-000002"]
    other = open_spec("synthetic:train:3", SyntheticConfig(seed=5))
    assert [s.question for s in other] != [s.question for s in default]
    assert [s.question for s in other] == [s.question for s in open_spec("synthetic:train:3", SyntheticConfig(seed=5))]
    assert len(open_spec("synthetic:heldout:2")) == 2
    for spec in ("synthetic:train", "synthetic:train:x", "synthetic:train:3:4", "synthetic:train:-1"):
        assert refusal(open_spec, spec) == f"synthetic source {spec!r} must read synthetic:<train|heldout>:<count>"
    assert refusal(open_spec, "synthetic:dev:3") == (
        "synthetic source 'synthetic:dev:3': unknown split 'dev'; known: ['train', 'heldout']")


def test_a_mixture_spec_opens_each_part_with_the_same_settings(tmp_path):
    rows = easyr1_copy(tmp_path)
    spec = f"mix:1*easyr1:{rows}|1*easyr1:{rows}?answer=dist"
    m = open_spec(spec, check_images=False, columns=("prompt=asked",), seed=3)
    assert isinstance(m, Mixture) and m.files == (str(rows), str(rows))
    assert [(s.id, s.question, s.answer) for s in m] == [
        ("easyr1-0", "How far is the ball?", "B"), ("easyr1-1", "How far is the door?", 4.0),
        ("easyr1-1", "How far is the door?", "left"), ("easyr1-0", "How far is the ball?", 2.5)]
    # the seed reaches the draw (pinned: parts shuffled by seed + their index)
    assert [s.id for s in open_spec("mix:1*synthetic:train:4|1*synthetic:heldout:4")] == [
        "train-000000", "heldout-000001", "train-000003", "heldout-000002", "train-000001", "heldout-000003",
        "train-000002", "heldout-000000"]
    assert [s.id for s in open_spec("mix:1*synthetic:train:4|1*synthetic:heldout:4", seed=3)] == [
        "train-000002", "heldout-000001", "train-000003", "heldout-000000", "train-000000", "heldout-000002",
        "train-000001", "heldout-000003"]
    # the synthetic world's settings and the picture check reach every part
    own = sorted(x.question for x in open_spec("synthetic:train:3", SyntheticConfig(seed=5)))
    assert sorted(x.question for x in open_spec("mix:1*synthetic:train:3|1*synthetic:train:3",
                                                SyntheticConfig(seed=5))) == sorted(own * 2)
    pictures = f"image_dir={tmp_path / 'img'}"
    checked = open_spec(f"mix:1*easyr1:{rows}?{pictures}|1*easyr1:{rows}?{pictures}&id=asked")
    errors = []
    for i in range(len(checked)):
        try:
            checked[i]
        except DatasetError as e:
            errors.append(str(e))
    assert errors == [f"{rows}:2: field 'images[0]': image {tmp_path / 'img' / '9.png'} does not exist"] * 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert refusal(open_spec, f"mix:1*easyr1:{rows}|2*easyr1:{empty}") == (
        f"mixture part 'easyr1:{empty}' holds no rows")


# --- digests, paths and outputs ------------------------------------------------------------------------------------


def test_a_digest_hashes_a_layouts_format_split_columns_and_row_files(tmp_path):
    rows = easyr1_copy(tmp_path)
    h = hashlib.sha256(b"easyr1:?image_dir=img&prompt=asked")
    h.update(f"train.jsonl:{sha256(rows)}\n".encode())
    assert spec_digest(f"easyr1:{rows}?image_dir=img&prompt=asked") == h.hexdigest()
    # pictures are not read: a copy whose pictures are missing has its digest
    assert spec_digest(f"easyr1:{tmp_path}:train") == hashlib.sha256(
        f"easyr1:train?train.jsonl:{sha256(rows)}\n".encode()).hexdigest()
    assert spec_digest(f"jsonl:{rows}") == sha256(rows) and spec_digest("synthetic:heldout:4") is None
    assert spec_digest(f"mix:2*{rows}|1*synthetic:train:3") == hashlib.sha256(
        f"2.0*{sha256(rows)}|1.0*None".encode()).hexdigest()
    assert refusal(spec_digest, str(tmp_path / "none.jsonl")) == (
        f"{tmp_path / 'none.jsonl'}: dataset file does not exist")


def test_the_paths_a_spec_reads_are_its_copies_without_split_or_columns():
    assert spec_paths("synthetic:train:8") == []
    assert spec_paths("/d/rows.jsonl") == ["/d/rows.jsonl"]
    assert spec_paths("stvqa7k:/d/STVQA-7K:val?question=q") == ["/d/STVQA-7K"]
    assert spec_paths("mix:1*/d/rows.jsonl|2*synthetic:train:3|1*verl:/d/v/train.parquet:train") == [
        "/d/rows.jsonl", "/d/v/train.parquet"]


def test_an_output_inside_a_copys_folder_is_refused_before_anything_is_written(tmp_path):
    copy = tmp_path / "STVQA-7K"
    (copy / "data").mkdir(parents=True)
    verl_file = tmp_path / "geo3k" / "train.parquet"
    verl_file.parent.mkdir()
    verl_file.write_bytes(b"")
    spec = f"stvqa7k:{copy}:train"
    with pytest.raises(ConfigError) as e:
        refuse_writing_into_copies({"--report": None, "--output": str(copy / "data" / "kept.jsonl")}, spec)
    assert str(e.value) == (f"--output {copy / 'data' / 'kept.jsonl'} lies inside the copy {copy} that {spec} reads; "
                            "nothing is written into a copy")
    # a file copy's folder is the copy's; a link into it is inside it too
    (tmp_path / "link").symlink_to(verl_file.parent)
    with pytest.raises(ConfigError) as e:
        refuse_writing_into_copies({"--out": str(tmp_path / "link" / "cv")}, f"mix:1*{spec}|1*verl:{verl_file}")
    assert str(e.value) == (f"--out {tmp_path / 'link' / 'cv'} lies inside the copy {verl_file.parent} that "
                            f"verl:{verl_file} reads; nothing is written into a copy")
    # beside a copy, in a folder whose name begins as the copy's, or beside a JSONL file: allowed
    outputs = {"--output": str(tmp_path / "kept.jsonl"), "--report": str(tmp_path / "STVQA-7K-out" / "r.json"),
               "--out": None}
    refuse_writing_into_copies(outputs, spec)
    refuse_writing_into_copies({"--output": str(tmp_path / "kept.jsonl")}, f"jsonl:{tmp_path / 'rows.jsonl'}")
    refuse_writing_into_copies({"--output": str(tmp_path / "x.jsonl")},
                               f"mix:1*{tmp_path / 'r.jsonl'}|1*synthetic:train:2")


def test_the_synthetic_world_is_no_copy_so_any_output_may_be_written(tmp_path, monkeypatch):
    """Its spec names no folder: an output under the working directory (`synthetic:train:8`'s "path" would be the
    file `train:8` there) is allowed."""
    monkeypatch.chdir(tmp_path)
    refuse_writing_into_copies({"--out": "cv", "--output": str(tmp_path / "out" / "kept.jsonl")}, "synthetic:train:8")
    refuse_writing_into_copies({"--out": "cv"}, "mix:1*synthetic:train:8|1*synthetic:heldout:8")
    with pytest.raises(ConfigError):  # where a copy does sit in the working directory
        refuse_writing_into_copies({"--out": "cv"}, "easyr1:train.jsonl")


def test_a_folder_output_that_is_the_folder_holding_a_copys_file_is_refused(tmp_path, capsys):
    """to-cvbench writes test_2d.jsonl and img/ into --out: named as the folder of an EasyR1 file copy, it wrote
    them beside the copy's rows before the folder itself was refused."""
    from spatial_jax.cli import main

    copy = tmp_path / "copy"
    L._save(L.BLANK, copy / "0.png")
    L._jsonl([{"problem": "<image>How many chairs are there?\nA. 1\nB. 2", "answer": "B", "images": ["0.png"],
               "cat": "counting"}], copy / "train.jsonl")
    spec = f"easyr1:{copy / 'train.jsonl'}?category=cat"
    assert main(["to-cvbench", "--data", spec, "--out", str(copy)]) == 2
    assert capsys.readouterr().err == (f"spatial-jax to-cvbench: configuration error: --out {copy} lies inside the "
                                       f"copy {copy} that {spec} reads; nothing is written into a copy\n")
    assert sorted(p.name for p in copy.iterdir()) == ["0.png", "train.jsonl"]
    with pytest.raises(ConfigError):
        refuse_writing_into_copies({"--out": str(copy) + "/"}, f"mix:1*synthetic:train:2|1*{spec}")
