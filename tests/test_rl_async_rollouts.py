"""rl.rollout_mode = "one_step_off" (rl/async_rollouts.py, issue 34): rollouts of step k + 1 sampled in a thread, on a
rollout mesh of their own, while step k's update runs.

- lag 0 (the next rollouts start after the update) gives the parameters of "sync" (tolerance 1e-6: the same
  programs on another CPU device; observed equal);
- lag 1: the update of step 1 trains on rollouts of theta_0, its ratio against the sampler's log-probs of theta_0
  (equal to theta_0's recomputed ones within 2e-5, float32 sampler against float32 trainer), and its loss is verl's
  off-policy formula (compute_policy_loss_vanilla with token-mean aggregation, written out below in float64 torch):
  the JAX loss in float64 within 1e-9 of it, the step's own float32 loss within 2e-5;
- a run interrupted after a checkpoint resumes onto the rollouts it had ahead and ends where an uninterrupted one
  does; with those rollouts lost it says so and finishes.
"""

import hashlib
import json
import pickle
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import spatial_jax.methods
from spatial_jax import config as C
from spatial_jax.config import ConfigError
from spatial_jax.interrupts import Interrupted
from spatial_jax.rl import losses
from spatial_jax.rl import step as st
from spatial_jax.rl import train as train_module
from spatial_jax.rl.async_rollouts import Rolled, RolloutsAhead
from spatial_jax.rl.checkpoint import Checkpointer
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.learner import Learner
from spatial_jax.rl.workspace import Workspace
from spatial_jax.testing import dense_methods

TINY = ["sft.steps=0", "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=12",
        "eval.after_rl=false", "data.train=synthetic:train:16", "tensorboard=false", "progress=false",
        "data.bucket_lengths=[256,512]", "export_hf=false", "method=dense_spatialcore", "rl.optim.warmup_ratio=0.0"]
OFF = ["rl.rollout_mode=one_step_off", "decode.devices=1"]


@pytest.fixture
def dense():
    with dense_methods.registered(spatial_jax.methods):
        yield


def _cfg(run, *extra) -> TrainConfig:
    return C.load(TrainConfig, None, [f"run_dir={run}", *TINY, *extra])


def _rows(run):
    return [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]


def _final(run, *extra):
    job = Workspace(_cfg(run, *extra))
    assert job.load_latest() == "rl"
    return jax.tree.map(np.asarray, job.trainable)


def _max_diff(a, b) -> float:
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), a, b)))


@pytest.mark.slow
def test_lag_zero_equals_sync(dense, tmp_path):
    runs = {"sync": [], "off": [*OFF, "rl.rollout_lag=0"]}
    params = {}
    for name, extra in runs.items():
        train_module.train(_cfg(tmp_path / name, "rl.steps=3", *extra))
        assert [r["rollout/lag"] for r in _rows(tmp_path / name)] == [0.0, 0.0, 0.0]
        params[name] = _final(tmp_path / name, "rl.steps=3", *extra)
    assert _max_diff(params["sync"], params["off"]) <= 1e-6
    start = jax.tree.map(np.asarray, Workspace(_cfg(tmp_path / "fresh", "rl.steps=3")).trainable)
    assert _max_diff(params["sync"], start) > 1e-4  # the steps moved the weights


def verl_vanilla_loss(logp, old_logp, advantages, mask, clip_low, clip_high):
    """verl's compute_policy_loss_vanilla (core_algos.py) with loss_agg_mode "token-mean", written out in float64:
    log-ratio clamped to +-20, PPO clip, dual clip (clip_ratio_c = 3) on negative advantages, mean over the batch's
    response tokens."""
    logp, old, adv, mask = (torch.as_tensor(np.asarray(x, np.float64)) for x in (logp, old_logp, advantages, mask))
    adv = adv[:, None].expand_as(logp)
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    clipped = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high))
    dual = torch.minimum(-adv * 3.0, clipped)
    per_token = torch.where(adv < 0, dual, clipped)
    return float((per_token * mask).sum() / mask.sum())


@pytest.mark.slow
def test_lag_one_trains_on_the_previous_weights_rollouts_and_resumes(dense, tmp_path, monkeypatch, capsys):
    steps = ["rl.steps=3", "rl.checkpoint_every=2"]
    calls = []
    update = st.rl_update

    def recording(graphdef, trainable, frozen, opt_state, data, cfg, temperature, tx, rng):
        model = nnx.merge(graphdef, trainable, frozen)
        calls.append({"params": jax.tree.map(np.asarray, trainable), "data": jax.tree.map(np.asarray, data),
                      "logp": np.asarray(st.target_logprobs(model, data.seq, temperature)[0]),
                      "merge": lambda p: nnx.merge(graphdef, jax.tree.map(jnp.asarray, p), frozen),
                      "cfg": cfg, "temperature": temperature})
        out = update(graphdef, trainable, frozen, opt_state, data, cfg, temperature, tx, rng)
        calls[-1]["loss"] = float(out[2])
        return out

    monkeypatch.setattr(st, "rl_update", recording)
    run = tmp_path / "whole"
    train_module.train(_cfg(run, *steps, *OFF))
    assert [r["rollout/lag"] for r in _rows(run)] == [0.0, 1.0, 1.0]

    # step 1's rollouts were sampled by theta_0: their log-probs are theta_0's, not theta_1's
    first, second = calls[0], calls[1]
    data = second["data"]
    mask = np.asarray(data.seq.target_mask) > 0
    seq = jax.tree.map(jnp.asarray, data.seq)
    theta0 = np.asarray(st.target_logprobs(first["merge"](first["params"]), seq, second["temperature"])[0])
    assert np.max(np.abs(data.old_logp - theta0)[mask]) <= 2e-5
    assert np.max(np.abs(data.old_logp - second["logp"])[mask]) > 1e-3  # the update between them is seen

    cfg = second["cfg"]
    assert cfg.kind == "grpo" and cfg.aggregation == "token_mean" and cfg.kl_coef == 0 and cfg.entropy_coef == 0
    want = verl_vanilla_loss(second["logp"], data.old_logp, data.advantages, mask, cfg.clip_low, cfg.clip_high)
    with jax.enable_x64(True):
        ours, _ = losses.policy_loss(*(jnp.asarray(np.asarray(x, np.float64)) for x in
                                       (second["logp"], data.old_logp, data.advantages, mask)),
                                     losses.LossConfig(**{**cfg.__dict__, "dual_clip": 3.0}))
    assert abs(float(ours) - want) <= 1e-9 * max(1.0, abs(want))
    # the step's own loss (no dual clip configured: verl's applies only where the ratio exceeds 3, checked here)
    ratio = np.exp(second["logp"] - data.old_logp)[mask]
    assert ratio.max() < 3.0
    assert abs(second["loss"] - want) <= 2e-5
    monkeypatch.setattr(st, "rl_update", update)

    # interrupted in the last step, after the checkpoint of step 2 that holds step 3's rollouts (sampled from theta_1)
    def stopping(self, rolled, *args, **kwargs):
        if rolled.step == 2 and not stopping.done:
            stopping.done = True
            raise Interrupted(2)
        return learn(self, rolled, *args, **kwargs)

    learn, stopping.done = Learner.learn, False
    monkeypatch.setattr(Learner, "learn", stopping)
    cut = tmp_path / "cut"
    with pytest.raises(Interrupted):
        train_module.train(_cfg(cut, *steps, *OFF))
    assert Checkpointer(cut / "rl").latest_step() == 2
    meta = Checkpointer(cut / "rl").read_meta(2)
    assert meta["pending"]["step"] == 2 and (cut / "rl" / "pending" / meta["pending"]["file"]).is_file()
    lost = tmp_path / "lost"
    import shutil

    shutil.copytree(cut, lost)
    train_module.train(_cfg(cut, *steps, *OFF))
    assert [r["step"] for r in _rows(cut)] == [1, 2, 3] and _rows(cut)[-1]["rollout/lag"] == 1.0
    assert _max_diff(_final(cut, *steps, *OFF), _final(run, *steps, *OFF)) <= 1e-6

    (lost / "rl" / "pending" / meta["pending"]["file"]).unlink()
    capsys.readouterr()
    train_module.train(_cfg(lost, *steps, *OFF))
    err = capsys.readouterr().err
    assert "does not read" in err and "step 3's rollouts are sampled again from the restored weights" in err, err
    assert _rows(lost)[-1]["step"] == 3 and _rows(lost)[-1]["rollout/lag"] == 0.0  # one numbering (issue 44 #12)


def _rolled(step):
    from spatial_jax.rollout.completions import Completions

    z = np.zeros((2, 3), np.int32)
    comps = Completions(z, z, np.zeros((0, 4), np.float32), np.zeros((0, 3), np.int32), z, z.astype(np.float32),
                        z.astype(np.float32), z, ("a", "b"), ((), ()), np.zeros(2, np.int32))
    return Rolled(step, step - 1, comps, [{"reward": 1.0}] * 2, None, {}, 0.1, 6.0)


def test_rollouts_ahead_save_load_and_prune(tmp_path):
    ahead = RolloutsAhead(tmp_path / "pending")
    assert ahead.take(0) is None and ahead.save(1) == {}
    ahead.start(lambda: _rolled(3), {"pos": 7})
    with pytest.raises(RuntimeError, match="already ahead"):
        ahead.start(lambda: _rolled(4), {})
    record = ahead.save(3)["pending"]
    assert record["step"] == 3 and record["data_before"] == {"pos": 7}
    assert ahead.take(3).step == 3 and ahead.take(3) is None

    other = RolloutsAhead(tmp_path / "pending")
    assert other.load(record) is None and other.take(3).scores == [{"reward": 1.0}] * 2
    path = tmp_path / "pending" / record["file"]
    path.write_bytes(pickle.dumps(_rolled(3)) + b"x")
    assert "has changed since it was written" in other.load(record)
    path.unlink()
    assert "does not read" in other.load(record) and other.take(3) is None

    for step in (2, 4, 6):
        (tmp_path / "pending" / f"{step}.pkl").write_bytes(b"")
    ahead.prune([4, 6])
    assert sorted(p.name for p in (tmp_path / "pending").iterdir()) == ["4.pkl", "6.pkl"]
    ahead.close()
    other.close()


def test_rollouts_ahead_raise_the_threads_error_and_check_the_step(tmp_path):
    ahead = RolloutsAhead(tmp_path)

    def broken():
        raise ValueError("row 3 of train.jsonl is broken")

    ahead.start(broken, {})
    with pytest.raises(ValueError, match="row 3"):
        ahead.take(1)
    ahead.start(lambda: _rolled(5), {})
    with pytest.raises(RuntimeError, match="step 5's, not step 4's"):
        ahead.take(4)
    assert ahead.take(5).step == 5
    ahead.start(broken, {})
    ahead.drain()  # a stage leaving on an error drops what is in flight, and its error
    assert ahead.take(6) is None
    ahead.close()


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["rl.rollout_lag=2"], "rl.rollout_lag.*be 0 or 1"),
        (["rl.rollout_lag=0"], "rl.rollout_lag.*keep its default with rollout_mode='sync'"),
        (["rl.rollout_mode=async"], "rl.rollout_mode"),
        (["decode.devices=-1"], "decode.devices"),
    ],
)
def test_bad_rollout_settings_are_clear_errors(overrides, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        _cfg(tmp_path, "method=spatialcore", *overrides)


def test_the_rollout_mesh_must_fit_and_one_step_off_runs_on_one_process(tmp_path):
    from spatial_jax.rl.config import validate

    cfg = _cfg(tmp_path, "method=spatialcore", "mesh.data=4", "decode.devices=5", "rl.rollout_mode=one_step_off")
    with pytest.raises(ConfigError, match="decode.devices=5: the rollout mesh takes the devices after the training "
                                          "mesh's 4, but only 8"):
        validate(cfg, 8)
    with pytest.raises(ConfigError, match="one_step_off runs on one process, not 2"):
        train_module.check_rollout_mode(cfg, 2)
    train_module.check_rollout_mode(cfg, 1)


def test_rollouts_ahead_edges(tmp_path):
    """The thread, the wait it measures, the folder save makes (nested, and again), and each reason load refuses."""
    ahead = RolloutsAhead(tmp_path / "run" / "rl" / "pending")
    with pytest.raises(RuntimeError, match="^a batch of rollouts is already ahead of the update$"):
        ahead.start(lambda: _rolled(1), {})
        ahead.start(lambda: _rolled(1), {})
    ahead.take(1)
    threads = []

    def slow(step):
        threads.append(threading.current_thread().name)
        time.sleep(0.2)
        return _rolled(step)

    ahead.start(lambda: slow(3), {})
    assert ahead.take(3).step == 3 and 0.1 < ahead.waited < 30
    assert threads[0].startswith("rollouts_") and threads[0] != threading.main_thread().name
    records = []
    for step in (5, 6):  # the second save finds the folder there
        ahead.start(lambda s=step: _rolled(s), {})
        records.append(ahead.save(step)["pending"])
        ahead.take(step)
    assert sorted(p.name for p in ahead.directory.iterdir()) == ["5.pkl", "6.pkl"]
    ahead.prune([])  # nothing kept is nothing to compare with: every file stays
    assert len(list(ahead.directory.iterdir())) == 2

    path = ahead.directory / records[0]["file"]
    old, new = records[0]["sha256"], hashlib.sha256(b"x").hexdigest()
    path.write_bytes(b"x")
    assert ahead.load(records[0]).endswith(f"has changed since it was written (SHA-256 {old[:12]} -> {new[:12]})")
    for held in ({"step": 5}, _rolled(4)):  # not rollouts, or another step's
        data = pickle.dumps(held)
        path.write_bytes(data)
        why = ahead.load({**records[0], "sha256": hashlib.sha256(data).hexdigest()})
        assert why == f"{path} does not hold step 5's rollouts" and ahead.take(5) is None
    path.unlink()
    assert ahead.load(records[0]) == f"{path} does not read (No such file or directory)"
    ahead.close()
