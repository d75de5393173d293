"""Run metrics: one JSON line per step in metrics.jsonl, TensorBoard scalars, a progress bar, curve plots.
(Evaluation summaries with standard errors live in spatial_jax.eval.grounding.estimate.)"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


def _to_json_value(value: Any) -> Any:
    """Python/numpy/jax scalars -> float or int; non-finite floats -> None (JSON has no NaN); strings kept."""
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if hasattr(value, "shape") and value.shape == ():
        value = value.item()
        if isinstance(value, (bool, int)):
            return value
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    raise TypeError(f"metric value {value!r} is not a scalar or string")


def write_atomic(path: str | Path, data: str | bytes) -> bool:
    """Writes `data` to `path` whole: into a temp file renamed over it, so a kill leaves the old file or the new one,
    never a cut one. An identical file is left as it is (a finished run reruns in a read-only directory); returns
    whether it wrote."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        if path.read_bytes() == raw:
            return False
    except OSError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(raw)
    os.replace(tmp, path)
    return True


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; unparseable lines (e.g. a line cut by a kill) are skipped."""
    rows = []
    path = Path(path)
    if not path.exists():
        return rows
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
    return rows


class MetricsWriter:
    """Appends {"step", "time", **metrics} per step to run_dir/metrics.jsonl and mirrors numbers to TensorBoard.

    resume_step: the checkpoint step the run resumes from. Lines with step > resume_step (written after that
    checkpoint by the killed run) are dropped, so the log has no duplicate steps. None starts a fresh log
    (the previous file, if any, is emptied: with no checkpoint nothing of it can be continued).
    tensorboard: write TensorBoard events under run_dir/tb (purging events after resume_step; a fresh start
    deletes the old event files, as it empties the JSONL log).
    active: False makes a writer that writes nothing (the processes of a multi-host run other than the first).
    """

    def __init__(self, run_dir: str | Path, resume_step: int | None = None, tensorboard: bool = True,
                 active: bool = True):
        self._file = self._tb = None
        if not active:
            return
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        keep = [] if resume_step is None else [r for r in read_metrics(self.path) if r["step"] <= resume_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in keep:
                f.write(json.dumps(row) + "\n")
        os.replace(tmp, self.path)  # atomic: a kill here leaves either the old or the trimmed log
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            if resume_step is None:
                for old in (self.run_dir / "tb").glob("events.out.tfevents.*"):
                    old.unlink()
            # A unique suffix keeps a resumed run in the same second from overwriting the previous event file.
            self._tb = SummaryWriter(
                logdir=str(self.run_dir / "tb"), purge_step=purge, filename_suffix=f".{time.time_ns()}"
            )

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Writes one line for `step` (flushed at once) and the numeric values to TensorBoard; returns the row."""
        if "step" in metrics or "time" in metrics:
            raise ValueError("metric names 'step' and 'time' are reserved")
        row: dict[str, Any] = {"step": int(step), "time": time.time()}
        for key, value in metrics.items():
            row[str(key)] = _to_json_value(value)
        line = json.dumps(row, allow_nan=False)  # serialised even when inactive: every process fails alike
        if self._file is None:
            return row
        self._file.write(line + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in row.items():
                if key not in ("step", "time") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, global_step=int(step))
            self._tb.flush()
        return row

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ProgressBar:
    """tqdm bar over training steps showing the latest value of `keys` (those present in each update)."""

    def __init__(self, total: int | None, initial: int = 0, keys: Sequence[str] = ("loss", "reward_mean", "lr"),
                 disable: bool | None = None, desc: str = "train", file: Any = None):
        import sys

        from tqdm.auto import tqdm

        self.keys = tuple(keys)
        stream = sys.stderr if file is None else file
        # In a log file (CI, nohup) every redraw is a new line: redraw every 30 s there instead of on every step.
        self._interactive = bool(getattr(stream, "isatty", lambda: False)())
        self._bar = tqdm(total=total, initial=initial, disable=disable, desc=desc, dynamic_ncols=True, file=stream,
                         mininterval=0.1 if self._interactive else 30.0)

    @property
    def n(self) -> int:
        """Steps done so far (including `initial`)."""
        return self._bar.n

    def update(self, metrics: dict[str, Any], n: int = 1) -> str:
        """Advances by n steps and shows the key figures; returns the postfix text."""
        parts = {}
        for key in self.keys:
            if key in metrics and metrics[key] is not None:
                value = _to_json_value(metrics[key])
                parts[key] = f"{value:.4g}" if isinstance(value, float) else str(value)
        self._bar.set_postfix(parts, refresh=False)
        self._bar.update(n)
        if self._interactive:
            self._bar.refresh()
        return ", ".join(f"{k}={v}" for k, v in parts.items())

    def close(self) -> None:
        self._bar.close()
