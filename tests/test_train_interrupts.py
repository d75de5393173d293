"""A training job stopped mid-stage, by a full disk, a bad input or SIGINT / SIGTERM: one line `spatial-jax train:
...`, no traceback, the pending checkpoint committed (never left as `*.orbax-checkpoint-tmp`) or removed, and a rerun
resumes (issue 36 items 13-15)."""

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache

from spatial_jax.cli import main
from spatial_jax.data.sample import DatasetError
from spatial_jax.rl.learner import Learner

ROOT = Path(__file__).resolve().parents[1]
JOB = ["sft.batch_size=2", "sft.checkpoint_every=2", "rl.steps=0", "data.train=synthetic:train:16",
       "eval.after_sft=false", "export_hf=false", "tensorboard=false", "progress=false",
       "data.bucket_lengths=[256,512]", "seed=3"]


@pytest.fixture(autouse=True, scope="module")
def compiled_once(tmp_path_factory):
    """Each job of the module compiles the same SFT step (a new optimiser object each time, so jit's memory of it
    misses): kept on disk, the later jobs (the subprocess's too) load it. jax decides once whether it uses the
    cache, so that is reset on the way in and out."""
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")
    before = {key: getattr(jax.config, key) for key in keys}
    cache = tmp_path_factory.mktemp("xla_cache")
    for key, value in zip(keys, (str(cache), 0.0, 0), strict=True):
        jax.config.update(key, value)
    compilation_cache.reset_cache()
    yield cache
    for key, value in before.items():
        jax.config.update(key, value)
    compilation_cache.reset_cache()


def _error_line(err: str, command: str = "train") -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("spatial-jax")]
    assert len(lines) == 1 and lines[0].startswith(f"spatial-jax {command}: "), err
    return lines[0]


def _committed(run: Path) -> list[str]:
    """The entries of the SFT stage's checkpoint folder: committed steps only, no partial save."""
    return sorted(p.name for p in (run / "sft" / "checkpoints").iterdir())


def _resumes(run: Path, steps: int, capsys) -> None:
    """A rerun finishes the stage, each step's metrics once."""
    assert main(["train", f"run_dir={run}", f"sft.steps={steps}", *JOB]) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in (run / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))


def _stop_at(monkeypatch, at: int, stop) -> None:
    """Learner.sft_step calls stop() before step index `at` (after the save of step `at` has started)."""
    step_fn = Learner.sft_step

    def sft_step(self, step, *args):
        if step == at:
            stop()
        return step_fn(self, step, *args)

    monkeypatch.setattr(Learner, "sft_step", sft_step)


def test_a_bad_input_mid_stage_keeps_the_pending_checkpoint(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"

    def bad_image():
        raise DatasetError("rows.jsonl:7: images/7.png is not an image")

    _stop_at(monkeypatch, 2, bad_image)
    assert main(["train", f"run_dir={run}", "sft.steps=3", *JOB]) == 1
    assert "images/7.png is not an image" in _error_line(capsys.readouterr().err)
    assert _committed(run) == ["2"]
    assert (run / "sft" / "checkpoints" / "2" / "checksums.json").is_file()  # sealed, as on a clean close
    monkeypatch.undo()
    _resumes(run, 3, capsys)


def test_sigint_during_a_save_names_the_step_and_a_rerun_resumes(tmp_path, monkeypatch, capsys):
    assert threading.current_thread() is threading.main_thread()  # where Python runs signal handlers
    # Python's default handler, or SIG_IGN where the suite itself was started in the background without job control
    before = signal.getsignal(signal.SIGINT)
    run = tmp_path / "run"
    _stop_at(monkeypatch, 2, lambda: os.kill(os.getpid(), signal.SIGINT))
    assert main(["train", f"run_dir={run}", "sft.steps=3", *JOB]) == 128 + signal.SIGINT
    line = _error_line(capsys.readouterr().err)
    assert line == ("spatial-jax train: interrupted at step 2 of the sft stage; rerun to resume from its checkpoint "
                    "of step 2")
    assert _committed(run) == ["2"]
    assert signal.getsignal(signal.SIGINT) is before  # the handlers before are back
    monkeypatch.undo()
    _resumes(run, 3, capsys)


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_full_disk_during_a_checkpoint_is_one_line_and_leaves_no_partial_save(tmp_path, capsys):
    """Files past 256 KiB fail to write (RLIMIT_FSIZE: EFBIG, as ENOSPC, from tensorstore's threads), which the
    checkpoint's array files are and the run's other files are not. tensorstore's callbacks of the failed writes
    print tracebacks through sys.unraisablehook, which pytest turns into a warning, here an error."""
    run = tmp_path / "run"
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    xfsz = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process dying
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, limits[1]))
    try:
        status = main(["train", f"run_dir={run}", "sft.steps=3", *JOB])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, xfsz)
    assert status == 1
    line = _error_line(capsys.readouterr().err)
    assert "checkpoint step 2 could not be written" in line and "File too large" in line, line
    assert _committed(run) == []  # the partial save is removed: a full disk gets its space back
    _resumes(run, 3, capsys)


@pytest.mark.slow
def test_sigterm_to_a_running_job_commits_its_save_and_says_where_it_stopped(compiled_once, tmp_path, capsys):
    run = tmp_path / "run"
    command = [sys.executable, "-m", "spatial_jax.cli", "train", f"run_dir={run}", "sft.steps=6", *JOB]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_COMPILATION_CACHE_DIR=str(compiled_once),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    proc = subprocess.Popen(command, env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while proc.poll() is None and not (run / "sft" / "checkpoints" / "2").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    line = _error_line(err)
    assert "interrupted at step " in line and line.endswith("rerun to resume from its checkpoint of step 2"), line
    assert _committed(run) == ["2"]
    _resumes(run, 6, capsys)
