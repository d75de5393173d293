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


def _never_a_pid() -> int:
    """A pid no process can have (above the kernel's pid_max): dead without starting and reaping a process."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


@pytest.mark.parametrize("recorded", ["{pid}\n", "{pid} {host} 5\n", "{pid} {host} -\n"])
def test_a_dead_holder_is_taken_over_in_words_and_the_file_is_ours(recorded, tmp_path, capsys):
    """The dead-job takeover of the train-run test above, without a train run: an older file (pid alone), one naming
    this host and a start time, and one of a holder that had no /proc; the file then names this process, and the
    folders made for it go when it is released."""
    pid = _never_a_pid()
    path = tmp_path / "a" / "b" / "run.lock"
    path.parent.mkdir(parents=True)
    path.write_text(recorded.format(pid=pid, host=HOST))
    with PidLock(path, "x"):
        assert path.read_text() == f"{os.getpid()} {HOST} {start_time(os.getpid())}\n"
    assert capsys.readouterr().err == f"spatial-jax: took over the lock {path} of process {pid}, which is no " \
                                      f"longer running\n"
    assert not path.exists() and (tmp_path / "a" / "b").is_dir()  # folders it did not make stay
    with PidLock(tmp_path / "c" / "d" / "run.lock", "x"):
        assert (tmp_path / "c" / "d").is_dir()
    assert os.listdir(tmp_path) == ["a"]
    (tmp_path / "e").mkdir()
    with PidLock(tmp_path / "e" / "f" / "run.lock", "x"):
        (tmp_path / "e" / "job.txt").write_text("")  # the job's own file: its folder stays, and so do those above
    assert sorted(os.listdir(tmp_path / "e")) == ["job.txt"]


@pytest.mark.parametrize("recorded, holder, older", [
    ("1\n", "process 1", True),
    (f"1 {HOST}\n", "process 1", False),
    ("1 elsewhere -\n", "process 1 on host elsewhere", False),
])
def test_the_refusal_names_the_holder_and_an_older_file(recorded, holder, older, tmp_path):
    path = tmp_path / "run.lock"
    path.write_text(recorded)
    with pytest.raises(Locked) as e:
        PidLock(path, "run directory r").__enter__()
    hint = " (an older lock file, naming no start time: if that process is no job, remove the file)" if older else ""
    assert str(e.value) == f"run directory r is in use by {holder}{hint} (lock file {path}): wait for it to end, " \
                           f"or stop it"


def test_a_garbled_or_own_lock_file_is_taken_quietly(tmp_path, capsys):
    """Bytes that are no pid (here Arabic-Indic digits, which str.isdigit() would take for pid 1) name no holder;
    a file naming this very process (a lock taken again after a crash of its own writing) is not 'taken over'."""
    path = tmp_path / "run.lock"
    for recorded in ["\u0661\n".encode(), b"\xff\xfe 1\n", b"", f"{os.getpid()} {HOST} 5\n".encode(),
                     f"{os.getpid()}\n".encode()]:
        path.write_bytes(recorded)
        with PidLock(path, "x"):
            pass
        assert capsys.readouterr().err == "" and not path.exists()


def test_recorded_reads_pid_host_and_start():
    import tempfile

    from spatial_jax import locks

    def read(text: bytes):
        with tempfile.TemporaryFile() as f:
            f.write(text)
            f.flush()
            return locks._recorded(f.fileno())

    assert read(b"12 h 34\n") == locks.Holder(12, "h", 34)
    assert read(b"12 h -\n") == locks.Holder(12, "h", None)
    assert read(b"12\n") == locks.Holder(12, None, None)
    assert read(b"x 12\n") is None and read(b"") is None
    assert read(b"12 h 3" + b" " * 600 + b"9\n") == locks.Holder(12, "h", 3)  # the first 512 bytes only
    assert read(b"12 h " + b"3" * 507 + b"4\n") == locks.Holder(12, "h", int("3" * 507))


def test_a_lock_file_removed_between_open_and_stat_is_not_still_there(tmp_path):
    path = tmp_path / "run.lock"
    lock = PidLock(path, "x")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        assert lock._still_there(fd)
        path.unlink()
        assert not lock._still_there(fd)
        path.write_text("")  # another file at the path now
        assert not lock._still_there(fd)
    finally:
        os.close(fd)


def test_a_flock_held_by_a_file_naming_no_one_is_another_process(tmp_path):
    """A holder that has locked the file but not yet written itself into it (another open of the file holds the
    flock here, which flock(2) treats as another holder even in this process)."""
    import fcntl

    path = tmp_path / "run.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(Locked) as e:
            PidLock(path, "x").__enter__()
        assert str(e.value) == f"x is in use by another process (lock file {path}): wait for it to end, or stop it"
    finally:
        os.close(fd)


def test_without_flock_the_recorded_holder_decides(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    path = tmp_path / "run.lock"
    with PidLock(path, "x"):
        assert path.is_file()
    path.write_text("1\n")  # pid 1 is alive
    with pytest.raises(Locked, match="in use by process 1"):
        PidLock(path, "x").__enter__()


def test_the_lock_file_is_mode_644_and_says_dash_without_proc(tmp_path, monkeypatch):
    import stat

    from spatial_jax import locks

    monkeypatch.setattr(locks, "start_time", lambda pid: None)
    mask = os.umask(0)
    try:
        with PidLock(tmp_path / "run.lock", "x"):
            assert stat.S_IMODE((tmp_path / "run.lock").stat().st_mode) == 0o644
            assert (tmp_path / "run.lock").read_text() == f"{os.getpid()} {HOST} -\n"
    finally:
        os.umask(mask)


@pytest.mark.parametrize("code, guarded", [("EACCES", False), ("EPERM", False), ("EROFS", False), ("ENOSPC", True)])
def test_a_folder_it_cannot_write_in_is_not_guarded_and_other_errors_raise(code, guarded, tmp_path, monkeypatch):
    """A job that writes nothing there needs no lock (a read-only data folder); any other failure is raised."""
    import errno

    from spatial_jax import locks

    def refuse(*a, **k):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(locks.os, "open", refuse)
    lock = PidLock(tmp_path / "run.lock", "x")
    if guarded:
        with pytest.raises(OSError) as e, lock:
            pass
        assert e.value.errno == errno.ENOSPC
        return
    with lock as held:
        assert held is lock
    assert not (tmp_path / "run.lock").exists()


def test_a_lock_file_replaced_while_waiting_is_locked_anew_and_no_fd_leaks(tmp_path, monkeypatch):
    """The holder removed the file while this process waited for its flock: the new file at the path is locked, and
    the descriptor of the old one is closed."""
    answers = [False, True]
    real = PidLock._still_there
    monkeypatch.setattr(PidLock, "_still_there", lambda self, fd: real(self, fd) and answers.pop(0))
    before = len(os.listdir("/proc/self/fd"))
    with PidLock(tmp_path / "run.lock", "x"):
        assert answers == [] and len(os.listdir("/proc/self/fd")) == before + 1
    assert len(os.listdir("/proc/self/fd")) == before
