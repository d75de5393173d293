"""Faults and bad input around the training job: a rerun with other settings, damaged or cut files in the run
directory, a read-only run directory, broken inputs and absurd values, and the one-line errors users see.

Most tests work on copies of one finished run (SFT 6 steps, RL 9 steps, checkpoints every 3: rl/checkpoints/{6,9})
trained with a dense test reward, so its RL steps move the weights.
"""

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest

import spatial_jax.methods
from spatial_jax import config as C
from spatial_jax.cli import main
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.workspace import Workspace
from spatial_jax.testing import dense_methods

JOB = [
    "sft.steps=6", "sft.batch_size=2", "sft.checkpoint_every=3", "rl.steps=9", "rl.checkpoint_every=3",
    "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=12", "data.train=synthetic:train:16",
    "data.eval=synthetic:heldout:4", "eval.batch_size=4", "eval.max_new_tokens=12", "tensorboard=false",
    "progress=false", "data.bucket_lengths=[256,512]", "method=dense_spatialcore", "seed=3",
]


@pytest.fixture(scope="module")
def dense():
    with dense_methods.registered(spatial_jax.methods):
        yield


def _params(run_dir: Path, *extra: str):
    job = Workspace(C.load(TrainConfig, None, [f"run_dir={run_dir}", *JOB, *extra]))
    assert job.load_latest() == "rl"
    return jax.tree.map(np.asarray, job.trainable)


def _max_diff(a, b) -> float:
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), a, b)))


@pytest.fixture(scope="module")
def finished(dense, tmp_path_factory):
    run = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", f"run_dir={run}", *JOB]) == 0
    return run


@pytest.fixture(scope="module")
def finished_params(finished):
    return _params(finished)


def _copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst)
    return dst


def _cut(path: Path) -> None:
    """What a kill halfway through writing `path` in place leaves."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.slow
def test_a_rerun_with_settings_that_change_the_result_refuses_naming_them(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "run")
    shutil.rmtree(run / "rl" / "checkpoints" / "9")  # as if killed between checkpoints 6 and 9
    for name in ("eval_rl.json", "summary.json"):
        (run / name).unlink()
    recorded = (run / "config.json").read_bytes()
    capsys.readouterr()
    assert main(["train", f"run_dir={run}", *JOB, "seed=6", "method=dense_prosr", "rl.optim.lr=5e-4"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"\bseed\b.*\bmethod\b.*\brl\.optim\.lr\b", err), err
    assert "rewards." not in err  # another method's reward table follows from `method`, not named key by key
    assert (run / "config.json").read_bytes() == recorded  # the refused run wrote nothing
    assert not (run / "rl" / "checkpoints" / "9").exists()
    # what does not change the trained weights may change: display, evaluation, checkpoint interval, mesh
    assert main(["train", f"run_dir={run}", *JOB, "progress=true", "tensorboard=true", "rl.checkpoint_every=1",
                 "eval.max_samples=2", "data.read_threads=1", "mesh.data=2"]) == 0
    assert "resumed" in capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["progress"] is True


def test_the_evaluation_cache_is_not_reused_for_other_weights(finished, tmp_path):
    run = _copy(finished, tmp_path / "run")
    cached = json.loads((run / "eval_sft.json").read_text())["key"]
    for extra in (["sft.optim.lr=5e-3"], ["seed=4"]):  # the stage is retrained from scratch with other settings
        shutil.rmtree(run / "sft")
        shutil.rmtree(run / "rl", ignore_errors=True)
        assert main(["train", f"run_dir={run}", *JOB, "rl.steps=0", *extra]) == 0
        key = json.loads((run / "eval_sft.json").read_text())["key"]
        assert key != cached, extra
        cached = key


def test_cut_json_files_in_the_run_directory_are_rewritten(finished, finished_params, tmp_path):
    run = _copy(finished, tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    for name in ("eval_sft.json", "eval_rl.json", "config.json", "summary.json"):
        _cut(run / name)
    assert main(["train", f"run_dir={run}", *JOB]) == 0
    moved = dict(summary, run_dir=str(run), hf_checkpoint=str(run / "hf"))  # the copy's own paths
    assert json.loads((run / "summary.json").read_text()) == moved
    for name in ("eval_sft.json", "eval_rl.json", "config.json"):
        json.loads((run / name).read_text())
    assert _max_diff(_params(run), finished_params) == 0.0


def test_json_files_are_replaced_whole(tmp_path, monkeypatch):
    """A kill between writing and renaming leaves the previous file whole (and a stray temp file at most)."""
    from spatial_jax.rl.report import write_json

    path = tmp_path / "x.json"
    assert write_json(path, {"a": 1})
    assert not write_json(path, {"a": 1})  # an identical file is left as it is

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_json(path, {"a": 2, "b": list(range(1000))})
    assert json.loads(path.read_text()) == {"a": 1}


def _largest_file(folder: Path) -> Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


DAMAGES = {
    "cut array data": lambda ck: _cut(_largest_file(ck / "state")),
    "empty meta": lambda ck: (ck / "meta" / "metadata").write_text(""),
    "no state": lambda ck: shutil.rmtree(ck / "state"),
    "cut state metadata": lambda ck: _cut(ck / "state" / "_METADATA"),
}


# orbax reads a checkpoint's arrays in parallel coroutines; when one fails, the others are dropped unfinished
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(damage, finished, finished_params, tmp_path,
                                                                    capsys):
    run = _copy(finished, tmp_path / "run")
    latest = run / "rl" / "checkpoints" / "9"
    DAMAGES[damage](latest)
    capsys.readouterr()
    assert main(["train", f"run_dir={run}", *JOB]) == 0  # resumes from 6 and trains steps 7-9 again
    err = capsys.readouterr().err
    assert str(latest) in err and "step 6" in err, err
    assert _max_diff(_params(run), finished_params) == 0.0
    rows = [json.loads(line)["step"] for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert rows == list(range(1, 10))
    if damage == "empty meta":  # `eval` falls back as well (to the retrained 9 here, after a new damage)
        DAMAGES[damage](latest)
        out = tmp_path / "eval.json"
        assert main(["eval", f"--output={out}", f"run_dir={run}", *JOB, "eval.max_samples=2"]) == 0
        assert str(latest) in capsys.readouterr().err
        assert json.loads(out.read_text())["summary"]["n"] == 2


@contextlib.contextmanager
def _read_only(folder: Path):
    """`folder` and everything in it cannot be written by this process (as root, which ignores file modes: by
    acting as user `nobody` for the duration)."""
    paths = [folder, *folder.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    for p in paths:
        p.chmod(modes[p] & ~0o222)
    root = os.geteuid() == 0
    if root:
        os.setegid(65534)
        os.seteuid(65534)
    try:
        yield
    finally:
        if root:
            os.seteuid(0)
            os.setegid(0)
        for p in paths:
            p.chmod(modes[p])


def test_a_finished_run_reruns_in_a_read_only_directory(finished, capsys):
    base = Path(tempfile.mkdtemp())  # outside pytest's private (0700) folders, so `nobody` can read it
    try:
        base.chmod(0o755)
        run = _copy(finished, base / "run")
        assert main(["train", f"run_dir={run}", *JOB]) == 0  # the copy's own config.json and summary.json
        summary = (run / "summary.json").read_text()
        with _read_only(run):
            assert main(["train", f"run_dir={run}", *JOB]) == 0
            capsys.readouterr()
            assert main(["eval", f"run_dir={run}", *JOB]) == 2  # its report would go to the run directory
            err = capsys.readouterr().err
            assert "eval_cli.json" in err and "evaluating" not in err
        assert (run / "summary.json").read_text() == summary
    finally:
        shutil.rmtree(base)


def test_eval_checks_its_output_before_the_work(finished, tmp_path, capsys):
    out = tmp_path / "missing" / "eval.json"
    assert main(["eval", f"--output={out}", f"run_dir={finished}", *JOB]) == 2
    captured = capsys.readouterr()
    assert str(out.parent) in captured.err and "evaluating" not in captured.out
    assert not out.parent.exists()


def test_eval_of_a_run_without_checkpoints_refuses_and_creates_nothing(dense, tmp_path, capsys):
    typo = tmp_path / "typo"
    assert main(["eval", f"run_dir={typo}", *JOB, "eval.max_samples=2"]) == 2
    assert str(typo) in capsys.readouterr().err
    assert not typo.exists()
    out = tmp_path / "initial.json"  # the untrained policy, on purpose
    assert main(["eval", "--initial", f"--output={out}", f"run_dir={typo}", *JOB, "eval.max_samples=2"]) == 0
    assert json.loads(out.read_text())["checkpoint"] is None and not typo.exists()


def _error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("spatial-jax")]
    assert len(lines) == 1 and lines[0].startswith(f"spatial-jax {command}: "), err
    return lines[0]


def test_anticipated_errors_are_one_line_and_a_nonzero_status(dense, finished, tmp_path, capsys):
    missing = tmp_path / "none.jsonl"
    assert main(["train", f"run_dir={tmp_path / 'a'}", *JOB, f"data.train={missing}"]) != 0  # DatasetError
    assert str(missing) in _error_line(capsys, "train")
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert main(["train", f"run_dir={a_file}", *JOB]) != 0  # OSError on the run directory
    assert str(a_file) in _error_line(capsys, "train")
    run = _copy(finished, tmp_path / "run")
    for step in (6, 9):  # every RL checkpoint damaged: nothing to fall back to
        DAMAGES["empty meta"](run / "rl" / "checkpoints" / str(step))
    assert main(["eval", f"run_dir={run}", *JOB]) != 0
    line = _error_line(capsys, "eval")
    assert str(run / "rl" / "checkpoints" / "6") in line and str(run / "rl" / "checkpoints" / "9") in line


def test_a_broken_input_fails_before_training(dense, tmp_path, capsys):
    bad = tmp_path / "eval.jsonl"
    bad.write_text('{"id": "x", "question": \n')
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *JOB, f"data.eval={bad}"]) != 0
    assert f"{bad}:1" in _error_line(capsys, "train")
    assert not run.exists()  # found before the SFT stage, before anything was written


@pytest.mark.parametrize(
    "override, match",
    [
        ("seed=9223372036854775808", "seed must lie in [0, 2147483647]"),
        ("seed=-1", "seed must lie in [0, 2147483647]"),
        ("policy.init_seed=-5", "policy.init_seed must lie in [0, 2147483647]"),
        ("data.seed=-1", "data.seed must"),
        ("data.seed=4294967296", "data.seed must"),
        ("data.synthetic.seed=-1", "data.synthetic.seed must"),
        ("rl.steps=9223372036854775808", "rl.steps"),
        ("sft.steps=4294967296", "sft.steps must lie in [0, 2147483647]"),
        ("rl.steps=-1", "rl.steps must lie in [0, 2147483647], got -1"),
    ],
)
def test_absurd_values_fail_at_load(override, match):
    with pytest.raises(C.ConfigError, match=re.escape(match)):
        C.load(TrainConfig, None, [override])


@pytest.mark.parametrize("override", ["rl.sampling.max_new_tokens=100000000", "eval.max_new_tokens=40000",
                                      "data.bucket_lengths=[256,65536]"])
def test_sequences_longer_than_the_policy_context_fail_before_anything_runs(dense, override, tmp_path):
    from spatial_jax.rl.train import Trainer

    with pytest.raises(C.ConfigError, match="32768"):  # the tiny policy's max_position_embeddings
        Trainer(C.load(TrainConfig, None, [f"run_dir={tmp_path}", *JOB, override]))


def test_eval_names_the_weight_layout_a_run_was_trained_with(tmp_path, capsys):
    """A checkpoint of scanned layers read into an unrolled policy: one line naming the setting, not orbax's
    tree-structure mismatch."""
    from spatial_jax.rl.train import train

    run = tmp_path / "run"
    base = [f"run_dir={run}", *JOB, "method=spatialcore", "sft.steps=2", "rl.steps=0", "eval.after_sft=false"]
    train(C.load(TrainConfig, None, [*base, "policy.scan_layers=true"]))
    assert main(["eval", *base, "eval.max_samples=2"]) == 2
    assert "was trained with policy.scan_layers=True (here False)" in capsys.readouterr().err


def test_an_undecodable_image_fails_before_anything_compiles(dense, tmp_path, capsys, monkeypatch):
    """Issue 36 item 27: a row's image that exists but does not decode is found when the job starts (the README's
    promise), not when the evaluation after SFT first reads it."""
    from spatial_jax.data import synthetic
    from spatial_jax.data.jsonl import write_jsonl
    from spatial_jax.rl import workspace

    data = tmp_path / "eval.jsonl"
    write_jsonl(synthetic.generate(synthetic.SyntheticConfig(), "heldout", 2), data)
    image = tmp_path / json.loads(data.read_text().splitlines()[1])["image"]
    image.write_bytes(image.read_bytes()[:40])  # the header alone: PIL opens it, decoding fails

    def built(*args, **kwargs):
        raise AssertionError("the policy was built")

    monkeypatch.setattr(workspace, "build_policy", built)
    run = tmp_path / "run"
    assert main(["train", f"run_dir={run}", *JOB, f"data.eval={data}"]) == 1
    line = _error_line(capsys, "train")
    assert line.startswith(f"spatial-jax train: data.eval: {data}:2: image {image}: "), line
    assert not run.exists()
