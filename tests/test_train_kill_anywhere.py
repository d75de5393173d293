"""Kill the training job anywhere, run it again, and it ends where an uninterrupted run does.

A small job (SFT 6 steps, evaluation, RL 24 steps with checkpoints every 3, evaluation, summary) with a dense test
reward, so every RL step moves the weights (a random policy earns the real rewards' constant, and resuming a run
whose steps change nothing would prove nothing), is SIGKILLed at least 10 times: each time a moment is drawn in
one of the job's phases (startup and restore, SFT steps, checkpoint writes, the evaluations and their cache files,
RL steps, the summary) by waiting for the job's own progress (lines of metrics.jsonl, files appearing) and then a
random delay. After the last kill the job runs to its end; its parameters must equal those of an uninterrupted
run, and its metrics must hold each step once. Marked `soak` (minutes, a dozen kills): deselected from the suite,
run by .ci/run in its soak step.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import spatial_jax.methods
from spatial_jax import config as C
from spatial_jax.rl.config import TrainConfig
from spatial_jax.testing import dense_methods

ROOT = Path(__file__).resolve().parents[1]
JOB = [
    "sft.steps=6", "sft.batch_size=2", "sft.checkpoint_every=3", "rl.steps=24", "rl.checkpoint_every=3",
    "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=12", "data.train=synthetic:train:16",
    "data.eval=synthetic:heldout:4", "eval.batch_size=4", "eval.max_new_tokens=12", "tensorboard=false",
    "progress=false", "data.bucket_lengths=[256,512]", "method=dense_spatialcore", "seed=3",
]
# One kill each, in the job's order: (the progress to wait for, the upper end of the random delay after it in
# seconds). Progress counts what the job has written: SFT metrics lines (6), eval_sft.json (1), RL metrics lines
# (24), eval_rl.json (1). A run resumed from a checkpoint first trims the lines written after it, so it reaches a
# mark again by its own work; a mark already passed when it starts gets it killed during startup or restore. The
# marks before a stage's end stop short of its last checkpoint, so that the next run trains up to it and is then
# killed in the last checkpoint's write or the evaluation.
MOMENTS = [
    (0, 4.0),  # startup, restore, compilation
    (2, 0.3), (4, 0.2),  # SFT steps
    (6, 2.0),  # the last SFT checkpoint, the evaluation after SFT, writing eval_sft.json
    (7, 0.5),  # the RL stage starting
    (10, 0.2), (15, 0.4), (19, 0.2), (22, 0.3), (25, 0.2),  # RL steps and checkpoints (every 3)
    (31, 2.0),  # the last RL checkpoint, the evaluation after RL, eval_rl.json
    (32, 0.3),  # summary.json and the curves
]


def _env(cache: Path) -> dict[str, str]:
    # one device, as a user's CPU run; compiled programs cached on disk, so each restart compiles nothing
    return dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS="", JAX_COMPILATION_CACHE_DIR=str(cache),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")


def _command(run_dir: Path) -> list[str]:
    return [sys.executable, "-c", dense_methods.RUNNER, "train", f"run_dir={run_dir}", *JOB]


def _progress(run_dir: Path) -> int:
    lines = 0
    for stage in ("sft", "rl"):
        try:
            lines += len((run_dir / stage / "metrics.jsonl").read_text().splitlines())
        except FileNotFoundError:
            pass
    return lines + sum((run_dir / name).exists() for name in ("eval_sft.json", "eval_rl.json"))


def _params(run_dir: Path):
    from spatial_jax.rl.workspace import Workspace

    job = Workspace(C.load(TrainConfig, None, [f"run_dir={run_dir}", *JOB]))
    assert job.load_latest() == "rl"
    return jax.tree.map(np.asarray, job.trainable)


@pytest.mark.soak
def test_a_run_killed_anywhere_resumes_to_the_same_parameters(tmp_path):
    env = _env(tmp_path / "xla_cache")
    straight = tmp_path / "straight"
    done = subprocess.run(_command(straight), env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    rng = random.Random(0)
    kills = []
    deadline = time.monotonic() + 400
    log = tmp_path / "attempt.log"
    for mark, delay in MOMENTS:
        with open(log, "w") as out:
            proc = subprocess.Popen(_command(killed), env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        while proc.poll() is None and _progress(killed) < mark and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, delay))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills.append((mark, _progress(killed)))
        proc.wait()
        assert proc.returncode in (0, -signal.SIGKILL), log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"the job stalled before progress {mark}"
    assert len(kills) >= 10, kills
    done = subprocess.run(_command(killed), env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    for stage, steps in (("sft", 6), ("rl", 24)):
        rows = [json.loads(line) for line in (killed / stage / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == list(range(1, steps + 1)), stage  # no step lost or repeated
    assert all(r["loss/grad_norm"] > 1e-3 for r in rows)  # every RL step moved the weights
    with dense_methods.registered(spatial_jax.methods):
        a, b = _params(straight), _params(killed)
    assert max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), a, b))) == 0.0, kills
    straight_summary = json.loads((straight / "summary.json").read_text())
    moved = dict(straight_summary, run_dir=str(killed), hf_checkpoint=str(killed / "hf"))
    assert json.loads((killed / "summary.json").read_text()) == moved
