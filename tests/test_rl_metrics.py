"""MetricsWriter (JSONL + TensorBoard, resume without duplicates), ProgressBar, an RL step's rollout figures."""

import io
import json
import struct
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from spatial_jax.rl import metrics as M


def tb_scalars(tb_dir, tag):
    """Scalars of `tag` as TensorBoard shows them: event files in name order, records framed as TFRecords
    (u64 length, u32 crc, payload, u32 crc), and a SessionLog START at step s discarding earlier events >= s."""
    from tensorboardX.proto import event_pb2

    kept = []
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                kept = [(s, v) for s, v in kept if s < event.step]
            for value in event.summary.value:
                if value.tag == tag:
                    kept.append((event.step, value.simple_value))
    return kept


def test_jsonl_types_and_flush(tmp_path):
    w = M.MetricsWriter(tmp_path, tensorboard=False)
    row = w.log(1, {"loss": jnp.float32(0.5), "n": np.int64(3), "ok": np.bool_(True), "tag": "x", "bad": float("nan")})
    # Flushed: readable before close.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == row
    assert row["loss"] == 0.5 and row["n"] == 3 and row["ok"] is True and row["tag"] == "x" and row["bad"] is None
    with pytest.raises(TypeError, match="scalar"):
        w.log(2, {"vec": np.ones(3)})
    with pytest.raises(ValueError, match="reserved"):
        w.log(2, {"step": 1})
    w.close()


def test_resume_drops_lines_after_checkpoint(tmp_path):
    with M.MetricsWriter(tmp_path, tensorboard=False) as w:
        for step in range(1, 8):
            w.log(step, {"loss": float(step)})
    # The killed run also left half a line behind.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "lo')
    with M.MetricsWriter(tmp_path, resume_step=5, tensorboard=False) as w:
        for step in range(6, 9):
            w.log(step, {"loss": 10.0 * step})
    rows = M.read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert [r["loss"] for r in rows] == [1, 2, 3, 4, 5, 60, 70, 80]
    # A fresh start (no checkpoint) empties the log.
    M.MetricsWriter(tmp_path, tensorboard=False).close()
    assert M.read_metrics(tmp_path / "metrics.jsonl") == []


def test_tensorboard_mirror_and_purge(tmp_path):
    with M.MetricsWriter(tmp_path) as w:
        for step in range(1, 5):
            w.log(step, {"loss": float(step), "note": "text is not a scalar"})
    with M.MetricsWriter(tmp_path, resume_step=2) as w:
        w.log(3, {"loss": 30.0})
    got = tb_scalars(tmp_path / "tb", "loss")
    assert [s for s, _ in got] == [1, 2, 3]
    assert [v for _, v in got] == [1.0, 2.0, 30.0]
    # A fresh start (no checkpoint) leaves no events of the earlier run behind, like the JSONL log.
    with M.MetricsWriter(tmp_path) as w:
        w.log(1, {"loss": 100.0})
    assert tb_scalars(tmp_path / "tb", "loss") == [(1, 100.0)]


def test_progress_bar_shows_key_figures():
    out = io.StringIO()
    bar = M.ProgressBar(total=10, initial=2, keys=("loss", "reward_mean", "missing"), file=out, disable=False)
    text = bar.update({"loss": jnp.float32(0.123456), "reward_mean": 1, "other": 5.0})
    assert text == "loss=0.1235, reward_mean=1"
    assert bar.n == 3
    bar.close()
    shown = out.getvalue()
    assert "3/10" in shown and "loss=0.1235" in shown and "reward_mean=1" in shown and "other" not in shown


def test_rollout_figures_every_rl_step_logs():
    """The share of groups with any reward spread, the share of well-formed rollouts by the method plug-in's own
    test, and the mean entropy over the completions' tokens only."""
    from spatial_jax.methods import get_method
    from spatial_jax.rl.report import rollout_metrics

    method = get_method("spatialthinker")  # well-formed: its format component > 0
    rewards = np.array([[0.5, 0.5, 0.5], [0.1, 0.1, 0.6], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]], np.float32)
    formats = [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    scores = [{"reward": float(r), "accuracy": 0.0, "format": f} for r, f in zip(rewards.reshape(-1), formats)]
    mask = np.zeros((12, 4), np.int32)
    mask[:, :2] = 1
    entropies = np.where(mask > 0, 2.0, 50.0).astype(np.float32)  # padding's entropy must not count
    entropies[0, 0] = 4.0
    comps = SimpleNamespace(mask=mask, entropies=entropies)
    out = rollout_metrics(method, scores, rewards, np.zeros(12, np.float32), comps)
    assert out["groups_with_spread"] == 0.5 and out["well_formed"] == pytest.approx(7 / 12)
    assert out["entropy_mean"] == pytest.approx((2.0 * 23 + 4.0) / 24)
