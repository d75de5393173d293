"""A run directory's policy on its mesh: what evaluation and training share, without the trainer.

`Workspace(cfg)` builds the mesh and the policy and splits it into (graphdef, trainable, frozen) states;
`load_latest()` takes the trainable weights of the run's newest checkpoint. The trainer (rl/train.py) builds on it;
`spatial-jax eval` uses it alone, and writes nothing in the run directory.

A run directory holds one run: `check_resumable` refuses to resume a stage from checkpoints trained with settings
that change its result (`trained_settings` says which those are), and a damaged checkpoint is skipped for the newest
one that reads back.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spatial_jax.config import ConfigError, flatten, from_dict, to_dict
from spatial_jax.data.processor_files import write_processor_configs
from spatial_jax.data.sample import DatasetError
from spatial_jax.data.sources import spec_digest
from spatial_jax.data.visuals import video_config
from spatial_jax.distributed import barrier, is_primary
from spatial_jax.models.hf_io import save_pretrained
from spatial_jax.models.registry import architecture
from spatial_jax.rl.checkpoint import Checkpointer, CheckpointError
from spatial_jax.rl.config import TrainConfig, check_context, validate
from spatial_jax.rl.optim import make_optimizer
from spatial_jax.rl.policy import Policy, build_mesh, build_policy, freeze_vision
from spatial_jax.rl.report import write_json
from spatial_jax.rollout.hosts import HostShare

STAGES = ("sft", "rl")

# What a resumed run may change, as none of it changes what a stage trains: how the run is shown (progress,
# tensorboard) and exported (export_hf), evaluated (eval, data.eval: the evaluation cache is keyed by them),
# checkpointed and where it lives; and how the same computation is laid out on the machine (mesh, the rollout mesh
# decode.devices, remat, attention chunks, reader threads: equal up to float rounding, which lets a run move to another
# machine) or planned for one (plan).
RESUMABLE_CHANGES = ("run_dir", "progress", "tensorboard", "export_hf", "eval", "data.eval", "data.read_threads",
                     "mesh", "decode.devices", "plan", "policy.remat", "policy.remat_policy", "policy.attention_chunk",
                     "policy.attention_impl", "policy.moe_matmul",
                     "sft.checkpoint_every", "rl.checkpoint_every")


# PolicyConfig fields that decide which arrays the trainable state holds
WEIGHT_LAYOUT = ("lora", "train_vision", "scan_layers", "param_dtype")


def trained_settings(config: dict[str, Any], stage: str) -> dict[str, Any]:
    """What the weights after `stage` depend on, as dotted key -> value, from a config dict (to_dict(TrainConfig) or
    one a checkpoint recorded): every setting but RESUMABLE_CHANGES; for the SFT stage none of rl.* and rewards.*,
    for the RL stage only the run's method's reward table."""
    config = json.loads(json.dumps(config))  # tuples as lists, as a checkpoint's JSON meta holds them

    def counts(key: str) -> bool:
        if any(key == free or key.startswith(free + ".") for free in RESUMABLE_CHANGES):
            return False
        if stage == "sft" and key.startswith(("rl.", "rewards.")):
            return False
        return not key.startswith("rewards.") or key.startswith(f"rewards.{config.get('method')}.")

    return {key: value for key, value in flatten(config).items() if counts(key)}


def stage_data(cfg: TrainConfig, stage: str) -> tuple[str, str]:
    """(config key, source) of the data `stage` trains on."""
    field, source = cfg.data.training_source(stage)
    return f"data.{field}", source


def data_digest(cfg: TrainConfig, stage: str) -> dict[str, str]:
    """{config key: SHA-256 of the file} of the data `stage` trains on, which a checkpoint records: its rows change
    the result as settings do. Empty for a synthetic source (the settings make it) or a file that does not read (the
    input check reports it)."""
    key, spec = stage_data(cfg, stage)
    try:
        digest = spec_digest(spec)
    except (OSError, DatasetError):
        return {}
    return {} if digest is None else {key: digest}


def _check_same_data(cfg: TrainConfig, stage: str, meta: dict[str, Any], where: Path) -> None:
    """ConfigError when the checkpoint at `where` was trained on other rows of the stage's data file."""
    was, now = meta.get("data_sha256"), data_digest(cfg, stage)
    for key, digest in now.items():
        if was and was.get(key, digest) != digest:
            raise ConfigError(
                f"{where} was trained on other data: {key} {stage_data(cfg, stage)[1]} has changed since (SHA-256 "
                f"{was[key][:12]} -> {digest[:12]}); resuming it would mix two runs: rerun on the data it was trained "
                "on or use another run_dir"
            )


def check_resumable(cfg: TrainConfig) -> None:
    """Refuses (ConfigError) to resume a stage the job runs from checkpoints trained with settings that change its
    result, naming each such key with both values, or on other rows of its data file: the run would end as a mix of
    two runs. The RL stage is compared first, as its weights depend on every setting the SFT stage's do."""
    current = to_dict(cfg)
    for stage, steps in (("rl", cfg.rl.steps), ("sft", cfg.sft.steps)):
        directory = Path(cfg.run_dir) / stage
        if steps == 0 or not (directory / "checkpoints").is_dir():
            continue
        with Checkpointer(directory, async_save=False, reader=True) as ck:
            try:
                step, meta, _ = ck.read_newest_meta()
            except (FileNotFoundError, CheckpointError):
                continue  # nothing to compare: the stage starts afresh, or its restore reports the damage
            _check_same_data(cfg, stage, meta, ck.step_path(step))
            saved = meta.get("config")
            if saved is None:
                continue
            was, now = trained_settings(saved, stage), trained_settings(current, stage)
            keys = [k for k in dict.fromkeys([*was, *now]) if was.get(k, "(unset)") != now.get(k, "(unset)")]
            if "method" in keys:  # the reward tables differ with it; naming each of their keys says no more
                keys = [k for k in keys if not k.startswith("rewards.")]
            if keys:
                changes = ", ".join(f"{k} {json.dumps(was.get(k, '(unset)'))} -> {json.dumps(now.get(k, '(unset)'))}"
                                    for k in keys)
                raise ConfigError(
                    f"{ck.step_path(step)} was trained with other settings ({changes}); resuming it would mix two "
                    f"runs: rerun with the run's own settings ({Path(cfg.run_dir) / 'config.json'}) or use another "
                    "run_dir"
                )


def has_checkpoint(run_dir: str | Path) -> bool:
    """Whether a stage of `run_dir` has a checkpoint (looked up without creating anything)."""
    for stage in STAGES:
        if (Path(run_dir) / stage / "checkpoints").is_dir():
            with Checkpointer(Path(run_dir) / stage, async_save=False, reader=True) as ck:
                if ck.all_steps():
                    return True
    return False


def rl_batches(rc) -> tuple[int, int]:
    """(mini-batch, micro-batch) of an RL step in rollouts, their zeros resolved (RLConfig)."""
    mini = rc.mini_batch or rc.prompts_per_step * rc.group_size
    return mini, rc.micro_batch or mini


def updates_per_step(rc) -> int:
    """Optimiser updates an RL step makes: updates_per_batch passes of one update per mini-batch."""
    return rc.updates_per_batch * (rc.prompts_per_step * rc.group_size) // rl_batches(rc)[0]


class Workspace:
    """The policy of one run directory, placed on the run's mesh, with checkpoint restore.

    record_config: a training job, which owns the run directory: it creates it, records its config there (unless an
    identical one is there already), and moves damaged checkpoints out of the way. Otherwise (`eval`) nothing in the
    run directory is written."""

    def __init__(self, cfg: TrainConfig, record_config: bool = False):
        validate(cfg, jax.device_count())
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.primary = is_primary()  # in a multi-host run only the first process writes files and prints
        self.training = record_config
        self.preflight()
        self.mesh = build_mesh(cfg.mesh)
        self.policy: Policy = build_policy(cfg.policy, self.mesh)
        check_context(cfg, self.policy.model.cfg.text.max_position_embeddings)
        if self.training:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if self.primary:
                write_json(self.run_dir / "config.json", to_dict(cfg))
        self.graphdef, self.trainable, self.frozen = nnx.split(self.policy.model, self.policy.trainable, ...)
        self.method = cfg.plugin
        self.reward_cfg = cfg.reward_config()
        self.tok = self.policy.tokenizer
        self.reference = None  # KL reference weights when there are no adapters to switch off (set by the RL stage)
        self.restored_meta: dict[str, Any] = {}  # the meta of the checkpoint `restore` read last

    def preflight(self) -> None:
        """Checks before the policy is built and anything is written (the trainer's: resume and inputs)."""

    @property
    def model(self):
        return nnx.merge(self.graphdef, self.trainable, self.frozen)

    def log(self, text: str) -> None:
        if self.cfg.progress and self.primary:
            print(text, flush=True)

    def warn(self, text: str) -> None:
        if self.primary:
            print(f"spatial-jax: {text}", file=sys.stderr, flush=True)

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
        """Restores the newest checkpoint of `ck` that reads back (weights, optimiser state, reference, data position
        when an iterator is given), saying which newer ones it skipped and why; a training job moves those out of the
        way, so it can write their steps again. Returns (step, opt_state, whether anything was restored); the
        checkpoint's meta is left in self.restored_meta."""
        self.restored_meta = {}
        if not ck.all_steps():
            return 0, opt_state, False
        step, state, meta, skipped = ck.restore_newest(self.state(opt_state))
        self.restored_meta = meta
        for reason in skipped:
            self.warn(f"skipped checkpoint {reason}; using {ck.directory.parent.name} step {step}")
        if skipped and self.training:
            if self.primary:
                for newer in [s for s in ck.all_steps() if s > step]:
                    self.warn(f"moved the unreadable {ck.step_path(newer)} to {ck.set_aside(newer)}")
            if jax.process_count() > 1:  # the others list the steps again once the first process has moved them
                from jax.experimental import multihost_utils

                multihost_utils.sync_global_devices("checkpoints set aside")
                ck.reload()
        self.trainable = state["params"]
        self.reference = state.get("ref", self.reference)
        if iterator is not None:
            iterator.set_state(meta["data"])
        self.log(f"resumed {ck.directory} at step {meta['step']}")
        return int(meta["step"]), state["opt"], True

    def export(self, out: str | Path, dtype: str | None = None) -> Path:
        """The policy as it is now, as a Hugging Face checkpoint in `out` (adapters merged; the tokenizer and the image
        and video processors' settings beside it, under the architecture's processor classes) that transformers loads
        and `policy.checkpoint` takes. Every process takes part (the weights may be sharded across them,
        models/hf_io.save_pretrained); the first writes, and all return once the files are complete."""
        out = Path(out)
        if self.primary:
            out.mkdir(parents=True, exist_ok=True)
            self.tok.save(out)
            image_cfg = self.policy.image_cfg
            write_processor_configs(out, image_cfg, video_config(image_cfg, None),
                                    architecture(self.model.cfg.model_type).processor_files)
        save_pretrained(self.model, out, dtype=dtype)
        barrier("export")
        return out

    def optim_config(self, stage: str, cfg: TrainConfig | None = None):
        """The stage's optimiser settings: schedules span the stage's updates, accumulation spans the micro-batches of
        an RL mini-batch."""
        cfg = cfg or self.cfg
        if stage == "sft":
            return dataclasses.replace(cfg.sft.optim, total_steps=cfg.sft.steps)
        mini, micro = rl_batches(cfg.rl)
        return dataclasses.replace(cfg.rl.optim, total_steps=cfg.rl.steps * updates_per_step(cfg.rl),
                                   grad_accum_steps=mini // micro)

    def optimizer(self, stage: str, cfg: TrainConfig | None = None):
        """The stage's optimiser; an SFT stage with sft.train_vision false leaves the vision tower's weights alone."""
        cfg = cfg or self.cfg
        tx = make_optimizer(self.optim_config(stage, cfg))
        if stage == "sft" and cfg.policy.train_vision and not cfg.sft.train_vision:
            tx = freeze_vision(tx, self.trainable)
        return tx

    def _check_weight_layout(self, trained: TrainConfig, where: Path) -> None:
        """The settings that shape the trainable weights must be the run's, or its checkpoint cannot be read into
        this policy; say which instead of orbax's tree-structure mismatch."""
        ours, theirs = self.cfg.policy, trained.policy
        differ = [f"policy.{k}={getattr(theirs, k)!r} (here {getattr(ours, k)!r})"
                  for k in WEIGHT_LAYOUT if getattr(ours, k) != getattr(theirs, k)]
        if differ:
            raise ConfigError(f"{where} was trained with {', '.join(differ)}: pass the same settings")

    def load_latest(self) -> str | None:
        """Takes the trainable weights of the newest checkpoint that reads back (RL over SFT); returns its stage or
        None.

        The checkpoint's optimiser state and KL reference are laid out by the settings of the run that saved it
        (kept in its meta), so they are rebuilt from those: `eval` may override micro-batching, the KL term and
        the like."""
        for stage in reversed(STAGES):
            if not (self.run_dir / stage / "checkpoints").is_dir():  # opening one would create it
                continue
            with Checkpointer(self.run_dir / stage, async_save=False, reader=True) as ck:
                if not ck.all_steps():
                    continue
                _, meta, _ = ck.read_newest_meta()
                saved = meta.get("config")
                trained = from_dict(TrainConfig, saved) if saved is not None else self.cfg
                self._check_weight_layout(trained, ck.directory)
                self.start_reference(stage, trained)
                self.restore(ck, self.optimizer(stage, trained).init(self.trainable), None)
            return stage
        return None


class WorkspacePart:
    """A part of the training step that works on a workspace's weights (rl/experience.py, rl/learner.py): it reads
    and writes them there, so a restore or the decoding copy sees them as the stage driver does."""

    def __init__(self, ws: Workspace, hosts: HostShare):
        self.ws, self.hosts = ws, hosts

    @property
    def cfg(self) -> TrainConfig:
        """The workspace's settings, read at each use (a test or a tool may replace them between steps)."""
        return self.ws.cfg
