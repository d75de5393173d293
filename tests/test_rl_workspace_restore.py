"""Workspace.restore's damage handling on tiny checkpoints, without building a policy: the newest checkpoint that reads
back is restored (weights, optimiser state, KL reference, data position), each newer one skipped is named with its
reason, and only a training job's first process moves them aside (an eval writes nothing in the run directory)."""

from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from spatial_jax.rl.checkpoint import Checkpointer
from spatial_jax.rl.workspace import Workspace


class Iterator:
    def __init__(self):
        self.states = []

    def set_state(self, state):
        self.states.append(state)


def bare(training: bool, primary: bool = True, reference=None) -> Workspace:
    """A Workspace with only what restore reads: the policy's trainable weights stand in as one array."""
    ws = object.__new__(Workspace)
    ws.cfg = SimpleNamespace(progress=True)
    ws.primary, ws.training = primary, training
    ws.trainable, ws.reference, ws.restored_meta = {"w": jnp.zeros(3)}, reference, {"stale": True}
    return ws


@pytest.fixture
def run(tmp_path):
    """rl/checkpoints/{1,2,3}: weights, optimiser state and reference filled with the step; step 3 damaged."""
    stage = tmp_path / "rl"
    with Checkpointer(stage, async_save=False) as ck:
        for s in (1, 2, 3):
            state = {"params": {"w": jnp.full(3, float(s))}, "opt": {"m": jnp.full(2, -float(s))},
                     "ref": {"w": jnp.full(3, 10.0 * s)}}
            ck.save(s, state, {"step": s, "data": {"pos": 100 + s}})
    (stage / "checkpoints" / "3" / "meta" / "metadata").write_text("")
    return stage


def test_no_checkpoint_restores_nothing(tmp_path):
    ws = bare(training=True)
    with Checkpointer(tmp_path / "rl") as ck:
        assert ws.restore(ck, "opt", Iterator()) == (0, "opt", False)
    assert ws.restored_meta == {} and float(ws.trainable["w"][0]) == 0.0


def test_a_training_job_restores_the_newest_readable_and_moves_the_damaged_aside(run, capsys):
    ws, it = bare(training=True, reference={"w": jnp.zeros(3)}), Iterator()
    with Checkpointer(run) as ck:
        step, opt, restored = ws.restore(ck, {"m": jnp.zeros(2)}, it)
        assert (step, restored) == (2, True) and ck.all_steps() == [1, 2]
    np.testing.assert_array_equal(ws.trainable["w"], [2, 2, 2])
    np.testing.assert_array_equal(opt["m"], [-2, -2])
    np.testing.assert_array_equal(ws.reference["w"], [20, 20, 20])
    assert it.states == [{"pos": 102}] and ws.restored_meta == {"step": 2, "data": {"pos": 102}}
    out, err = capsys.readouterr()
    damaged = run / "checkpoints" / "3"
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith(f"spatial-jax: skipped checkpoint {damaged}: ChecksumMismatch")
    assert lines[0].endswith("; using rl step 2")
    assert lines[1] == f"spatial-jax: moved the unreadable {damaged} to {run / 'damaged_checkpoints' / '3'}"
    assert out == f"resumed {run / 'checkpoints'} at step 2\n"


@pytest.mark.parametrize("training, primary", [(False, True), (True, False)])
def test_an_eval_or_another_process_moves_nothing(run, training, primary, capsys):
    ws = bare(training=training, primary=primary, reference={"w": jnp.zeros(3)})
    with Checkpointer(run, reader=not training) as ck:
        step, _, restored = ws.restore(ck, {"m": jnp.zeros(2)}, None)
        assert (step, restored) == (2, True) and ck.all_steps() == [1, 2, 3]
    np.testing.assert_array_equal(ws.trainable["w"], [2, 2, 2])
    out, err = capsys.readouterr()
    assert "moved" not in err and not (run / "damaged_checkpoints").exists()
    assert ("skipped checkpoint" in err) == primary and (out != "") == primary


@pytest.mark.parametrize("processes", [1, 2])
def test_the_processes_meet_after_the_first_moved_the_damaged(run, processes, monkeypatch, capsys):
    """With several processes, each waits for the first to have moved the damaged steps, then lists them again."""
    from jax.experimental import multihost_utils

    from spatial_jax.rl import workspace

    met = []  # the workspace alone is told of other processes (orbax, asked too, would want a distributed runtime)
    monkeypatch.setattr(workspace, "jax", SimpleNamespace(process_count=lambda: processes))
    monkeypatch.setattr(multihost_utils, "sync_global_devices", met.append)
    ws = bare(training=True, reference={"w": jnp.zeros(3)})
    with Checkpointer(run) as ck:
        assert ws.restore(ck, {"m": jnp.zeros(2)}, None)[0] == 2 and ck.all_steps() == [1, 2]
    assert met == (["checkpoints set aside"] if processes > 1 else [])
