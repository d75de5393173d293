"""rl.old_logp = "trainer" and the rollout correction in the training job: the trainer's pi_old gives a first-call
ratio of exactly 1, a bit-identical sampler has no gap and no correction, MIS drops tokens from the loss, and with
one_step_off's rollouts the gap splits into numerics and staleness. (A whole run's metrics: tests/test_rl_train.py,
tests/test_bench_rollout_gap.py.)"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_rl_train import _rollouts, tiny

from spatial_jax.rl import step as st
from spatial_jax.rl.optim import make_optimizer

ADV = np.array([1.0, -1.0, 0.5, -0.5], np.float32)


def _update(job, comps):
    optim = job.optim_config("rl")
    tx = make_optimizer(optim)
    with jax.set_mesh(job.mesh):
        return job.learner.update(0, comps, ADV, tx, optim.grad_accum_steps, tx.init(job.trainable), 1.0)[1]


def test_trainer_old_logp_ratio_is_one_and_bit_identical_sampler_has_no_gap(tmp_path):
    """One job, one batch of rollouts, two updates from the same weights: with a sampler 0.05 nats off the trainer
    per token (noise), then with a sampler bit-identical to the trainer's pi_old forward."""
    from spatial_jax.rl.train import Trainer

    job = Trainer(tiny(tmp_path, "rl.old_logp=trainer", "rl.correction.tis=token", "rl.correction.mis=token",
                       "rl.micro_batch=2", "rl.optim.warmup_ratio=0.0"))
    comps = _rollouts(job, 2)
    start = jax.tree.map(jnp.copy, job.trainable)  # the update donates the weights it is given: copies go in
    items, patches = comps.item_starts()
    seqs = [st.make_seq_batch(job.policy.model.cfg, comps.prompt_ids[r], comps.prompt_mask[r], comps.tokens[r],
                              comps.mask[r], comps.pixel_values[patches[items[r.start]]:patches[items[r.stop]]],
                              comps.image_grid_thw[items[r.start]:items[r.stop]],
                              row_group=np.arange(r.start, r.stop) // 2, row_image_counts=comps.image_counts[r])
            for r in (slice(0, 2), slice(2, 4))]  # as the update builds them
    with jax.set_mesh(job.mesh):
        own = np.concatenate([np.asarray(x) for x in job.learner.logprobs(job.trainable, seqs, 1.0)])
    noise = np.random.default_rng(0).normal(0.0, 0.05, own.shape).astype(np.float32)
    # MIS keeps [1/u, u] with u at the median |noise|: about half the tokens leave it
    rc = job.cfg.rl
    upper = float(np.exp(np.median(np.abs(noise[comps.mask > 0]))))
    job.cfg = dataclasses.replace(job.cfg, rl=dataclasses.replace(
        rc, correction=dataclasses.replace(rc.correction, mis_upper=upper)))

    out = _update(job, dataclasses.replace(comps, logprobs=own + noise))
    moved = jax.tree.map(jnp.copy, job.trainable)
    # pi_old is the trainer's: the first call's ratio is 1 exactly, whatever the sampler's gap
    assert out["loss/ratio_mean"] == 1.0 and out["loss/ratio_max"] == 1.0 and out["loss/approx_kl_old"] == 0.0
    assert 0.02 < out["gap/abs_mean"] < 0.06 and out["gap/abs_mean"] < out["gap/abs_max"]
    assert out["time/old_logp_s"] > 0 and out["correction/tis_truncated_frac"] == 0.0
    dropped = out["correction/mis_masked_frac"]
    assert 0.3 < dropped < 0.7
    assert out["loss/num_tokens"] * 2 == pytest.approx(comps.mask.sum() * (1 - dropped), abs=0.5)

    job.trainable = jax.tree.map(jnp.copy, start)
    out = _update(job, dataclasses.replace(comps, logprobs=own))
    # the correction sees no gap at all; gap/* (against the first pass's forward, inside the gradient's program)
    # keeps XLA's rounding difference between that program and the forward-only one: measured 9.5e-7 at most
    assert out["loss/ratio_max"] == 1.0 and out["correction/tis_weight_mean"] == 1.0
    assert out["gap/abs_max"] < 1e-5
    assert out["correction/mis_masked_frac"] == 0.0 and out["loss/num_tokens"] * 2 == comps.mask.sum()

    # one_step_off: rollouts of the weights before an update (`start`, the sampler bit-identical to their trainer),
    # trained after it (`moved`): the gap is all staleness, none of it numerics
    job.trainable = moved
    optim = job.optim_config("rl")
    tx = make_optimizer(optim)
    with jax.set_mesh(job.mesh):
        out = job.learner.update(1, dataclasses.replace(comps, logprobs=own), ADV, tx, optim.grad_accum_steps,
                                 tx.init(job.trainable), 1.0, behaviour=jax.tree.map(jnp.copy, start))[1]
    assert out["gap/numeric/abs_max"] == 0.0 and out["gap/numeric/kl"] == 0.0
    assert out["gap/staleness/abs_mean"] > 1e-4 and out["gap/staleness/abs_max"] == pytest.approx(out["gap/abs_max"])
    assert out["loss/ratio_max"] == 1.0
