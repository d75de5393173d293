"""The training job: bad configs fail before compiling, recipes load, every method runs a few tiny steps that move
the weights, one GRPO update on a 2x2x2 mesh equals the single-device update, the loss takes log-probs at the
rollout temperature. (A run killed anywhere resumes to the same parameters: tests/test_train_kill_anywhere.py.)

Tests of whole RL steps use the methods' `dense_` test variants (spatial_jax/testing/dense_methods.py): a random
policy earns the same reward on every rollout of the real methods, so their advantages, gradients and updates are
0 and a test of the steps would compare no-ops."""

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

import spatial_jax.methods
from spatial_jax import config as C
from spatial_jax.cli import main
from spatial_jax.rl.checkpoint import Checkpointer
from spatial_jax.rl.config import TrainConfig, validate
from spatial_jax.rl.optim import make_optimizer
from spatial_jax.rl.workspace import Workspace
from spatial_jax.testing import dense_methods

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ["tiny_cpu", "tiny_random", "spatialcore_8b", "spatialcore_4b", "prosr_8b", "spatialthinker_3b",
           "spatialthinker_7b", "spatialthinker_30b", "allospatial_4b"]

# A job small enough for a test: no SFT, a few prompts, short completions, no evaluation.
TINY = [
    "sft.steps=0", "rl.steps=1", "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=12",
    "eval.after_rl=false", "data.train=synthetic:train:16", "data.eval=synthetic:heldout:4", "tensorboard=false",
    "progress=false", "data.bucket_lengths=[256,512]",
]


def tiny(tmp_path, *extra) -> TrainConfig:
    return C.load(TrainConfig, None, [f"run_dir={tmp_path}", *TINY, *extra])


@pytest.fixture
def dense():
    with dense_methods.registered(spatial_jax.methods):
        yield


def _max_diff(a, b) -> float:
    return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(np.max(np.abs(x - y))), a, b)))


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_configs_load_and_validate(name):
    cfg = C.load(TrainConfig, ROOT / "configs" / f"{name}.toml")
    validate(cfg, num_devices=cfg.mesh.size)
    assert cfg.run_dir.endswith(name)


def test_job_commands_default_to_the_main_job(monkeypatch, tmp_path):
    from spatial_jax.cli.job_config import ENV, MAIN_JOB, load_job

    assert MAIN_JOB == ROOT / "configs" / "tiny_cpu.toml"
    monkeypatch.delenv(ENV, raising=False)
    assert load_job(None, ["seed=3"]) == C.load(TrainConfig, MAIN_JOB, ["seed=3"])
    other = tmp_path / "other.toml"
    other.write_text("seed = 5\n")
    monkeypatch.setenv(ENV, str(other))
    assert load_job(None, []).seed == 5
    monkeypatch.setenv(ENV, "")
    assert load_job(None, []) == C.load(TrainConfig) == C.load(TrainConfig, ROOT / "configs" / "tiny_random.toml")
    assert load_job(str(other), ["seed=7"]).seed == 7


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["rl.nope=1"], "unknown config key"),
        (["rl.steps=many"], "expected an integer"),
        (["rl.loss.kind=ppo"], "kind"),
        (["method=magic"], "method"),
        (["rl.checkpoint_every=0"], "checkpoint_every must be >= 1"),
        (["rl.updates_per_batch=0"], "updates_per_batch must be >= 1"),
        (["rl.sampling.temperature=0"], "temperature must be > 0"),
        (["eval.max_samples=-1"], "max_samples must be >= 0"),
        (["rl.optim.grad_accum_steps=4"], "set from rl.micro_batch"),
    ],
)
def test_bad_config_is_a_clear_error(overrides, match):
    with pytest.raises(C.ConfigError, match=match):
        C.load(TrainConfig, None, overrides)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["mesh.data=16"], "only 8 device"),
        (["mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2", "rl.prompts_per_step=3", "rl.group_size=2"], "divisible"),
        (["rl.micro_batch=3"], "not divisible by rl.micro_batch"),
        (["rl.mini_batch=24"], "not divisible by rl.mini_batch"),
        (["rl.mini_batch=4"], "mini_batch=4 must be a multiple of rl.group_size=8"),
        # a micro-batch larger than its mini-batch, or one that does not divide it, contradicts it
        (["rl.mini_batch=8", "rl.micro_batch=16"], "micro_batch=16 must divide rl.mini_batch=8"),
        (["rl.prompts_per_step=6", "rl.mini_batch=24", "rl.micro_batch=16"], "must divide rl.mini_batch=24"),
        (["rl.group_size=1"], "group_size"),
        (["mesh.data=4", "eval.batch_size=6"], "eval.batch_size"),
        # Dr. GRPO: three decode rounds of 288 tokens can hold 864 loss tokens, more than the constant's 600
        (["method=allospatial", "rl.max_tool_turns=2", "rl.loss.aggregation=seq_mean_token_sum_norm",
          "rl.loss.max_completion_length=600"], "rl.max_tool_turns"),
    ],
)
def test_machine_checks_fail_before_compile(overrides, match, tmp_path):
    cfg = C.load(TrainConfig, None, [f"run_dir={tmp_path}", *overrides])
    with pytest.raises(C.ConfigError, match=match):
        validate(cfg, num_devices=8)


def test_cli_reports_config_errors(tmp_path, capsys):
    assert main(["train", f"run_dir={tmp_path}", "rl.nope=1"]) == 2
    assert "unknown config key" in capsys.readouterr().err


def _params(job):
    return jax.tree.map(np.asarray, job.trainable)


def _rollouts(job, prompts: int):
    """The job's rollouts of its first `prompts` training prompts, sampled as its RL stage samples them."""
    from spatial_jax.data.pipeline import train_iterator

    batch = next(train_iterator(job.cfg.data, job.tok, job.method.prompt, prompts, image_cfg=job.policy.image_cfg))
    sampling = dataclasses.replace(job.cfg.rl.sampling, stop_token_ids=(job.tok.im_end_id,),
                                   pad_token_id=job.tok.pad_id)
    with jax.set_mesh(job.mesh):
        return job.experience.collect(0, batch, sampling).completions


@pytest.mark.slow
def test_grpo_step_on_2x2x2_mesh_equals_single_device(tmp_path):
    from spatial_jax.rl.train import Trainer

    lr = "rl.optim.warmup_ratio=0.0"  # the first update must move the weights for the comparison to mean anything
    one = Trainer(tiny(tmp_path / "one", "rl.prompts_per_step=4", "rl.group_size=2", lr))
    sharded = Trainer(tiny(tmp_path / "mesh", "rl.prompts_per_step=4", "rl.group_size=2", lr, "mesh.data=2",
                           "mesh.fsdp=2", "mesh.tensor=2"))
    assert len(sharded.mesh.devices.flat) == 8
    comps = _rollouts(one, 4)
    adv = np.linspace(-1.0, 1.0, len(comps.texts)).astype(np.float32)  # fixed, non-trivial advantages
    results = []
    for job in (one, sharded):
        tx = make_optimizer(job.optim_config("rl"))
        with jax.set_mesh(job.mesh):
            _, metrics = job.learner.update(0, comps, adv, tx, 1, tx.init(job.trainable), 1.0)
        results.append((metrics["loss"], _params(job)))
    (loss1, p1), (loss8, p8) = results
    assert np.isfinite(loss1) and abs(loss1 - loss8) <= 1e-5
    diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), p1, p8))
    assert max(diffs) <= 1e-5
    fresh = _params(Workspace(tiny(tmp_path / "fresh")))
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), p1, fresh))
    assert max(moved) > 0  # the update changed the parameters


@pytest.mark.slow
def test_micro_batches_accumulate_to_the_full_batch_update(tmp_path):
    """Two accumulated micro-batches, each divided by the whole batch's token count, equal one full-batch step."""
    from spatial_jax.rl.train import Trainer

    lr = "rl.optim.warmup_ratio=0.0"
    full = Trainer(tiny(tmp_path / "full", "rl.prompts_per_step=2", "rl.group_size=2", lr))
    split = Trainer(tiny(tmp_path / "split", "rl.prompts_per_step=2", "rl.group_size=2", "rl.micro_batch=2", lr))
    comps = _rollouts(full, 2)
    adv = np.array([1.0, -1.0, 0.5, -0.5], np.float32)
    params = []
    for job in (full, split):
        optim = job.optim_config("rl")
        tx = make_optimizer(optim)
        job.learner.update(0, comps, adv, tx, optim.grad_accum_steps, tx.init(job.trainable), 1.0)
        params.append(_params(job))
    assert split.optim_config("rl").grad_accum_steps == 2
    # float32 summation order, amplified by Adam's normalisation where a gradient is tiny: observed up to 1.2e-6
    assert max(jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), *params))) <= 2e-6


@pytest.mark.slow
def test_updates_after_a_steps_first_are_off_policy(tmp_path):
    """rl.mini_batch makes one optimiser update per mini-batch, so the step's second call sees weights the first
    changed: its ratio to pi_old spreads (logged per call). Accumulating the same two micro-batches into one update
    (rl.micro_batch, optax.MultiSteps) changes no weight between the calls, and the second sees ratio 1."""
    from spatial_jax.rl.train import Trainer

    extra = ("rl.prompts_per_step=2", "rl.group_size=2", "rl.optim.warmup_ratio=0.0", "rl.optim.lr=1e-2")
    mini = Trainer(tiny(tmp_path / "mini", *extra, "rl.mini_batch=2"))
    accumulated = Trainer(tiny(tmp_path / "accumulated", *extra, "rl.micro_batch=2"))
    comps = _rollouts(mini, 2)
    adv = np.array([1.0, -1.0, 0.5, -0.5], np.float32)
    calls = {}
    for name, job in (("mini", mini), ("accumulated", accumulated)):
        optim = job.optim_config("rl")
        tx = make_optimizer(optim)
        with jax.set_mesh(job.mesh):
            _, calls[name] = job.learner.update(0, comps, adv, tx, optim.grad_accum_steps, tx.init(job.trainable), 1.0)
    assert mini.optim_config("rl").grad_accum_steps == 1 and mini.optim_config("rl").total_steps == 2
    for out in calls.values():
        # the first call is on-policy: the sampler's and the trainer's log-probs differ by float rounding alone
        assert out["call1/ratio_dev_max"] < 1e-4 and out["call1/ratio_std"] < 1e-5 and "call3/ratio_std" not in out
    assert calls["mini"]["call2/ratio_dev_max"] > 1e-2 and calls["mini"]["call2/ratio_std"] > 1e-3, calls["mini"]
    assert calls["accumulated"]["call2/ratio_dev_max"] < 1e-4, calls["accumulated"]


@pytest.mark.slow
def test_shared_prefix_update_equals_the_whole_row_update(tmp_path, monkeypatch):
    """rl.shared_prefix: the trainer builds groups of G rows (each prompt once) for the update and the KL reference,
    and one step from the same rollouts ends at the whole-row step's loss, KL and parameters."""
    from spatial_jax.rl import step as st
    from spatial_jax.rl.train import Trainer

    groups = []
    make = st.make_seq_batch
    monkeypatch.setattr(st, "make_seq_batch", lambda *a, **k: groups.append(k.get("group", 1)) or make(*a, **k))
    extra = ("rl.prompts_per_step=2", "rl.group_size=2", "rl.optim.warmup_ratio=0.0", "rl.loss.kl_coef=0.05")
    whole = Trainer(tiny(tmp_path / "whole", *extra))
    shared = Trainer(tiny(tmp_path / "shared", *extra, "rl.shared_prefix=true"))
    comps = _rollouts(whole, 2)
    adv = np.array([1.0, -1.0, 0.5, -0.5], np.float32)
    results = []
    for job in (whole, shared):
        tx = make_optimizer(job.optim_config("rl"))
        _, metrics = job.learner.update(0, comps, adv, tx, 1, tx.init(job.trainable), 1.0)
        results.append((metrics, _params(job)))
    assert groups == [1, 2]
    (m1, p1), (m2, p2) = results
    assert np.isfinite(m1["loss"]) and abs(m1["loss"] - m2["loss"]) <= 1e-6
    assert abs(m1["loss/kl_ref"] - m2["loss/kl_ref"]) <= 1e-7
    # Adam's normalisation amplifies float32 rounding where a gradient is tiny (as with micro-batches above)
    assert _max_diff(p1, p2) <= 2e-6
    assert _max_diff(p1, _params(Workspace(tiny(tmp_path / "fresh", *extra)))) > 1e-4  # the step moved them


def test_full_finetuning_kl_reference_is_the_rl_starting_policy(dense, tmp_path):
    from spatial_jax.rl.train import train

    settings = ["method=dense_spatialcore", "rl.steps=3", "rl.loss.kl_coef=0.05"]
    train(tiny(tmp_path / "run", *settings))
    rows = [json.loads(line) for line in (tmp_path / "run" / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["loss/kl_ref"] == pytest.approx(0.0, abs=1e-7)  # nothing has moved yet
    # the policy moved away from its frozen copy, by far more than Adam's rounding noise (~1e-8) on a no-op
    assert rows[2]["loss/kl_ref"] > 1e-5
    initial = _params(Workspace(tiny(tmp_path / "fresh", *settings)))
    job = Workspace(tiny(tmp_path / "run", *settings))
    assert job.load_latest() == "rl" and job.reference is not None  # checkpointed with the run
    assert _max_diff(jax.tree.map(np.asarray, job.reference), initial) == 0.0  # the policy RL started from
    assert _max_diff(_params(job), initial) > 1e-4


@pytest.mark.parametrize(
    "method, extra",
    [
        ("prosr", []),
        ("spatialthinker", []),
        # tool turns and dynamic sampling in one_step_off's sampling thread, on a rollout mesh of its own
        ("allospatial", ["rl.loss.kind=gspo", "rl.max_tool_turns=2", "rl.max_tool_tokens=64",
                         "rl.rollout_mode=one_step_off", "decode.devices=1", "rl.dynamic_sampling.enabled=true"]),
        ("spatialcore", ["rl.loss.kind=gspo_token", "rl.updates_per_batch=2", "rl.micro_batch=2",
                         "policy.lora.rank=4", "rl.loss.kl_coef=0.01", "policy.remat=true"]),
        # the recipes' layout: scanned layers with a named remat policy, through SFT, RL, checkpoints and eval
        ("spatialthinker", ["policy.scan_layers=true", "policy.remat_policy=dots_no_batch", "policy.lora.rank=4"]),
    ],
)
@pytest.mark.slow
def test_each_method_runs_tiny_steps(method, extra, dense, tmp_path):
    """Each method's machinery (prompt format, blank-image or tool rollouts, scorer, loss options) in whole RL steps
    that move the weights: `dense_<method>` adds a dense term to the method's reward (its own components are
    scored and logged as they are)."""
    from spatial_jax.rl.train import train

    method = dense_methods.PREFIX + method
    run = tmp_path / "run"
    train(tiny(run, f"method={method}", "rl.steps=2", *extra))
    rows = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    if "rl.rollout_mode=one_step_off" in extra:
        assert [r["rollout/lag"] for r in rows] == [0.0, 1.0] and all("dynamic/rounds" in r for r in rows)
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["reward_mean"]) for r in rows)
    # every step had something to learn: a constant reward leaves gradients of rounding noise (~1e-7), which Adam
    # would still turn into steps of size lr
    assert all(r["adv_abs_max"] > 0 and r["loss/grad_norm"] > 1e-3 for r in rows)
    # the figures every RL run logs per step (tests/test_rl_metrics.py checks their values)
    assert all(0 < r["groups_with_spread"] <= 1 and 0 <= r["well_formed"] <= 1 and r["entropy_mean"] > 0
               and r["call1/clip_frac"] >= 0 for r in rows)
    if method == "dense_prosr":
        assert all(r["reward/has_blank"] == 1.0 for r in rows)
    assert "reward/dense" in rows[0] and len([k for k in rows[0] if k.startswith("reward/")]) > 2  # and its own
    assert Checkpointer(run / "rl").latest_step() == 2
    lora = [x for x in extra if x.startswith(("policy.lora.", "policy.scan_layers"))]  # the weights' layout
    job = Workspace(tiny(run, f"method={method}", "rl.steps=2", *lora))
    initial = _params(Workspace(tiny(tmp_path / "fresh", f"method={method}", "rl.steps=2", *lora)))
    assert job.load_latest() == "rl" and _max_diff(_params(job), initial) > 1e-6  # the RL steps moved the weights
    if method != "dense_allospatial":  # `eval` scores the run's latest checkpoint
        out = tmp_path / "eval.json"
        # without the run's micro-batching and KL overrides: the checkpoint's optimiser state is rebuilt from the
        # run's recorded config, so evaluation settings cannot clash with it
        assert main(["eval", f"--output={out}", f"run_dir={run}", *TINY, f"method={method}", "rl.steps=2",
                     *lora, "eval.max_samples=2", "eval.batch_size=2", "eval.max_new_tokens=12"]) == 0
        report = json.loads(out.read_text())
        assert report["checkpoint"] == "rl" and report["summary"]["n"] == 2
        if method == "dense_prosr":  # evaluated with its blank-image counterfactual, as in training
            assert all(row["has_blank"] == 1.0 for row in report["rows"])
        assert "overall" in report["summary"]["accuracy_by_category"]


def test_overlong_filter_trains_only_rollouts_that_stopped(tmp_path):
    """rl.overlong_filter masks every rollout that never wrote <|im_end|> (a random policy's always run to
    max_new_tokens, so one rollout here is made to stop at its last token)."""
    from spatial_jax.rl.train import Trainer

    job = Trainer(tiny(tmp_path, "rl.overlong_filter=true", "rl.prompts_per_step=2", "rl.group_size=2"))
    comps = _rollouts(job, 2)
    assert not np.any((comps.tokens == job.tok.im_end_id) & (comps.mask > 0))
    tokens = comps.tokens.copy()
    tokens[1, int(comps.mask[1].sum()) - 1] = job.tok.im_end_id
    tx = make_optimizer(job.optim_config("rl"))
    _, out = job.learner.update(0, dataclasses.replace(comps, tokens=tokens),
                                np.array([1.0, -1.0, 0.5, -0.5], np.float32), tx, 1, tx.init(job.trainable), 1.0)
    assert out["loss/num_seqs"] == 1 and out["loss/num_tokens"] == comps.mask[1].sum()


def test_the_loss_takes_log_probs_at_the_rollout_temperature(dense, tmp_path):
    """SPEC §6: the policy's log-probs in the loss are at the rollout temperature. At T = 0.7 the sampler's old
    log-probs and the trainer's recomputed ones, for the same weights, must agree: the first update's importance
    ratio is 1 on every token. Log-probs at T = 1 put its mean ~2% off on the tiny policy."""
    from spatial_jax.rl.train import train

    train(tiny(tmp_path, "method=dense_spatialcore", "rl.sampling.temperature=0.7", "rl.steps=1"))
    row = json.loads((tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["loss/grad_norm"] > 1e-3
    assert abs(row["loss/ratio_mean"] - 1.0) < 1e-5 and row["loss/ratio_max"] < 1.0 + 1e-4, row
    assert row["loss/approx_kl_old"] < 1e-8, row
    # every run logs the sampler-trainer gap (rl/rollout_correction.gap_metrics): float32 rounding here
    assert 0 <= row["gap/abs_mean"] <= row["gap/abs_max"] < 1e-4 and abs(row["gap/kl"]) < 1e-8, row


def test_cluster_is_joined_only_when_the_environment_asks():
    from spatial_jax import distributed

    assert not distributed.cluster_requested({})
    assert not distributed.cluster_requested({"SLURM_NTASKS": "1", "TPU_WORKER_HOSTNAMES": "host0"})
    assert distributed.cluster_requested({"SLURM_NTASKS": "4"})
    assert distributed.cluster_requested({"TPU_WORKER_HOSTNAMES": "h0,h1"})
    assert distributed.cluster_requested({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})
    assert distributed.initialize({}) is False
    with pytest.raises(RuntimeError, match="JAX_NUM_PROCESSES"):
        distributed.initialize({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})


@pytest.mark.slow
def test_grpo_update_moves_sequences_the_advantages_way(tmp_path):
    """The whole loop (sampler, advantages, sequence batch, fused log-probs, loss, optimiser) moves each rollout's
    log-probability the way its advantage points: after one GRPO update, the change in a completion's summed
    log-prob correlates strongly with its advantage. A sign flip, an off-by-one between logits and targets or a loss
    mask on the wrong tokens would break it. Reward: the share of completion tokens from the lower half of the
    vocabulary (about half for the random policy, so advantages are dense)."""
    import dataclasses

    from spatial_jax.data.pipeline import train_iterator
    from spatial_jax.rewards.advantages import group_advantages
    from spatial_jax.rl import step as st
    from spatial_jax.rl.optim import make_optimizer
    from spatial_jax.rl.train import Trainer
    from spatial_jax.rollout import completions as ro

    job = Trainer(tiny(tmp_path, "rl.group_size=8", "rl.prompts_per_step=2", "rl.optim.lr=3e-3",
                   "rl.optim.warmup_ratio=0", "rl.optim.min_lr=3e-3", "rl.steps=2"))
    half = job.policy.model.cfg.text.vocab_size // 2
    tx = make_optimizer(job.optim_config("rl"))
    opt_state = tx.init(job.trainable)
    sampling = dataclasses.replace(job.cfg.rl.sampling, stop_token_ids=(job.tok.im_end_id,),
                                   pad_token_id=job.tok.pad_id)
    it = train_iterator(job.cfg.data, job.tok, job.method.prompt, 2, image_cfg=job.policy.image_cfg)

    def sequence_logp(comps):
        seq = st.make_seq_batch(job.policy.model.cfg, comps.prompt_ids, comps.prompt_mask, comps.tokens, comps.mask,
                                comps.pixel_values, comps.image_grid_thw, loss_mask=comps.mask)
        logp, _ = st.target_logprobs(job.model, seq, 1.0)
        return (np.asarray(logp) * np.asarray(seq.target_mask)).sum(1)

    with jax.set_mesh(job.mesh):
        for step in range(2):
            comps = ro.sample(job.model, next(it), job.tok, sampling, 8, seed=step)
            share = ((comps.tokens < half) * comps.mask).sum(1) / np.maximum(comps.mask.sum(1), 1)
            adv = np.asarray(group_advantages(jax.numpy.asarray(share.reshape(-1, 8), jax.numpy.float32)))
            adv = adv.reshape(-1)
            before = sequence_logp(comps)
            opt_state, _ = job.learner.update(step, comps, adv, tx, 1, opt_state, 1.0)
            moved = sequence_logp(comps) - before
            assert np.corrcoef(adv, moved)[0, 1] > 0.7 and float(adv @ moved) > 0, (adv, moved)


def test_advantages_are_normalised_within_each_group(tmp_path, monkeypatch):
    """GRPO's core: rl_step turns rollout r's reward into an advantage against its own group (prompt r // G), not
    the whole batch. Group 0's rewards sit far above group 1's; normalised over the batch, every rollout of group 0
    would get a positive advantage."""
    from spatial_jax.rewards.advantages import group_advantages
    from spatial_jax.rl.train import Trainer
    from spatial_jax.rollout.collect import Collected

    job = Trainer(tiny(tmp_path, "rl.prompts_per_step=2", "rl.group_size=4"), record_config=False)
    rewards = [10.0, 11.0, 12.0, 13.0, 0.0, 2.0, 1.0, 3.0]
    decoded = type("Decoded", (), {"mask": np.ones((8, 3), np.int32)})()  # only counted before the update
    collected = Collected(completions=decoded, rollouts=[], scores=[{"reward": r} for r in rewards], decoded=8)
    monkeypatch.setattr(job.experience, "collect", lambda *a, **k: collected)
    seen = {}

    class Updated(Exception):
        pass

    def update(step, comps, adv, *rest):
        seen["adv"] = adv
        raise Updated

    monkeypatch.setattr(job.learner, "update", update)
    batch = type("Batch", (), {"records": [None, None]})()
    with pytest.raises(Updated):
        job.rl_step(0, batch, job.cfg.rl.sampling, None, 1, None)
    expected = np.asarray(group_advantages(jax.numpy.asarray(np.reshape(rewards, (2, 4)), jax.numpy.float32)))
    np.testing.assert_allclose(seen["adv"], expected.reshape(-1), rtol=1e-6)
    assert (seen["adv"][:4] < 0).sum() == 2 and (seen["adv"][4:] < 0).sum() == 2
