"""One-step-off-policy rollouts (rl.rollout_mode = "one_step_off"): step k + 1's rollouts are sampled in a thread
while step k's update runs.

As in verl's one-step-off mode (docs/advance/one_step_off.md) and tunix's disaggregated rollouts: the decoding copy
of the weights step k starts from (theta_k) samples the next batch, on a rollout mesh of its own when
decode.devices > 0 (the copy's refresh is the one weight transfer per step), while the trainer's mesh updates
theta_k -> theta_k+1. Step k + 1 then trains on rollouts of theta_k: its importance ratio pi_theta / pi_old takes
pi_old from the sampler's log-probs (one step stale), bounded by the loss's clip (rl/losses.py); the lag (1, or 0 on
the first step and with rl.rollout_lag = 0) is logged per step as rollout/lag. With rl.old_logp = "trainer" pi_old is
the trainer's at theta_k+1 instead (verl's default), and the trainer keeps a copy of theta_k to split the gap between
the sampler and the update into numerics (gap/numeric/*, theta_k on both sides) and staleness (gap/staleness/*).

Resume: the checkpoint after step k holds theta_k+1, but step k + 1's rollouts came from theta_k. They are saved
beside it (<stage>/pending/<step>.pkl, the file's SHA-256 in the checkpoint's meta, checked before it is read), so a
resumed run trains on the rollouts an uninterrupted one does. Where that file is gone or changed, the step's prompts
are read again and rolled out from the restored weights, with a warning: the run then departs from an uninterrupted
one by that one step's staleness.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from spatial_jax.rollout.completions import Completions


@dataclasses.dataclass
class Rolled:
    """A step's rollouts, scored, as its update takes them."""

    step: int  # the step whose update trains on them
    version: int  # updates the sampling weights had seen (the step's lag is step - version)
    completions: Completions
    scores: list[dict[str, float]]
    trained: np.ndarray | None  # [R] False where dynamic sampling padded the batch (loss masked out)
    metrics: dict[str, float]  # the sampling's own metrics (dynamic sampling's, per-process counts)
    seconds: float  # spent sampling and scoring
    tokens: float  # tokens decoded, every sampling round's


class RolloutsAhead:
    """At most one batch of rollouts in flight, sampled by a worker thread; saved with a checkpoint and read back
    on resume (the module's docstring)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts")
        self._future: concurrent.futures.Future | None = None
        self._ready: Rolled | None = None  # finished (or read back from a checkpoint), not yet taken
        self.data_before: dict | None = None  # the data position before the batch in flight was read
        self.waited = 0.0  # seconds the last `take` waited for the thread

    def start(self, sample: Callable[[], Rolled], data_before: dict) -> None:
        """Samples in the worker thread; the previous batch must have been taken."""
        if self._future is not None or self._ready is not None:
            raise RuntimeError("a batch of rollouts is already ahead of the update")
        self.data_before = data_before
        self._future = self._pool.submit(sample)

    def _finish(self) -> Rolled | None:
        if self._future is not None:
            future, self._future = self._future, None
            self._ready = future.result()  # the thread's error, raised here with its traceback
        return self._ready

    def take(self, step: int) -> Rolled | None:
        """Step `step`'s rollouts, once sampled (waiting for the thread), or None when none are ahead."""
        t0 = time.perf_counter()
        rolled = self._finish()
        self.waited = time.perf_counter() - t0
        if rolled is None:
            return None
        if rolled.step != step:
            raise RuntimeError(f"the rollouts ahead are step {rolled.step}'s, not step {step}'s")
        self._ready = None
        return rolled

    def save(self, checkpoint_step: int) -> dict[str, Any]:
        """Waits for the batch in flight and writes it for the checkpoint of `checkpoint_step` (whose meta takes the
        returned record); {} when nothing is ahead. Files of older checkpoints than the kept ones go (`prune`)."""
        rolled = self._finish()
        if rolled is None:
            return {}
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{checkpoint_step}.pkl"
        part = path.with_name(path.name + ".part")
        data = pickle.dumps(rolled, protocol=pickle.HIGHEST_PROTOCOL)
        with open(part, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, path)
        return {"pending": {"file": path.name, "sha256": hashlib.sha256(data).hexdigest(), "step": rolled.step,
                            "data_before": self.data_before}}

    def prune(self, kept_steps: list[int]) -> None:
        """Removes the files of checkpoints no longer kept (older than the oldest kept one)."""
        if not kept_steps or not self.directory.is_dir():
            return
        for path in self.directory.glob("*.pkl"):
            if path.stem.isdigit() and int(path.stem) < min(kept_steps):
                path.unlink(missing_ok=True)

    def load(self, record: dict[str, Any]) -> str | None:
        """Takes back the rollouts a checkpoint's meta names; returns why it could not (then nothing is ahead)."""
        path = self.directory / record["file"]
        try:
            data = path.read_bytes()  # read once: hashed, then unpickled
        except OSError as e:
            return f"{path} does not read ({e.strerror or e})"
        digest = hashlib.sha256(data).hexdigest()
        if digest != record["sha256"]:
            return f"{path} has changed since it was written (SHA-256 {record['sha256'][:12]} -> {digest[:12]})"
        rolled = pickle.loads(data)  # our own file, its digest checked against the checkpoint's record
        if not isinstance(rolled, Rolled) or rolled.step != record["step"]:
            return f"{path} does not hold step {record['step']}'s rollouts"
        self._ready = rolled
        return None

    def drain(self) -> None:
        """Lets a batch in flight finish (a stage leaving on an error), dropping it and its error."""
        if self._future is not None:
            concurrent.futures.wait([self._future])
        self._future = self._ready = None

    def close(self) -> None:
        self.drain()
        self._pool.shutdown(wait=True)
