"""The training job: optional SFT cold start, evaluation, GRPO/GSPO with the method's reward, evaluation, summary.

This module is the stage driver (the stages, their checkpoints and metrics, evaluation and export); a step's work is
the experience producer's (rl/experience.py: prompts to scored groups) and the learner's (rl/learner.py: scored
groups to updates), both over the workspace's weights (rl/workspace.py).

Every stage checkpoints with orbax into the run directory and resumes from its last checkpoint that reads back when
the same command runs again (a rerun with settings that change the result is refused: workspace.check_resumable);
randomness is a function of (seed, step), so a resumed run ends where an uninterrupted one does. Before anything is
written or compiled the job checks its settings, its resume and every input it will read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax

from spatial_jax.config import ConfigError, to_dict
from spatial_jax.data.pipeline import Batch, check_rows, check_visuals, open_source, source_key
from spatial_jax.data.prompts import PromptFormat
from spatial_jax.data.sample import DatasetError
from spatial_jax.data.tokenizer import SpatialTokenizer
from spatial_jax.distributed import is_primary, primary_says
from spatial_jax.eval.evaluate import evaluate
from spatial_jax.interrupts import Interrupted, check
from spatial_jax.locks import PidLock
from spatial_jax.rl import report
from spatial_jax.rl.checkpoint import Checkpointer
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.experience import Experience
from spatial_jax.rl.learner import Learner
from spatial_jax.rl.metrics import MetricsWriter, ProgressBar
from spatial_jax.rl.optim import lr_schedule
from spatial_jax.rl.policy import policy_encoding
from spatial_jax.rl.workspace import (
    Workspace,
    check_resumable,
    data_digest,
    stage_data,
    trained_settings,
    updates_per_step,
)
from spatial_jax.rollout.collect import ToolSettings
from spatial_jax.rollout.decode_copy import decode_mesh
from spatial_jax.rollout.hosts import HostShare


def inputs(cfg: TrainConfig) -> dict[str, str]:
    """The data sources the job reads, by config key."""
    out = dict(stage_data(cfg, stage) for stage, steps in (("sft", cfg.sft.steps), ("rl", cfg.rl.steps)) if steps > 0)
    if (cfg.sft.steps > 0 and cfg.eval.after_sft) or (cfg.rl.steps > 0 and cfg.eval.after_rl):
        out["data.eval"] = cfg.data.eval
    return out


def open_inputs(cfg: TrainConfig, encoding: tuple[SpatialTokenizer, PromptFormat, Any] | None = None
                ) -> dict[str, dict[str, int]]:
    """Opens every source the job reads (a JSONL file is read, each row checked and its images and videos decoded),
    so a broken one fails at start instead of after a stage; DatasetError names the key, the file and the line. With
    `encoding` (the policy's tokenizer, the method's prompt format and the image settings) every row is encoded as its
    batches will be and its token count held to the largest bucket (pipeline.check_rows). Under data.bad_rows =
    "skip", the rows dropped, by key and reason."""
    skipped = {}
    for key, spec in inputs(cfg).items():
        try:
            source = open_source(spec, cfg.data.synthetic, columns=cfg.data.columns, seed=cfg.data.seed)
            if len(source) == 0:
                raise DatasetError(f"{spec} holds no sample")
            if spec.startswith("synthetic:"):  # drawn in memory from the project's own short templates
                continue
            screen_key, unique = source_key(cfg.data, spec), not spec.startswith("mix:")
            if encoding is None:
                reasons = check_visuals(source, cfg.data, screen_key, unique)
            else:
                tok, fmt, image_cfg = encoding
                sft = cfg.sft.steps > 0 and key == stage_data(cfg, "sft")[0]  # the longer of the two encodings
                reasons = check_rows(source, tok, cfg.data, fmt, "sft" if sft else "rl", image_cfg, key=screen_key,
                                     unique_ids=unique)
            if reasons:
                skipped[key] = dict(reasons.most_common())
        except DatasetError as e:
            raise DatasetError(f"{key}: {e}") from None
    return skipped


def check_host_split(cfg: TrainConfig, processes: int) -> None:
    """Each process reads an equal block of every batch: the batch sizes the job uses must split among them."""
    sizes = {"sft.batch_size": cfg.sft.batch_size if cfg.sft.steps > 0 else 0,
             "rl.prompts_per_step": cfg.rl.prompts_per_step if cfg.rl.steps > 0 else 0}
    for key, size in sizes.items():
        if size % processes:
            raise ConfigError(f"{key}={size} does not split among the {processes} processes of the cluster: each "
                              "reads an equal block of every batch")


def check_rollout_mode(cfg: TrainConfig, processes: int) -> None:
    """one_step_off's sampling thread decodes while the update runs: on one process, where neither enters a
    collective the other processes would have to meet in the same order."""
    if cfg.rl.steps > 0 and cfg.rl.rollout_mode == "one_step_off" and processes > 1:
        raise ConfigError(f"rl.rollout_mode=one_step_off runs on one process, not {processes}: each process's "
                          "sampling thread and update would enter cross-process collectives in no agreed order")


class Trainer(Workspace):
    """One run directory's training job; `run()` does every configured stage, resuming where it stopped."""

    def __init__(self, cfg: TrainConfig, record_config: bool = True):
        super().__init__(cfg, record_config=record_config)
        # multi-host: each process reads, rolls out and scores its own block of every batch (rollout/hosts.py)
        self.hosts = HostShare.of_cluster(self.tok.pad_id)
        decode_mesh(self.mesh, cfg.decode.tensor, cfg.decode.devices)  # one that does not fit fails now
        self.experience = Experience(self, self.hosts)  # prompts -> scored groups
        self.learner = Learner(self, self.hosts)  # scored groups -> updates

    def preflight(self) -> None:
        """Fails now, before anything is written or compiled, on a resume with other settings, a broken input or
        batches that do not split among the processes."""
        check_resumable(self.cfg)
        tok, image_cfg = policy_encoding(self.cfg.policy)
        # data.bad_rows = "skip": the rows dropped, by data key and reason (the base class calls preflight first)
        self.skipped_rows: dict[str, dict[str, int]] = open_inputs(self.cfg, (tok, self.cfg.plugin.prompt, image_cfg))
        for key, reasons in self.skipped_rows.items():
            print(f"{key}: skipping {sum(reasons.values())} bad rows (data.bad_rows=skip): {reasons}", flush=True)
        check_host_split(self.cfg, jax.process_count())
        check_rollout_mode(self.cfg, jax.process_count())

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        results: dict[str, Any] = {"run_dir": str(self.run_dir), "method": cfg.method}
        if self.skipped_rows:
            results["skipped_rows"] = self.skipped_rows
        with jax.set_mesh(self.mesh):
            if cfg.sft.steps > 0:
                self.sft()
                if cfg.eval.after_sft:
                    results["after_sft"] = self.evaluate("sft")
            if cfg.rl.steps > 0:
                self.rl()
                if cfg.eval.after_rl:
                    results["after_rl"] = self.evaluate("rl")
            if cfg.export_hf and (cfg.sft.steps > 0 or cfg.rl.steps > 0):
                results["hf_checkpoint"] = str(self.export_final())
        if not self.primary:
            return results
        results.update(report.compare_stages(self.run_dir, results))
        report.write_json(self.run_dir / "summary.json", results)
        curves = report.plot(self.run_dir, results)
        if curves:
            results["curves_png"] = curves
        report.print_summary(results)
        return results

    def export_final(self) -> Path:
        """<run_dir>/hf: the trained policy as a Hugging Face checkpoint, written unless it already holds these
        weights (its export.json names the stage and step it was written from; a finished job run again writes
        nothing). The marker goes last, so an export cut short is redone."""
        out = self.run_dir / "hf"
        cfg = self.cfg
        mark = {"stage": "rl", "step": cfg.rl.steps} if cfg.rl.steps > 0 else {"stage": "sft", "step": cfg.sft.steps}
        if primary_says(self.primary and report.read_json(out / "export.json") == mark):
            return out
        if self.primary:
            (out / "export.json").unlink(missing_ok=True)
        self.export(out)
        if self.primary:
            report.write_json(out / "export.json", mark)
        return out

    def stage(self, name: str, steps: int, batch_size: int, checkpoint_every: int, keys: tuple[str, ...],
              step_fn: Callable[[int, Batch | None, Any, Any], tuple[dict[str, Any], Any]],
              reads_batches: bool = False) -> None:
        """Runs `steps` steps of a stage, resuming from its checkpoints; `step_fn(step, batch, tx, opt_state)` ->
        (metrics, opt_state) does the work (batch None with `reads_batches`: the step reads its own from
        self.batches, as one_step_off reads the next step's ahead). A finished stage only hands its weights on."""
        cfg = self.cfg
        optim = self.optim_config(name)
        tx = self.optimizer(name)
        schedule = lr_schedule(optim)
        updates = updates_per_step(self.cfg.rl) if name == "rl" else 1
        # leaving on an error (a bad row, a signal) still commits the pending save: the rerun resumes from it
        with Checkpointer(self.run_dir / name, max_to_keep=2, save_interval=checkpoint_every) as ck:
            self.start_reference(name)
            it = self.hosts.iterator(cfg.data, self.tok, self.method.prompt, batch_size, name, self.policy.image_cfg)
            start, opt_state, resumed = self.restore(ck, tx.init(self.trainable), it)
            if start == steps:  # finished: only hands its weights on
                return
            if resumed and "pending" in self.restored_meta:
                self.experience.take_back(self.restored_meta["pending"], it)
            writer = MetricsWriter(self.run_dir / name, resume_step=start if resumed else None,
                                   tensorboard=cfg.tensorboard, active=self.primary)
            bar = ProgressBar(steps, initial=start, keys=keys, desc=name, disable=not (cfg.progress and self.primary))
            saved_config = to_dict(cfg)  # with the weights: `eval` rebuilds the optimiser state and reference from it
            data = data_digest(cfg, name)
            # data.bad_rows = "skip": the rows this stage's source lost, by reason, beside every step's figures
            skipped = self.skipped_rows.get(stage_data(cfg, name)[0], {})
            skipped = {"data/skipped_rows": sum(skipped.values()),
                       **{f"data/skipped/{reason}": n for reason, n in skipped.items()}} if skipped else {}
            done = start
            self.experience.batches = it
            try:
                for step in range(start, steps):
                    check()  # a signal that came where it could not be raised (interrupts.py)
                    metrics, opt_state = step_fn(step, None if reads_batches else next(it), tx, opt_state)
                    metrics["lr"] = float(schedule(step * updates))
                    metrics.update(skipped)
                    bar.update(writer.log(step + 1, metrics))
                    done = step + 1
                    last = step + 1 == steps
                    if ck.due(step + 1, force=last):
                        # the rollouts ahead (one_step_off) finish first: they read batches, and the checkpoint
                        # keeps them and the data position after them
                        ahead = self.experience.ahead.save(step + 1)
                        ck.save(step + 1, self.state(opt_state), {"step": step + 1, "data": it.get_state(),
                                                                   "config": saved_config, "data_sha256": data,
                                                                   **ahead}, force=last)
                        self.experience.ahead.prune(ck.all_steps())
            except Interrupted as e:
                ck.wait_until_finished()
                kept = ck.latest_step()
                then = f"from its checkpoint of step {kept}" if kept else "(the stage starts again: no checkpoint yet)"
                raise e.at(f" at step {done} of the {name} stage; rerun to resume {then}") from None
            finally:
                self.experience.ahead.drain()
                bar.close()
                writer.close()

    def sft(self) -> None:
        sc = self.cfg.sft
        self.stage("sft", sc.steps, sc.batch_size, sc.checkpoint_every, ("loss", "lr"),
                   self.learner.sft_step)

    def rl(self) -> None:
        rc = self.cfg.rl
        sampling = dataclasses.replace(rc.sampling, stop_token_ids=(self.tok.im_end_id,), pad_token_id=self.tok.pad_id)
        n_micro = self.optim_config("rl").grad_accum_steps
        self.stage("rl", rc.steps, rc.prompts_per_step, rc.checkpoint_every,
                   ("reward_mean", "accuracy", "mean_H", "loss"),
                   lambda step, batch, tx, opt_state: self.rl_step(step, batch, sampling, tx, n_micro, opt_state),
                   reads_batches=rc.rollout_mode == "one_step_off")

    def rl_step(self, step: int, batch: Batch | None, sampling, tx, n_micro: int,
                opt_state) -> tuple[dict[str, Any], Any]:
        """Rollouts -> rewards -> advantages -> updates. "sync" rolls out `batch` now; "one_step_off" takes the
        rollouts sampled during the previous update (or rolls out the next batch now, on a stage's first step) and
        starts the next step's, from the weights before this update (rollout_lag 1) or after it (0)."""
        rc, exp = self.cfg.rl, self.experience
        if rc.rollout_mode == "sync":
            return self.learner.learn(exp.roll_out(step, batch, sampling, None, version=step), tx, n_micro,
                                      opt_state, sampling)
        rolled = exp.ahead.take(step)
        waited = exp.ahead.waited
        if rolled is None:
            rolled = exp.roll_out(step, next(exp.batches), sampling, None, version=step)
        if rc.rollout_lag == 1:
            exp.roll_ahead(step + 1, sampling)
        metrics, opt_state = self.learner.learn(rolled, tx, n_micro, opt_state, sampling,
                                                exp.behaviour.pop(rolled.step, None))
        if rc.rollout_lag == 0:
            exp.roll_ahead(step + 1, sampling)
        metrics["rollout/wait_s"] = waited
        return metrics, opt_state

    def evaluate(self, stage: str) -> dict[str, Any]:
        """Held-out evaluation after `stage`; cached in the run directory so a resumed job does not redo it."""
        cfg = self.cfg
        path = self.run_dir / f"eval_{stage}.json"
        # reused only for the same weights (every setting they depend on) and the same evaluation
        key = json.loads(json.dumps({
            "weights": trained_settings(to_dict(cfg), stage), "data": cfg.data.eval, "method": cfg.method,
            "eval": {k: v for k, v in to_dict(cfg.eval).items() if k not in ("after_sft", "after_rl")},
            "rewards": to_dict(self.reward_cfg), "blank_fill": cfg.rl.blank_fill,
            "tools": [cfg.rl.max_tool_turns, cfg.rl.max_tool_tokens],
        }))
        cached = report.read_json(path)  # None when missing or cut
        reuse = isinstance(cached, dict) and cached.get("key") == key and "summary" in cached
        # every process evaluates its share, or none does: the first one's files decide (the others may not see them)
        if primary_says(self.primary and reuse):
            return cached["summary"] if reuse else {}
        bar = ProgressBar(cfg.eval.max_samples or None, keys=(), desc=f"eval after {stage}",
                          disable=not (cfg.progress and self.primary))
        summary, rows = evaluate(self.experience.decoder(), self.tok, self.eval_share(), self.method, self.reward_cfg,
                                 cfg.eval.max_new_tokens, cfg.eval.max_samples, progress=lambda n: bar.update({}, n),
                                 tools=ToolSettings(cfg.rl.max_tool_turns, cfg.rl.max_tool_tokens),
                                 blank_fill=cfg.rl.blank_fill, image_cfg=self.policy.image_cfg, hosts=self.hosts,
                                 diagnostics=cfg.eval.diagnostics, seed=cfg.seed)
        bar.close()
        if self.primary:
            report.write_json(path, {"key": key, "summary": summary, "rows": rows}, indent=1)
        return summary

    def eval_share(self) -> Iterable[Batch]:
        """This process's share of the held-out samples (rollout/hosts.py)."""
        cfg = self.cfg
        return self.hosts.eval_iterator(cfg.data, self.tok, self.method.prompt, cfg.eval.batch_size,
                                        cfg.eval.max_samples, self.policy.image_cfg)


RUN_LOCK = "run.lock"


def train(cfg: TrainConfig) -> dict[str, Any]:
    """The job, holding the run directory's lock (taken by the first process of a cluster, which writes its files):
    a second job on the same directory is refused before it writes anything."""
    try:
        if not is_primary():
            return Trainer(cfg).run()
        with PidLock(Path(cfg.run_dir) / RUN_LOCK, f"run directory {cfg.run_dir}"):
            return Trainer(cfg).run()
    except Interrupted as e:
        raise e if e.where else e.at("; rerun to resume") from None
