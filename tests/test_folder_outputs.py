"""Issue 44, findings 2 and 10: the one rule of a folder output (spatial_jax/cli/outputs.new_files), for to-cvbench,
export, gen-data and pretrain: a file the command did not write is never replaced, an empty path is refused, and a
refusal or an error partway leaves nothing behind."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from spatial_jax.cli import main
from spatial_jax.cli.job_config import load_job
from spatial_jax.cli.outputs import new_files
from spatial_jax.config import ConfigError
from spatial_jax.data.jsonl import write_jsonl
from spatial_jax.data.synthetic import SyntheticConfig, SyntheticSource

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "tiny_cpu.toml")
TO_CVBENCH = ["to-cvbench", "--config", CONFIG, "--data", "synthetic:heldout:2"]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_to_cvbench_never_replaces_a_file_of_another_copy(tmp_path, capsys):
    out = tmp_path / "cv"
    (out / "img" / "2D" / "relation").mkdir(parents=True)
    (out / "img" / "2D" / "relation" / "coco_0.png").write_bytes(b"the real CV-Bench image")
    (out / "test_2d.parquet").write_bytes(b"PAR1")
    before = _tree(out)
    assert main([*TO_CVBENCH, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds img/2D/relation/coco_0.png" in err, err
    assert _tree(out) == before and os.listdir(tmp_path) == ["cv"]  # nothing added, no staging folder left


def test_to_cvbench_adds_its_files_beside_unrelated_ones(tmp_path):
    out = tmp_path / "cv"
    out.mkdir()
    (out / "README.md").write_text("mine")
    assert main([*TO_CVBENCH, "--out", str(out)]) == 0
    assert (out / "README.md").read_text() == "mine" and (out / "test_2d.jsonl").is_file()
    assert sorted(os.listdir(tmp_path)) == ["cv"]


def test_an_empty_out_is_refused_and_the_working_directory_untouched(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for command in (TO_CVBENCH, ["gen-data", "--num-train", "1", "--num-eval", "1"]):
        assert main([*command, "--out", ""]) == 2
        assert "--out is empty" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_a_refusal_partway_leaves_nothing_behind(tmp_path, capsys):
    """Two convertible questions, then one CV-Bench has no task for: the first two images were written when the
    third is refused; none of them stays."""
    good = list(SyntheticSource(load_job(CONFIG, []).data.synthetic, "heldout", 2))
    size = dataclasses.replace(SyntheticSource(SyntheticConfig(question_types=("size",)), "heldout", 1)[0], id="s")
    data = tmp_path / "in" / "data.jsonl"
    write_jsonl([*good, size], data)
    assert main(["to-cvbench", "--config", CONFIG, "--data", str(data), "--out", str(tmp_path / "cv")]) == 1
    assert "has no CV-Bench task" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_a_clash_found_while_moving_in_undoes_every_file_moved(tmp_path, monkeypatch):
    out, real_link = tmp_path / "out", os.link

    def link(src, dst):  # another writer takes the last name between the check and the move
        if str(dst).endswith("b/z"):
            Path(dst).write_text("theirs")
        real_link(src, dst)

    monkeypatch.setattr(os, "link", link)
    with pytest.raises(ConfigError, match="already holds b/z"):
        with new_files(out, "--out") as stage:
            (stage / "b").mkdir(parents=True)
            for name in ("a", "b/y", "b/z"):
                (stage / name).write_text(name)
            (out / "b").mkdir(parents=True)
    assert _tree(tmp_path) == {"out/b/z": b"theirs"}


def _no_training(monkeypatch):
    import spatial_jax.rl.pretrain

    monkeypatch.setattr(spatial_jax.rl.pretrain, "pretrain", lambda *a: pytest.fail("the pre-training started"))


def test_pretrain_refuses_a_folder_holding_files_before_training(tmp_path, monkeypatch, capsys):
    """Its default --out is the shipped base: run again, it would have written over it (and any folder's own
    config.json or model.safetensors) after the training; now it is refused before."""
    _no_training(monkeypatch)
    shipped = ROOT / "checkpoints" / "tiny_base"
    before = _tree(shipped)
    monkeypatch.chdir(ROOT)
    assert main(["pretrain", f"run_dir={tmp_path / 'run'}"]) == 2
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"theirs")
    assert main(["pretrain", "--config", str(ROOT / "configs" / "pretrain_tiny.toml"), "--out", str(other),
                 f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("already holds files" in line for line in err), err
    assert _tree(shipped) == before and _tree(other) == {"model.safetensors": b"theirs"}
    assert sorted(os.listdir(tmp_path)) == ["other"]


def test_pretrain_writes_beside_and_moves_in_only_a_complete_base(tmp_path, monkeypatch, capsys):
    import spatial_jax.rl.pretrain

    def export(cfg, out, fail):
        Path(out).mkdir(parents=True)
        (Path(out) / "config.json").write_text("{}")
        if fail:
            raise OSError("disk full")
        return {"files": {"config.json": "ab" * 32}}

    config = str(ROOT / "configs" / "pretrain_tiny.toml")
    monkeypatch.setattr(spatial_jax.rl.pretrain, "pretrain", lambda cfg, out: export(cfg, out, True))
    assert main(["pretrain", "--config", config, "--out", str(tmp_path / "base"), f"run_dir={tmp_path / 'run'}"]) == 1
    assert os.listdir(tmp_path) == []  # an export that fails partway leaves no half a base
    monkeypatch.setattr(spatial_jax.rl.pretrain, "pretrain", lambda cfg, out: export(cfg, out, False))
    assert main(["pretrain", "--config", config, "--out", str(tmp_path / "base"), f"run_dir={tmp_path / 'run'}"]) == 0
    assert _tree(tmp_path) == {"base/config.json": b"{}"}
