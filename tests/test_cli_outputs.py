"""Every output flag of every command is refused, before anything is written, when it names one of the command's
inputs (the same file by path, through a symlink or as a hard link) or another of its outputs."""

from __future__ import annotations

import json
import os

import pytest
from test_bench_loaders import write_copy

from spatial_jax.cli import main
from spatial_jax.data.jsonl import write_jsonl
from spatial_jax.data.sample import Sample
from spatial_jax.records import GTBox


def _dataset(path):
    box = GTBox((10.0, 10.0, 200.0, 300.0), "cup", 1.0)
    write_jsonl([Sample(id=f"s{i}", image=f"images/{i}.png", question="q?", options=("a", "b"), answer="A",
                        gt_boxes=(box, box)) for i in range(3)], path)
    return path.read_bytes()


def _refused(argv, capsys, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("command", ["corrupt", "filter-sft"])
@pytest.mark.parametrize("alias", ["path", "symlink", "hardlink"])
def test_report_naming_the_input_is_refused_and_the_input_kept(command, alias, tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    before = _dataset(data)
    report = {"path": data, "symlink": tmp_path / "link.jsonl", "hardlink": tmp_path / "hard.jsonl"}[alias]
    if alias == "symlink":
        report.symlink_to(data)
    elif alias == "hardlink":
        os.link(data, report)
    _refused([command, "--input", str(data), "--output", str(tmp_path / "out.jsonl"), "--report", str(report)],
             capsys, f"spatial-jax {command}: configuration error: --report", "would overwrite its input")
    assert data.read_bytes() == before and not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("command", ["corrupt", "filter-sft"])
def test_report_naming_the_output_is_refused(command, tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    _dataset(data)
    out = tmp_path / "out.jsonl"
    _refused([command, "--input", str(data), "--output", str(out), "--report", str(out)], capsys,
             "--output", "--report", "name the same file")
    assert not out.exists()


def _benchmark(tmp_path):
    root = write_copy("embspatial", tmp_path / "copy")
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps({"mp3d_0": "B", "ai2thor_1": "A"}))
    return root, preds


def test_eval_output_naming_the_predictions_or_a_file_of_the_copy_is_refused(tmp_path, capsys):
    root, preds = _benchmark(tmp_path)
    copy_file = next(p for p in root.rglob("*") if p.is_file())
    kept = {p: p.read_bytes() for p in (preds, copy_file)}
    base = ["eval", "--benchmark", "embspatial", "--data", str(root), "--predictions", str(preds)]
    _refused(base + ["--output", str(preds)], capsys, "would overwrite its input")
    _refused(base + ["--output", str(copy_file)], capsys, "would overwrite its input")
    # the Markdown table goes beside the report with the suffix .md: here that is the predictions file
    md_twin = tmp_path / "preds.md"
    os.link(preds, md_twin)
    _refused(base + ["--output", str(tmp_path / "preds.out")], capsys, "Markdown", "would overwrite its input")
    _refused(base + ["--output", str(tmp_path / "table.md")], capsys, "name the same file")
    assert all(p.read_bytes() == data for p, data in kept.items())
    assert main(base + ["--output", str(tmp_path / "report.json")]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["benchmarks"]["embspatial"]["table"]


def test_export_out_naming_the_base_checkpoint_or_the_run_is_refused(tmp_path, capsys):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run_dir": str(run), "policy": {"checkpoint": str(base)}}))
    (tmp_path / "base_link").symlink_to(base)
    for out in (base, tmp_path / "base_link", run):
        _refused(["export", "--run-dir", str(run), "--out", str(out)], capsys, "--out", "would overwrite its input")
    assert (base / "config.json").read_text() == "{}" and os.listdir(base) == ["config.json"]


def test_plan_json_and_pretrain_out_naming_an_input_are_refused(tmp_path, capsys):
    config = tmp_path / "job.toml"
    config.write_text(f'run_dir = "{tmp_path / "run"}"\n')
    _refused(["plan", "--config", str(config), "--topology", "cpu:1", "--json", str(config)], capsys,
             "--json", "would overwrite its input")
    _refused(["pretrain", "--config", str(config), "--out", str(config)], capsys, "--out", "would overwrite its input")
    assert config.read_text() == f'run_dir = "{tmp_path / "run"}"\n'


@pytest.mark.parametrize("command", ["corrupt", "filter-sft"])
def test_media_paths_of_every_row_kind_resolve_from_the_output_folder(command, tmp_path, capsys, monkeypatch):
    """Rows of one image, several images, a video file and video frames, read from one folder (named relative to the
    working directory) and written to another, name the same files (the reader resolves them against the output
    file's folder)."""
    from test_tools_filter_sft import GOOD

    from spatial_jax.data.jsonl import read_jsonl

    common = {"question": "Where is the cup?", "options": ["left", "right"], "answer": "A",
              "reference": {"spatialcore": GOOD}}
    rows = [{"id": "one", "image": "images/0.png"}, {"id": "multi", "images": ["images/1.png", "views/2.png"]},
            {"id": "clip", "video": {"path": "clips/v.mp4"}},
            {"id": "frames", "video": {"frames": ["frames/0.png", "frames/1.png"], "fps": 2.0}}]
    data = tmp_path / "data" / "in.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({**row, **common}) + "\n" for row in rows))
    out = tmp_path / "elsewhere" / "deeper" / "out.jsonl"
    out.parent.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert main([command, "--input", "data/in.jsonl", "--output", str(out)]) == 0
    capsys.readouterr()

    def media(path):
        found = {}
        for s in read_jsonl(path, check_images=False):
            video = s.video
            refs = [s.image] if s.image else list(s.images) or ([video.path] if video.path else list(video.frames))
            found[s.id] = [os.path.realpath(r) for r in refs]  # the reader joined them to the file's folder
        return found

    assert media(out) == media(data) and len(media(out)) == 4


def test_an_output_file_flag_naming_a_folder_is_refused_before_the_work(tmp_path, capsys, monkeypatch):
    """Issue 36 item 24: found at the start, not once the benchmark is scored or the dataset corrupted."""
    import spatial_jax.data.corrupt
    import spatial_jax.suites

    def no_work(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr(spatial_jax.suites, "score_responses", no_work)
    monkeypatch.setattr(spatial_jax.data.corrupt, "corrupt", no_work)
    folder = tmp_path / "reports"
    folder.mkdir()
    root, preds = _benchmark(tmp_path)
    _refused(["eval", "--benchmark", "embspatial", "--data", str(root), "--predictions", str(preds), "--output",
              str(folder)], capsys, "--output", "is a folder")
    data = tmp_path / "in.jsonl"
    _dataset(data)
    for flag in ("--output", "--report"):
        outputs = {"--output": str(tmp_path / "out.jsonl"), "--report": str(tmp_path / "report.json"), flag: folder}
        _refused(["corrupt", "--input", str(data), *(x for kv in outputs.items() for x in map(str, kv))], capsys,
                 f"{flag} {folder} is a folder")
    _refused(["plan", "--topology", "cpu:1", "--json", str(folder)], capsys, "--json", "is a folder")
    assert os.listdir(folder) == []
