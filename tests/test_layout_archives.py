"""Published training sets read as their authors ship them, archives included (spatial_jax/data/sources): MindCube's
data.zip and OmniSpatial's training zip read as folders (members, never extracted, macOS's `__MACOSX/` entries passed
over), their unzipped copies found from one level above, OmniSpatial's list questions and options drawn in the image,
and VSI-590K's per-source archives. Each copy is written here, tiny, from the synthetic world's questions and
pictures; a comment names the card or loading code each layout detail comes from."""

import json
import tarfile
import zipfile
from pathlib import Path

import layout_copies as L

from spatial_jax.cli import main
from spatial_jax.data.sample import LETTERS
from spatial_jax.data.sources import open_spec, spec_digest

# macOS's zip stores each file's resource fork as `__MACOSX/<folder>/._<name>`, an AppleDouble file (magic 0x00051607);
# the 0x8f byte is the one the "not UTF-8" error named
APPLE_DOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        \x8f\x00"


def _show(spec, capsys, n):
    assert main(["data", "show", spec, "-n", str(n), "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _refusal(spec, capsys, n) -> str:
    assert main(["data", "show", spec, "-n", str(n), "--json"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err



def _files(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def _mac(members: dict[str, bytes]) -> dict[str, bytes]:
    """The AppleDouble twin of every member, as macOS's zip adds them."""
    return {f"__MACOSX/{n.rsplit('/', 1)[0]}/._{n.rsplit('/', 1)[1]}": APPLE_DOUBLE for n in members if "/" in n}


def mindcube_zip(root: Path, ss) -> Path:
    """data.zip as the Hub serves it: one top `data/` folder holding raw/MindCube_train.jsonl and other_all_image/
    (mll-lab-nu/MindCube scripts/bash_scripts/download_data.bash moves `data/` out of the unzipped archive and
    deletes `__MACOSX/`; the README runs scripts/data_processing.py on data/raw/MindCube_train.jsonl), rows {id,
    question with inline `A. ...` options, gt_answer, images relative to data/} as the authors' loaders read them
    (src/inference/base.py prepends image_root `./data/`). Two views per question (the second a mirror)."""
    members, rows = {}, []
    for i, s in enumerate(ss):
        views = [f"other_all_image/around/{i}_{v}.png" for v in range(2)]
        members[f"data/{views[0]}"], members[f"data/{views[1]}"] = L.png(s.image), L.png(s.image[:, ::-1].copy())
        inline = " ".join(f"{LETTERS[k]}. {o}" for k, o in enumerate(s.options))
        rows.append({"id": f"around_{i}", "question": f"{s.question} {inline}", "gt_answer": s.answer, "images": views})
    members["data/raw/MindCube_train.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows).encode()
    # a same-named file under __MACOSX/ (not an AppleDouble `._` name) proves the whole tree is passed over
    return L.write_zip(root / "data.zip",
                       {**members, **_mac(members), "__MACOSX/raw/MindCube_train.jsonl": APPLE_DOUBLE})


def test_mindcube_data_zip_reads_as_a_folder_never_extracted(tmp_path, capsys):
    ss = L.samples(3)
    path = mindcube_zip(tmp_path / "hub", ss)
    before = _files(tmp_path)
    for spec in (f"mindcube-train:{path}", f"mindcube-train:{path.parent}"):  # the zip, or the snapshot holding it
        rows = _show(spec, capsys, 3)
        assert [r["id"] for r in rows] == ["around_0", "around_1", "around_2"]
        for row, s in zip(rows, ss, strict=True):
            assert (row["question"], row["options"], row["answer"]) == (s.question, list(s.options), s.answer)
            assert row["images"] == [{"width": 96, "height": 96}] * 2 and row["video"] is None
    assert _files(tmp_path) == before  # nothing extracted, nothing written
    assert spec_digest(f"mindcube-train:{path}")  # a run's record of its data reads the archive


def test_mindcube_unzipped_copy_is_found_from_one_level_up(tmp_path, capsys):
    ss = L.samples(2)
    with zipfile.ZipFile(mindcube_zip(tmp_path / "hub", ss)) as z:
        z.extractall(tmp_path / "X")  # X/data/raw/..., and X/__MACOSX/raw/MindCube_train.jsonl beside it
    rows = _show(f"mindcube-train:{tmp_path / 'X'}", capsys, 2)
    assert [(r["question"], r["answer"], len(r["images"])) for r in rows] == [(s.question, s.answer, 2) for s in ss]
    assert _show(f"mindcube-train:{tmp_path / 'X/data'}", capsys, 2) == rows


# sub-tasks with their task types, as qizekun/OmniSpatial vlms_eval/qwenvl_eval.py's blank_stats groups them
PLAIN, IN_IMAGE, UNKNOWN = (("Perspective_Taking", "Allocentric"), ("Complex_Logic", "Geometric_Reasoning"),
                            ("Dynamic_Reasoning", "Manipulation"))


def omnispatial_zip(path: Path, ss, extra: tuple = ()) -> Path:
    """OmniSpatial-train.zip: `OmniSpatial-train/data.json` and `OmniSpatial-train/<task_type>/<N>.png` for id `N_k`
    (the README's unzipped test layout, qwenvl_eval.py's image path; the top folder is the one third-party loaders of
    the zip open). Record 0 writes its question as a list of strings; records 1 and 2 draw their options in the image
    (`options: []`, qizekun/OmniSpatial issue 9): one under a Complex_Logic sub-task, one elsewhere."""
    kinds = [PLAIN, IN_IMAGE, UNKNOWN]
    records, members = [], {}
    for i, (s, (task, sub)) in enumerate(zip(ss, kinds, strict=True)):
        records.append({"id": f"{i}_0", "question": ["Look at the picture.", s.question] if i == 0 else s.question,
                        "options": list(s.options) if i == 0 else [], "answer": LETTERS.index(s.answer),
                        "task_type": task, "sub_task_type": sub})
        members[f"OmniSpatial-train/{task}/{i}.png"] = L.png(s.image)
    members["OmniSpatial-train/data.json"] = json.dumps(records + list(extra)).encode()
    # `__MACOSX/data.json` is shorter than the real one: picked first unless the whole tree is passed over
    return L.write_zip(path, {**members, **_mac(members), "__MACOSX/data.json": APPLE_DOUBLE})


def _omni_expected(ss):
    drawn = [f"the option marked {c} in the image" for c in "ABCD"]
    return [("Look at the picture. " + ss[0].question, list(ss[0].options), ss[0].answer),
            (ss[1].question, drawn, ss[1].answer), (ss[2].question, drawn, ss[2].answer)]


def test_omnispatial_zip_list_questions_and_options_drawn_in_the_image(tmp_path, capsys):
    ss = L.samples(3)
    path = omnispatial_zip(tmp_path / "OmniSpatial-train.zip", ss)
    before = _files(tmp_path)
    rows = _show(f"omnispatial-train:{path}", capsys, 3)
    assert [(r["question"], r["options"], r["answer"]) for r in rows] == _omni_expected(ss)
    assert all(r["images"] == [{"width": 96, "height": 96}] for r in rows)
    assert _files(tmp_path) == before
    samples = open_spec(f"omnispatial-train:{path}")
    assert [s.meta.get("options_in_image") for s in samples] == [None, 4, "unknown"]
    assert [s.answer_type for s in samples] == ["choice"] * 3  # the 0-based index is never a numeric gold
    assert spec_digest(f"omnispatial-train:{path}")


def test_omnispatial_unzipped_or_hub_snapshot_found_from_one_level_up(tmp_path, capsys):
    ss = L.samples(3)
    path = omnispatial_zip(tmp_path / "hub/OmniSpatial-train.zip", ss)
    L.write_zip(tmp_path / "hub/OmniSpatial-test.zip", {"README": b"the test split: not what this reader reads"})
    expected = _omni_expected(ss)
    rows = _show(f"omnispatial-train:{tmp_path / 'hub'}", capsys, 3)
    assert [(r["question"], r["options"], r["answer"]) for r in rows] == expected
    with zipfile.ZipFile(path) as z:
        z.extractall(tmp_path / "X")  # X/OmniSpatial-train/..., X/__MACOSX/data.json beside it
    for folder in (tmp_path / "X", tmp_path / "X/OmniSpatial-train"):
        rows = _show(f"omnispatial-train:{folder}", capsys, 3)
        assert [(r["question"], r["options"], r["answer"]) for r in rows] == expected


def test_omnispatial_in_image_gold_past_the_offered_letters_names_row_and_field(tmp_path, capsys):
    ss = L.samples(3)
    past = {"id": "2_1", "question": "Which one?", "options": [], "answer": 4, "task_type": UNKNOWN[0],
            "sub_task_type": UNKNOWN[1]}
    path = omnispatial_zip(tmp_path / "OmniSpatial-train.zip", ss, extra=(past,))
    err = _refusal(f"omnispatial-train:{path}", capsys, 4)
    assert f"{path}:OmniSpatial-train/data.json record 3: field 'answer' = 4 is no 0-based index of the 4 options" \
        in err


def vsi_rows(ss, media: list[str], field: str) -> list[dict]:
    """vsi_590k.jsonl rows: LLaVA conversations with `video` or `image` a path under its source's folder (the Hub
    repo's file list: vsi_590k.jsonl beside <source>.tar.gz archives; the rows' paths start with the source's name,
    and the human turn opens with `<image>` for a video too, as third-party scans of the file report)."""
    return [{"id": f"vsi{i}", field: m, "question_type": "relative_direction_object",
             "conversations": [{"from": "human", "value": "<image>\n" + s.question + "\n" + L.lettered(s)},
                               {"from": "gpt", "value": s.answer}]} for i, (s, m) in enumerate(zip(ss, media))]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"vsi590k:{path}"


def test_vsi590k_reads_a_zip_member_and_refuses_a_tar_gz_naming_archive_and_command(tmp_path, capsys):
    ss = L.samples(2)
    root = tmp_path / "VSI-590K"
    # images from a zip: read member by member
    names = [f"robotics/agibot_{i}.png" for i in range(2)]
    L.write_zip(root / "robotics.zip", {n: L.png(s.image) for n, s in zip(names, ss)})
    rows = _show(_jsonl(root / "vsi_590k.jsonl", vsi_rows(ss, names, "image")), capsys, 2)
    assert [(r["question"], r["options"], r["answer"], r["images"]) for r in rows] == \
        [(s.question, list(s.options), s.answer, [{"width": 96, "height": 96}]) for s in ss]
    # a video in its source's tar.gz, as the card ships it
    L.mp4([ss[0].image] * 4, tmp_path / "clip.mp4")
    with tarfile.open(root / "scannet.tar.gz", "w:gz") as t:
        t.add(tmp_path / "clip.mp4", arcname="scannet/scene0000_00.mp4")
    spec = _jsonl(root / "videos.jsonl", vsi_rows(ss[:1], ["scannet/scene0000_00.mp4"], "video"))
    err = _refusal(spec, capsys, 1)
    assert f"{root / 'scannet.tar.gz'}, not extracted" in err
    assert f"`tar -xzf {root / 'scannet.tar.gz'} -C {root}`" in err
    # a video file in a zip: the decoder needs a file
    L.write_zip(root / "s3dis.zip", {"s3dis/area_1/room.mp4": (tmp_path / "clip.mp4").read_bytes()})
    err = _refusal(_jsonl(root / "zipped.jsonl", vsi_rows(ss[:1], ["s3dis/area_1/room.mp4"], "video")), capsys, 1)
    assert f"`unzip -n {root / 's3dis.zip'} -d {root}`" in err
    # no archive at all: the card's archive to fetch
    (root / "scannet.tar.gz").unlink()
    err = _refusal(spec, capsys, 1)
    assert f"{root / 'videos.jsonl'}:1: field 'video': video {root / 'scannet/scene0000_00.mp4'} is not on disk" \
        in err and "scannet.tar.gz, which is not in" in err
    (root / "scannet").mkdir()  # extracted, the copy reads as before
    (tmp_path / "clip.mp4").rename(root / "scannet/scene0000_00.mp4")
    assert _show(spec, capsys, 1)[0]["video"] == {"frames": 4, "fps": 2.0}


def test_a_folder_holding_two_copies_one_level_down_is_refused_naming_both(tmp_path, capsys):
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "data.json").write_text("[]")
    err = _refusal(f"omnispatial-train:{tmp_path}", capsys, 1)
    assert f"holds 2 copies of OmniSpatial's training split ({tmp_path / 'first/data.json'}, " in err


def test_vsi590k_image_lists_are_read_from_their_sources_archive(tmp_path, capsys):
    """An `image` list (multi-view rows) reads its members from its source's zip; a picture in a tar.gz is named as
    an image (not a video) with the command that extracts it; a folder of split files reads the split named."""
    ss = L.samples(2)
    root = tmp_path / "VSI-590K"
    names = [f"hypersim/v{i}.png" for i in range(2)]
    L.write_zip(root / "hypersim.zip", {n: L.png(s.image) for n, s in zip(names, ss)})
    row = vsi_rows(ss[:1], [names], "image")[0]
    _jsonl(root / "test.jsonl", [row])
    _jsonl(root / "train.jsonl", [{**row, "id": "other"}])
    (shown,) = _show(f"vsi590k:{root}:test", capsys, 5)
    assert (shown["id"], shown["images"]) == ("vsi0", [{"width": 96, "height": 96}] * 2)
    with tarfile.open(root / "arkitscenes.tar.gz", "w:gz") as t:
        t.add(root / "test.jsonl", arcname="arkitscenes/x.jsonl")
    spec = _jsonl(root / "tar.jsonl", vsi_rows(ss[:1], [["arkitscenes/a.png"]], "image"))
    assert _refusal(spec, capsys, 1).strip().endswith(
        f"{root / 'tar.jsonl'}:1: field 'image': image {root / 'arkitscenes/a.png'} is not on disk; it is in the "
        f"archive {root / 'arkitscenes.tar.gz'}, not extracted: extract it with "
        f"`tar -xzf {root / 'arkitscenes.tar.gz'} -C {root}`")
    assert open_spec(spec, check_images=False)[0].image == str(root / "arkitscenes/a.png")  # unchecked: a path


def test_vsi590k_archive_hints_follow_a_renamed_media_column(tmp_path, capsys):
    ss = L.samples(1)
    root = tmp_path / "VSI-590K"
    row = {**vsi_rows(ss, ["x"], "video")[0], "clip": "scannet/scene0001_00.mp4"}
    del row["video"]
    spec = _jsonl(root / "renamed.jsonl", [row])
    (root / "scannet.tar.gz").write_bytes(b"")  # the card's archive, present and not extracted
    assert f"field 'clip': video {root / 'scannet/scene0001_00.mp4'} is not on disk; it is in the archive " \
        f"{root / 'scannet.tar.gz'}, not extracted" in _refusal(spec + "?video=clip", capsys, 1)
