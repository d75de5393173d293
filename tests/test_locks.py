"""One writer per run directory (train, sft, pretrain) and per pseudo-GT output: a second one, started while the first
runs, is refused before it writes anything, naming the first one's pid; a lock its holder left by dying is taken
over with a warning."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spatial_jax.cli import main
from spatial_jax.locks import HOST, Locked, PidLock, start_time

ROOT = Path(__file__).resolve().parents[1]
HOLD = "import sys, time; from spatial_jax.locks import PidLock; PidLock(sys.argv[1], 'x').__enter__(); print(1, " \
       "flush=True); time.sleep(120)"


@pytest.fixture
def holder():
    """holder(path): another process holding the lock at `path` until the test ends; returns its pid."""
    procs = []

    def hold(path: Path) -> int:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        procs.append(proc)
        assert proc.stdout.readline().strip() == "1"
        return proc.pid

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("command", ["train", "sft", "pretrain"])
def test_a_second_job_on_a_run_directory_is_refused_before_writing(command, tmp_path, holder, capsys):
    run = tmp_path / "run"
    pid = holder(run / "run.lock")
    argv = [command, f"run_dir={run}", "sft.steps=1"]
    if command == "pretrain":
        argv = [command, "--config", str(ROOT / "configs/pretrain_tiny.toml"), "--out", str(tmp_path / "base"),
                *argv[1:], "policy.train_vision=true", "policy.lora.rank=0", "policy.lora.vision_rank=0"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == f"spatial-jax {command}: run directory {run} is in use by process {pid} (lock file " \
                  f"{run / 'run.lock'}): wait for it to end, or stop it\n"
    assert os.listdir(run) == ["run.lock"] and not (tmp_path / "base").exists()


def test_a_lock_left_by_a_dead_job_is_taken_over_with_a_warning(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    dead = _dead_pid()
    (run / "run.lock").write_text(f"{dead}\n")
    assert main(["train", f"run_dir={run}", "sft.steps=0", "rl.steps=0", "progress=false"]) == 0
    err = capsys.readouterr().err
    assert f"took over the lock {run / 'run.lock'} of process {dead}, which is no longer running" in err
    assert (run / "config.json").is_file() and not (run / "run.lock").exists()


def test_pseudo_gt_on_an_output_another_run_writes_is_refused(tmp_path, holder, capsys):
    data = tmp_path / "in.jsonl"
    data.write_text('{"id": "a", "image": "x.png", "question": "q", "options": ["l", "r"], "answer": "A"}\n')
    (tmp_path / "x.png").write_bytes(b"")
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "question": "q"')  # the other run is writing its first row
    pid = holder(f"{out}.lock")
    assert main(["pseudo-gt", "--input", str(data), "--output", str(out), "--detector", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"spatial-jax pseudo-gt: --output {out} is in use by process {pid}") and \
        err.count("\n") == 1
    assert out.read_text() == '{"id": "a", "question": "q"'


def test_the_lock_is_released_and_taken_again(tmp_path):
    path = tmp_path / "sub" / "x.lock"
    with PidLock(path, "x"):
        assert path.read_text() == f"{os.getpid()} {HOST} {start_time(os.getpid())}\n"
        with pytest.raises(Locked, match=f"x is in use by process {os.getpid()}"), PidLock(path, "x"):
            pass
    assert not path.exists()
    with PidLock(path, "x"):
        assert path.is_file()


@pytest.mark.parametrize("recorded, taken", [
    ("1\n", False),  # an older lock file naming a live pid: never taken over
    (f"1 {HOST} {start_time(1)}\n", False),  # pid 1 itself, alive
    (f"1 {HOST} {start_time(1) + 1}\n", True),  # pid 1 now names a later process than the holder
    ("1 elsewhere 5\n", False),  # a process of another host, which cannot be seen from here
])
def test_a_live_holder_is_never_taken_over_even_pid_1(recorded, taken, tmp_path, capsys):
    """Issue 44 finding 11: a free flock does not prove the holder dead; the host and start time it recorded do."""
    path = tmp_path / "run.lock"
    path.write_text(recorded)
    if taken:
        with PidLock(path, "x"):
            pass
        assert "took over the lock" in capsys.readouterr().err and not path.exists()
        return
    with pytest.raises(Locked, match="in use by process 1" + (" on host elsewhere" if "elsewhere" in recorded
                                                              else "")):
        PidLock(path, "x").__enter__()
    assert path.read_text() == recorded


def test_liveness_and_start_time_edges(tmp_path, monkeypatch):
    """A holder another user runs is alive (kill answers EPERM); asking never signals it; a process name holding ')'
    does not shift the start time read from /proc/<pid>/stat; a lock file removed while held is left quietly."""
    import io

    from spatial_jax import locks

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert locks._alive(locks.Holder(proc.pid))
        time.sleep(0.2)
        assert proc.poll() is None  # probed with signal 0, not sent a signal
    finally:
        proc.kill()
        proc.wait()
    stat = b"42 (a) b) c) S " + b" ".join(str(i).encode() for i in range(4, 53))
    monkeypatch.setattr(locks, "open", lambda *a, **k: io.BytesIO(stat), raising=False)
    assert locks.start_time(42) == 22  # field 22 of stat(5)
    monkeypatch.undo()

    def refused(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(locks.os, "kill", refused)
    assert locks._alive(locks.Holder(12345))
    monkeypatch.undo()
    with PidLock(tmp_path / "run.lock", "run directory x"):
        (tmp_path / "run.lock").unlink()
