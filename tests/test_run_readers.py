"""Issue 44: what reads a run directory (eval, export: `has_checkpoint`, `Workspace.load_latest`) changes nothing in it,
so a training job saving a checkpoint there meanwhile is never disturbed (finding 7: orbax's manager, opened to write,
deletes every `<step>.orbax-checkpoint-tmp*` directory, the writer's step in flight among them); export never
replaces a file of its --out it did not write (finding 3); a step whose checksums.json is gone is read with a
one-line warning."""

from __future__ import annotations

import os

import pytest

from spatial_jax import config as C
from spatial_jax.cli import main
from spatial_jax.rl.checkpoint import CHECKSUMS, Checkpointer
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.workspace import Workspace, has_checkpoint


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run directory holding one committed SFT checkpoint (step 1) of the default tiny policy, as a trainer saves
    it (weights, optimiser state, its config in the meta)."""
    run = tmp_path_factory.mktemp("readers") / "run"
    cfg = C.load(TrainConfig, None, [f"run_dir={run}", "progress=false", "tensorboard=false"])
    ws = Workspace(cfg, record_config=True)
    with Checkpointer(run / "sft") as ck:
        ck.save(1, ws.state(ws.optimizer("sft").init(ws.trainable)), {"step": 1, "config": C.to_dict(cfg)}, force=True)
    return run


def _writer_in_flight(run):
    """What a training job saving step 2 has on disk before orbax renames it into place."""
    partial = run / "sft" / "checkpoints" / "2.orbax-checkpoint-tmp-1234" / "state"
    partial.mkdir(parents=True, exist_ok=True)
    (partial / "d").write_bytes(b"being written")
    return partial


def test_readers_leave_a_writers_step_in_flight_alone(run):
    partial = _writer_in_flight(run)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert has_checkpoint(run)
    ws = Workspace(C.load(TrainConfig, None, [f"run_dir={run}"]))
    assert ws.load_latest() == "sft"
    assert (partial / "d").read_bytes() == b"being written"
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # nothing made, moved or removed


def test_export_never_replaces_a_file_it_did_not_write(run, tmp_path, capsys):
    partial = _writer_in_flight(run)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"someone else's weights")
    assert main(["export", "--run-dir", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "already holds model.safetensors, which this command did not write" in err, err
    assert os.listdir(out) == ["model.safetensors"] and (out / "model.safetensors").read_bytes() == b"someone else's " \
        b"weights"
    assert sorted(os.listdir(tmp_path)) == ["hf"]  # no staging folder left
    (out / "notes.txt").write_text("mine")
    (out / "model.safetensors").unlink()
    assert main(["export", "--run-dir", str(run), "--out", str(out)]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "config.json").is_file()
    assert (partial / "d").is_file()


def test_a_step_without_its_checksums_is_read_with_a_one_line_warning(run, capsys):
    step = run / "sft" / "checkpoints" / "1"
    recorded = (step / CHECKSUMS).read_bytes()
    (step / CHECKSUMS).unlink()
    try:
        assert Workspace(C.load(TrainConfig, None, [f"run_dir={run}"])).load_latest() == "sft"
        err = capsys.readouterr().err
        assert err.count(f"{step} has no {CHECKSUMS}") == 1 and "read unchecked" in err, err
    finally:
        (step / CHECKSUMS).write_bytes(recorded)
