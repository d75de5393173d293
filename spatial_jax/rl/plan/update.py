"""Planning the updates: the RL update (one micro-batch), the KL reference and trainer pi_old forwards, and the SFT
step, each compiled at the recipe's shapes with the optimiser's state as the trainer holds it."""

from __future__ import annotations

import dataclasses

import numpy as np

from spatial_jax.models import ModelConfig
from spatial_jax.rl import step as st
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.optim import make_optimizer
from spatial_jax.rl.plan.measure import Program, _measure
from spatial_jax.rl.plan.shapes import Abstract, Shapes, _batch_placed, _local_bytes, _opt_state, _rows, _seq_batch


def _rl_data(seq, rows: int, completion: int, cfg: TrainConfig) -> st.RLData:
    """The update's data as the trainer passes it (TIS weights and the first pass's own pi_old as configured)."""
    zeros = np.zeros((rows, completion), np.float32)
    rc = cfg.rl
    return st.RLData(seq=seq, old_logp=zeros, ref_logp=zeros, advantages=np.zeros((rows,), np.float32),
                     normalizer=np.float32(1.0), is_weights=zeros if rc.correction.tis != "off" else None,
                     own_old=np.float32(1.0) if rc.old_logp == "trainer" else None)


def _sft_seq(mc, rows, length, grid):
    """The SFT row as the trainer builds it (train.full_seq_batch): the whole row is the target block."""
    ids, mask, pixels, grids = _rows(mc, rows, length, grid)
    return st.make_seq_batch(mc, ids[:, :1], mask[:, :1], ids[:, 1:], mask[:, 1:], pixels, grids)


def rl_programs(cfg: TrainConfig, mc: ModelConfig, policy: Abstract, mesh, shapes: Shapes, grid, run: set[str],
                rl_tx, rl_opt, reference: int, key) -> list[Program]:
    """Those of the RL update (one micro-batch), the KL reference forward and the trainer's pi_old forward that are
    in `run`, at the shapes the trainer runs them."""
    rc, out = cfg.rl, []
    temperature = rc.sampling.temperature or 1.0
    R = shapes.micro_batch
    # as the trainer runs it: each prompt once for its G rollouts when the micro-batch holds whole groups
    group = rc.group_size if rc.shared_prefix and R % rc.group_size == 0 else 1
    seq = None
    if run & {"rl_update", "reference_forward", "old_logp_forward"}:
        seq = _seq_batch(mc, R, shapes.prompt, shapes.completion, grid, group)
    what = f"{R} rollouts x ({shapes.prompt} + {shapes.completion}) tokens"
    if group > 1:
        what = f"{R // group} prompts x {shapes.prompt} + {R} completions x {shapes.completion} tokens (shared prefix)"
    if "rl_update" in run:
        data = _rl_data(seq, R, shapes.completion, cfg)
        args = (policy.graphdef, policy.trainable, policy.frozen, rl_opt, _batch_placed(data, mesh, R), rc.loss,
                temperature, rl_tx, key)
        out.append(_measure(mesh, "rl_update", what, st.rl_update, args, reference))
    if "reference_forward" in run:
        args = (policy.graphdef, policy.trainable, policy.frozen, _batch_placed(seq, mesh, R), temperature)
        out.append(_measure(mesh, "reference_forward", what, st.reference_logprobs, args, _local_bytes(rl_opt, mesh)))
    if "old_logp_forward" in run:  # rl.old_logp = "trainer": pi_old at the step's starting weights
        args = (policy.graphdef, policy.trainable, policy.frozen, _batch_placed(seq, mesh, R), temperature)
        out.append(_measure(mesh, "old_logp_forward", what, st.policy_logprobs, args,
                            _local_bytes(rl_opt, mesh) + reference))
    return out


def sft_program(cfg: TrainConfig, mc: ModelConfig, policy: Abstract, mesh, shapes: Shapes, grid, key) -> Program:
    """The SFT step at `sft.batch_size` rows of the longest prompt bucket."""
    S = cfg.sft.batch_size
    sft_seq = _sft_seq(mc, S, shapes.prompt, grid)
    tx = make_optimizer(dataclasses.replace(cfg.sft.optim, total_steps=max(cfg.sft.steps, 1)))
    args = (policy.graphdef, policy.trainable, policy.frozen, _opt_state(tx, policy.trainable, mesh), tx,
            _batch_placed(sft_seq, mesh, S), key)
    return _measure(mesh, "sft_update", f"{S} rows x {shapes.prompt} tokens", st.sft_update, args)
