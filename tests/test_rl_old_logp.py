"""rl.old_logp = "trainer" and the rollout correction in the training job: the trainer's pi_old gives a first-call
ratio of exactly 1, a bit-identical sampler has no gap and no correction, MIS drops tokens from the loss, and a run
logs the gap (JSONL and TensorBoard), the correction and the time split, with one_step_off's split of the gap into
numerics and staleness."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spatial_jax.methods
from spatial_jax.rl import step as st
from spatial_jax.rl.optim import make_optimizer
from spatial_jax.testing import dense_methods
from tests.test_rl_metrics import tb_scalars
from tests.test_rl_train import _rollouts, tiny

ADV = np.array([1.0, -1.0, 0.5, -0.5], np.float32)


def _update(job, comps):
    optim = job.optim_config("rl")
    tx = make_optimizer(optim)
    with jax.set_mesh(job.mesh):
        return job.update(0, comps, ADV, tx, optim.grad_accum_steps, tx.init(job.trainable), 1.0)[1]


def test_trainer_old_logp_ratio_is_one_and_bit_identical_sampler_has_no_gap(tmp_path):
    """One job, one batch of rollouts, two updates from the same weights: with a sampler 0.05 nats off the trainer
    per token (noise), then with a sampler bit-identical to the trainer's pi_old forward."""
    from spatial_jax.rl.train import Trainer

    job = Trainer(tiny(tmp_path, "rl.old_logp=trainer", "rl.correction.tis=token", "rl.correction.mis=token",
                       "rl.micro_batch=2"))
    comps = _rollouts(job, 2)
    start = jax.tree.map(jnp.copy, job.trainable)
    items, patches = comps.item_starts()
    seqs = [st.make_seq_batch(job.policy.model.cfg, comps.prompt_ids[r], comps.prompt_mask[r], comps.tokens[r],
                              comps.mask[r], comps.pixel_values[patches[items[r.start]]:patches[items[r.stop]]],
                              comps.image_grid_thw[items[r.start]:items[r.stop]],
                              row_group=np.arange(r.start, r.stop) // 2, row_image_counts=comps.image_counts[r])
            for r in (slice(0, 2), slice(2, 4))]  # as the update builds them
    with jax.set_mesh(job.mesh):
        own = np.concatenate([np.asarray(x) for x in job.trainer_logprobs(job.trainable, seqs, 1.0)])
    noise = np.random.default_rng(0).normal(0.0, 0.05, own.shape).astype(np.float32)
    # MIS keeps [1/u, u] with u at the median |noise|: about half the tokens leave it
    rc = job.cfg.rl
    upper = float(np.exp(np.median(np.abs(noise[comps.mask > 0]))))
    job.cfg = dataclasses.replace(job.cfg, rl=dataclasses.replace(
        rc, correction=dataclasses.replace(rc.correction, mis_upper=upper)))

    out = _update(job, dataclasses.replace(comps, logprobs=own + noise))
    # pi_old is the trainer's: the first call's ratio is 1 exactly, whatever the sampler's gap
    assert out["loss/ratio_mean"] == 1.0 and out["loss/ratio_max"] == 1.0 and out["loss/approx_kl_old"] == 0.0
    assert 0.02 < out["gap/abs_mean"] < 0.06 and out["gap/abs_mean"] < out["gap/abs_max"]
    assert out["time/old_logp_s"] > 0 and out["correction/tis_truncated_frac"] == 0.0
    dropped = out["correction/mis_masked_frac"]
    assert 0.3 < dropped < 0.7
    assert out["loss/num_tokens"] * 2 == pytest.approx(comps.mask.sum() * (1 - dropped), abs=0.5)

    job.trainable = start
    out = _update(job, dataclasses.replace(comps, logprobs=own))
    # the correction sees no gap at all; gap/* (against the first pass's forward, inside the gradient's program)
    # keeps XLA's rounding difference between that program and the forward-only one: measured 9.5e-7 at most
    assert out["loss/ratio_max"] == 1.0 and out["correction/tis_weight_mean"] == 1.0
    assert out["gap/abs_max"] < 1e-5
    assert out["correction/mis_masked_frac"] == 0.0 and out["loss/num_tokens"] * 2 == comps.mask.sum()


@pytest.fixture
def dense():
    with dense_methods.registered(spatial_jax.methods):
        yield


def test_run_logs_gap_correction_and_one_step_off_split(dense, tmp_path):
    from spatial_jax.rl.train import train

    train(tiny(tmp_path, "method=dense_spatialcore", "rl.steps=2", "rl.rollout_mode=one_step_off",
               "rl.old_logp=trainer", "rl.correction.tis=token", "tensorboard=true", "rl.optim.warmup_ratio=0.0"))
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        for key in ("gap/abs_mean", "gap/abs_max", "gap/kl", "gap/kl_k1", "gap/seq_log_ratio_std",
                    "gap/seq_log_ratio_abs_max", "correction/tis_weight_mean", "time/old_logp_s", "time/update_s",
                    "time/rollout_s"):
            assert key in row, key
        assert row["loss/ratio_max"] == 1.0
    # step 2 trains on rollouts of the weights step 1 started from: the gap splits into numerics and staleness
    assert rows[0]["rollout/lag"] == 0 and "gap/numeric/abs_max" not in rows[0]
    late = rows[1]
    assert late["rollout/lag"] == 1 and late["gap/staleness/abs_max"] > 10 * late["gap/numeric/abs_max"] > 0
    assert late["gap/abs_max"] > late["gap/numeric/abs_max"]
    assert [s for s, _ in tb_scalars(tmp_path / "rl" / "tb", "gap/abs_mean")] == [1, 2]
