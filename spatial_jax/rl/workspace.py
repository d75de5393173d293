"""A run directory's policy on its mesh: what evaluation and training share, without the trainer.

`Workspace(cfg)` builds the mesh and the policy and splits it into (graphdef, trainable, frozen) states;
`load_latest()` takes the trainable weights of the run's newest checkpoint. The trainer (rl/train.py) builds on it;
`spatial-jax eval` uses it alone.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spatial_jax.config import from_dict, to_dict
from spatial_jax.distributed import is_primary
from spatial_jax.rl.checkpoint import Checkpointer
from spatial_jax.rl.config import TrainConfig, validate
from spatial_jax.rl.optim import make_optimizer
from spatial_jax.rl.policy import Policy, build_mesh, build_policy

STAGES = ("sft", "rl")


class Workspace:
    """The policy of one run directory, placed on the run's mesh, with checkpoint restore."""

    def __init__(self, cfg: TrainConfig, record_config: bool = False):
        validate(cfg, jax.device_count())
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.primary = is_primary()  # in a multi-host run only the first process writes files and prints
        if record_config and self.primary:  # the training command's config; `eval` leaves it as it was
            (self.run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2))
        self.mesh = build_mesh(cfg.mesh)
        self.policy: Policy = build_policy(cfg.policy, self.mesh)
        self.graphdef, self.trainable, self.frozen = nnx.split(self.policy.model, self.policy.trainable, ...)
        self.method = cfg.plugin
        self.reward_cfg = cfg.reward_config()
        self.tok = self.policy.tokenizer
        self.reference = None  # KL reference weights when there are no adapters to switch off (set by the RL stage)

    @property
    def model(self):
        return nnx.merge(self.graphdef, self.trainable, self.frozen)

    def log(self, text: str) -> None:
        if self.cfg.progress and self.primary:
            print(text, flush=True)

    def state(self, opt_state) -> dict[str, Any]:
        """What a checkpoint holds: trainable weights, optimiser state and, when it is a copy, the KL reference."""
        state = {"params": self.trainable, "opt": opt_state}
        if self.reference is not None:
            state["ref"] = self.reference
        return state

    def start_reference(self, stage: str, cfg: TrainConfig | None = None) -> None:
        """Full fine-tuning with a KL term: pi_ref is the policy the RL stage starts from, kept as a copy (and
        checkpointed, so a resumed run keeps the same reference)."""
        cfg = cfg or self.cfg
        lora = cfg.policy.lora
        if stage == "rl" and cfg.rl.loss.kl_coef > 0 and lora.rank == 0 and lora.vision_rank == 0:
            self.reference = jax.tree.map(jnp.copy, self.trainable)

    def restore(self, ck: Checkpointer, opt_state, iterator) -> tuple[int, Any, bool]:
        """Restores the newest checkpoint of `ck` (weights, optimiser state, reference, data position when an
        iterator is given); returns (step, opt_state, whether anything was restored)."""
        step = ck.latest_step()
        if step is None:
            return 0, opt_state, False
        state, meta = ck.restore(self.state(opt_state), step)
        self.trainable = state["params"]
        self.reference = state.get("ref", self.reference)
        if iterator is not None:
            iterator.set_state(meta["data"])
        self.log(f"resumed {ck.directory} at step {meta['step']}")
        return int(meta["step"]), state["opt"], True

    def optim_config(self, stage: str, cfg: TrainConfig | None = None):
        """The stage's optimiser settings: schedules span the stage, accumulation spans the RL micro-batches."""
        cfg = cfg or self.cfg
        if stage == "sft":
            return dataclasses.replace(cfg.sft.optim, total_steps=cfg.sft.steps)
        rc = cfg.rl
        n_micro = (rc.prompts_per_step * rc.group_size) // (rc.micro_batch or rc.prompts_per_step * rc.group_size)
        return dataclasses.replace(rc.optim, total_steps=rc.steps * rc.updates_per_batch, grad_accum_steps=n_micro)

    def load_latest(self) -> str | None:
        """Takes the trainable weights of the newest checkpoint (RL over SFT); returns its stage or None.

        The checkpoint's optimiser state and KL reference are laid out by the settings of the run that saved it
        (kept in its meta), so they are rebuilt from those: `eval` may override micro-batching, the KL term and
        the like."""
        for stage in reversed(STAGES):
            ck = Checkpointer(self.run_dir / stage, async_save=False)
            if ck.latest_step() is not None:
                saved = ck.read_meta().get("config")
                trained = from_dict(TrainConfig, saved) if saved is not None else self.cfg
                self.start_reference(stage, trained)
                self.restore(ck, make_optimizer(self.optim_config(stage, trained)).init(self.trainable), None)
                ck.close()
                return stage
            ck.close()
        return None
