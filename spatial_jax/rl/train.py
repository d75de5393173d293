"""The training job: optional SFT cold start, evaluation, GRPO/GSPO with the method's reward, evaluation, summary.

Every stage checkpoints with orbax into the run directory and resumes from its last checkpoint that reads back when
the same command runs again (a rerun with settings that change the result is refused: workspace.check_resumable);
randomness is a function of (seed, step), so a resumed run ends where an uninterrupted one does. Before anything is
written or compiled the job checks its settings, its resume and every input it will read.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spatial_jax.config import ConfigError, to_dict
from spatial_jax.data.pipeline import Batch, DataIterator, check_rows, check_visuals, open_source, source_key
from spatial_jax.data.prompts import PromptFormat
from spatial_jax.data.sample import DatasetError
from spatial_jax.data.tokenizer import SpatialTokenizer
from spatial_jax.distributed import is_primary, primary_says
from spatial_jax.eval.evaluate import evaluate
from spatial_jax.interrupts import Interrupted, check
from spatial_jax.locks import PidLock
from spatial_jax.rewards.advantages import group_advantages
from spatial_jax.rewards.overlong import overlong_penalties
from spatial_jax.rl import report
from spatial_jax.rl import step as st
from spatial_jax.rl.async_rollouts import Rolled, RolloutsAhead
from spatial_jax.rl.checkpoint import Checkpointer
from spatial_jax.rl.config import TrainConfig, old_logp_forward, overlong_max_length
from spatial_jax.rl.dynamic_sampling import fill
from spatial_jax.rl.losses import loss_denominator
from spatial_jax.rl.metrics import MetricsWriter, ProgressBar
from spatial_jax.rl.optim import lr_schedule
from spatial_jax.rl.policy import policy_encoding
from spatial_jax.rl.rollout_correction import CorrectionConfig, gap_metrics, rollout_correction
from spatial_jax.rl.workspace import (
    Workspace,
    check_resumable,
    data_digest,
    rl_batches,
    stage_data,
    trained_settings,
    updates_per_step,
)
from spatial_jax.rollout.collect import Collected, ToolSettings, collect
from spatial_jax.rollout.completions import Completions, take_rows
from spatial_jax.rollout.decode_copy import DecodeCopy, decode_mesh
from spatial_jax.rollout.hosts import HostShare


def _seed(cfg: TrainConfig, stage: int, step: int) -> int:
    return int(jax.random.randint(jax.random.fold_in(jax.random.key(cfg.seed), stage * 1_000_003 + step), (),
                                  0, 2**31 - 1))


def _dropout_rng(cfg: TrainConfig, stage: int, step: int):
    lora = cfg.policy.lora
    if lora.dropout == 0 or (lora.rank == 0 and lora.vision_rank == 0):
        return None
    return jax.random.fold_in(jax.random.key(cfg.seed + 7), stage * 1_000_003 + step)


def full_seq_batch(model_cfg, batch: Batch) -> st.SeqBatch:
    """SFT: the whole left-padded row is the sequence; the loss mask (shifted) picks the reference completion."""
    ids = np.asarray(batch.input_ids, np.int32)
    return st.make_seq_batch(model_cfg, ids[:, :1], batch.attention_mask[:, :1], ids[:, 1:],
                             batch.attention_mask[:, 1:], batch.pixel_values, batch.image_grid_thw,
                             loss_mask=batch.loss_mask[:, 1:], second_per_grid=batch.second_per_grid)


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
        self._decoder: DecodeCopy | None = None
        self._decoded_from = None  # the trainable state the decoding copy was made from
        # the running stage's batches: a step that samples more prompts (dynamic sampling) reads them here, so the
        # checkpointed data state counts them
        self.batches: DataIterator | None = None
        self.ahead = RolloutsAhead(self.run_dir / "rl" / "pending")  # rl.rollout_mode = "one_step_off"
        # one_step_off with old_logp = trainer: by step, a copy of the trainable weights its rollouts are sampled
        # from (one copy of the trainable state more), for the gap's split into numerics and staleness
        self.behaviour: dict[int, Any] = {}

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
                self.take_back_rollouts(self.restored_meta["pending"], it)
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
            self.batches = it
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
                        ahead = self.ahead.save(step + 1)
                        ck.save(step + 1, self.state(opt_state), {"step": step + 1, "data": it.get_state(),
                                                                   "config": saved_config, "data_sha256": data,
                                                                   **ahead}, force=last)
                        self.ahead.prune(ck.all_steps())
            except Interrupted as e:
                ck.wait_until_finished()
                kept = ck.latest_step()
                then = f"from its checkpoint of step {kept}" if kept else "(the stage starts again: no checkpoint yet)"
                raise e.at(f" at step {done} of the {name} stage; rerun to resume {then}") from None
            finally:
                self.ahead.drain()
                bar.close()
                writer.close()

    def take_back_rollouts(self, record: dict[str, Any], it: DataIterator) -> None:
        """The rollouts a one_step_off checkpoint was saved with; where they are lost, the data position goes back
        to before their prompts, which the step then rolls out from the restored weights."""
        why = self.ahead.load(record)
        if why is not None:
            # record["step"] counts from 0; the metrics and the checkpoints number a step by the steps done after it
            self.warn(f"{why}: step {record['step'] + 1}'s rollouts are sampled again from the restored weights, so "
                      "that step is on-policy where the interrupted run's was one step stale")
            it.set_state(record["data_before"])

    def sft(self) -> None:
        sc = self.cfg.sft
        self.stage("sft", sc.steps, sc.batch_size, sc.checkpoint_every, ("loss", "lr"), self.sft_step)

    def sft_step(self, step: int, batch: Batch, tx, opt_state) -> tuple[dict[str, Any], Any]:
        t0 = time.perf_counter()
        seq = st.shard_batch(full_seq_batch(self.policy.model.cfg, self.hosts.gather(batch)), self.mesh)
        self.trainable, opt_state, loss, metrics = st.sft_update(
            self.graphdef, self.trainable, self.frozen, opt_state, tx, seq, _dropout_rng(self.cfg, 0, step)
        )
        loss = float(loss)  # waits for the step, so the throughput below is real
        return {"loss": loss, "grad_norm": float(metrics["grad_norm"]),
                "tokens_per_s": float(metrics["num_tokens"]) / max(time.perf_counter() - t0, 1e-9)}, opt_state

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
        rc = self.cfg.rl
        if rc.rollout_mode == "sync":
            return self.learn(self.roll_out(step, batch, sampling, None, version=step), tx, n_micro, opt_state,
                              sampling)
        rolled = self.ahead.take(step)
        waited = self.ahead.waited
        if rolled is None:
            rolled = self.roll_out(step, next(self.batches), sampling, None, version=step)
        if rc.rollout_lag == 1:
            self.roll_ahead(step + 1, sampling)
        metrics, opt_state = self.learn(rolled, tx, n_micro, opt_state, sampling)
        if rc.rollout_lag == 0:
            self.roll_ahead(step + 1, sampling)
        metrics["rollout/wait_s"] = waited
        return metrics, opt_state

    def roll_ahead(self, step: int, sampling) -> None:
        """Starts sampling step `step`'s rollouts in the worker thread from the weights as they are now."""
        if step >= self.cfg.rl.steps:
            return
        before = self.batches.get_state()
        batch = next(self.batches)
        decoder = self.decoder()  # the copy is made here, before the update may donate the weights it reads
        version = step - self.cfg.rl.rollout_lag
        if self.cfg.rl.old_logp == "trainer" and self.cfg.rl.rollout_lag == 1:
            self.behaviour[step] = jax.tree.map(jnp.copy, self.trainable)
        self.ahead.start(lambda: self.roll_out(step, batch, sampling, decoder, version), before)

    def roll_out(self, step: int, batch: Batch, sampling, decoder: DecodeCopy | None, version: int) -> Rolled:
        """A step's rollouts of `batch` from `decoder` (None: the copy of the weights as they are now), scored; with
        dynamic sampling, further batches of prompts are rolled out until the batch is full of informative groups."""
        t0 = time.perf_counter()
        rc = self.cfg.rl
        G = rc.group_size
        rounds: list[tuple[Completions, list[dict[str, float]]]] = []
        counts = np.zeros((3, self.hosts.count), np.int64)  # per process: prompts read, rows decoded, rollouts scored

        def sample_round(k: int) -> np.ndarray:
            b = batch if k == 0 else next(self.batches)
            got = self.collect(step, b, sampling, round_=k, decoder=decoder)
            # every process's scores (its own rollouts'), in rollout order: the advantages and the metrics need them
            # all, and the update every process's rollouts' arrays
            blocks = self.hosts.blocks({"prompts": len(b.records), "decoded": got.decoded, "scores": got.scores})
            counts[:] += [[blk["prompts"] for blk in blocks], [blk["decoded"] for blk in blocks],
                          [len(blk["scores"]) for blk in blocks]]
            comps, scores = self.hosts.assemble(got.completions), [s for block in blocks for s in block["scores"]]
            if rc.overlong_penalty.enabled:
                penalty = overlong_penalties(comps.mask.sum(axis=1), overlong_max_length(self.cfg),
                                             rc.overlong_penalty.cache)
                scores = [dict(s, overlong_penalty=float(p), reward=s["reward"] + float(p))
                          for s, p in zip(scores, penalty)]
            rounds.append((comps, scores))
            return np.asarray([s["reward"] for s in scores], np.float32).reshape(-1, G)

        out: dict[str, float] = {}
        if rc.dynamic_sampling.enabled:
            selection = fill(sample_round, rc.prompts_per_step, rc.dynamic_sampling.max_rounds)
            picks = [(rounds[r], range(g * G, (g + 1) * G)) for r, g in selection.picks]
            comps = take_rows([(c, rows) for (c, _), rows in picks], self.tok.pad_id)
            scores = [sc[i] for (_, sc), rows in picks for i in rows]
            trained = np.repeat(selection.trained, G)
            sampled = [s for _, sc in rounds for s in sc]
            out.update(selection.metrics())
            out["dynamic/reward_mean_sampled"] = float(np.mean([s["reward"] for s in sampled]))
            out["dynamic/accuracy_sampled"] = float(np.mean([s[self.method.accuracy_key] for s in sampled]))
        else:
            sample_round(0)
            (comps, scores), trained = rounds[0], None
        for row, name in enumerate(("prompts_read", "rows_decoded", "rollouts_scored")):
            out[f"host/{name}_min"], out[f"host/{name}_max"] = int(counts[row].min()), int(counts[row].max())
        return Rolled(step, version, comps, scores, trained, out, time.perf_counter() - t0,
                      sum(float(c.mask.sum()) for c, _ in rounds))

    def learn(self, rolled: Rolled, tx, n_micro: int, opt_state, sampling) -> tuple[dict[str, Any], Any]:
        """Advantages of a step's rollouts -> updates_per_batch passes of an update per mini-batch, each of n_micro
        accumulated micro-batches."""
        G = self.cfg.rl.group_size
        comps, scores = rolled.completions, rolled.scores
        rewards = np.asarray([s["reward"] for s in scores], np.float32).reshape(-1, G)
        eq2 = self.reward_cfg.advantage
        adv = np.asarray(group_advantages(jnp.asarray(rewards), eq2.eps, eq2.std)).reshape(-1)
        t1 = time.perf_counter()
        opt_state, trained_out = self.update(rolled.step, comps, adv, tx, n_micro, opt_state,
                                             sampling.temperature or 1.0, rolled.trained,
                                             self.behaviour.pop(rolled.step, None))
        t_train = time.perf_counter() - t1
        out: dict[str, Any] = dict(rolled.metrics)
        out.update(trained_out)
        out.update(report.rollout_metrics(self.method, scores, rewards, adv, comps))
        out["rollout/lag"] = float(rolled.step - rolled.version)
        out["rollout_tokens_per_s"] = rolled.tokens / max(rolled.seconds, 1e-9)
        out["train_tokens_per_s"] = out.pop("train_tokens") / max(t_train, 1e-9)
        out["time/rollout_s"] = rolled.seconds
        out["time/update_s"] = t_train  # the whole update, the trainer's pi_old forward (time/old_logp_s) included
        return out, opt_state

    def decoder(self) -> DecodeCopy:
        """The decoding copy of the policy as it is now: made on first use, and again whenever the trainable weights
        changed since (an update, a restore)."""
        if self._decoder is None:
            self._decoder = DecodeCopy(self.model, self.cfg.decode, self.mesh)
        elif self._decoded_from is not self.trainable:
            self._decoder.refresh(self.model)
        self._decoded_from = self.trainable
        return self._decoder

    def collect(self, step: int, batch: Batch, sampling, round_: int = 0,
                decoder: DecodeCopy | None = None) -> Collected:
        """G sampled completions per prompt (and the method's blank or tool rollouts) of this process's prompts,
        decoded from `decoder` (default: the decoding copy of the weights as they are now) and scored; each sampling
        round of a step (dynamic sampling) draws its own random streams."""
        cfg, rc = self.cfg, self.cfg.rl
        return collect(decoder or self.decoder(), batch, self.tok, self.method, self.reward_cfg, sampling,
                       rc.group_size, _seed(cfg, 1 + 2 * round_, step), blank_seed=_seed(cfg, 2 + 2 * round_, step),
                       step=step, tools=ToolSettings(rc.max_tool_turns, rc.max_tool_tokens), blank_fill=rc.blank_fill,
                       image_cfg=self.policy.image_cfg, hosts=self.hosts)

    def update(self, step: int, comps: Completions, adv: np.ndarray, tx, n_micro: int, opt_state,
               temperature: float, trained: np.ndarray | None = None,
               behaviour: Any = None) -> tuple[Any, dict[str, Any]]:
        """updates_per_batch passes over the rollouts, one optimiser update per mini-batch accumulated over its
        n_micro micro-batches (completion tokens only carry loss; prompts are masked, and so are rollouts that never
        stopped under overlong filtering and those `trained` [R] marks False: dynamic sampling's padding). Each
        optimiser call's clip fraction and ratio spread is logged as call<k>/..., k counting the step's calls from 1,
        so a call that should be off-policy and sees ratio 1 shows.

        pi_old is the sampler's log-probs or, with rl.old_logp = "trainer", the trainer's at the step's starting
        weights (then rl.correction applies); the gap between the sampler's log-probs and the trainer's at those
        weights is logged as gap/*. `behaviour`: the trainable weights the rollouts were sampled from where they are
        not the current ones (one_step_off, old_logp = trainer), for the gap's split into gap/numeric/* (sampler vs
        trainer at the sampler's weights) and gap/staleness/* (trainer at the sampler's weights vs the step's
        starting weights)."""
        cfg, rc = self.cfg, self.cfg.rl
        mask = comps.mask
        if trained is not None:
            mask = mask * trained[:, None].astype(mask.dtype)
        if rc.overlong_filter:
            stopped = np.any((comps.tokens == self.tok.im_end_id) & (mask > 0), axis=1)
            mask = mask * stopped[:, None].astype(mask.dtype)
        context = getattr(comps, "context_mask", comps.mask)  # tool output is attended to, never trained on
        micro = rl_batches(rc)[0] // n_micro
        items, patches = comps.item_starts()
        # each prompt's images are encoded once per micro-batch; tool pictures make a group's rows' images differ
        share = not np.any(getattr(comps, "num_tool_pictures", 0))
        G = rc.group_size
        group = G if rc.shared_prefix and share and micro % G == 0 else 1
        seqs, samplers = [], []
        for m in range(len(adv) // micro):
            rows = slice(m * micro, (m + 1) * micro)
            seq = st.make_seq_batch(
                self.policy.model.cfg, comps.prompt_ids[rows], comps.prompt_mask[rows], comps.tokens[rows],
                context[rows], comps.pixel_values[patches[items[rows.start]] : patches[items[rows.stop]]],
                comps.image_grid_thw[items[rows.start] : items[rows.stop]],
                loss_mask=mask[rows],
                row_group=np.arange(rows.start, rows.stop) // G if share else None,
                row_image_counts=comps.image_counts[rows] if share else None, group=group,
                second_per_grid=None if comps.second_per_grid is None
                else comps.second_per_grid[items[rows.start] : items[rows.stop]],
            )
            seqs.append(st.shard_batch(seq, self.mesh))
            samplers.append(st.shard_batch(jnp.asarray(comps.logprobs[rows], jnp.float32), self.mesh))
        loss_masks = [seq.target_mask for seq in seqs]
        out: dict[str, Any] = {}
        olds, weights = samplers, [None] * len(seqs)
        forward = old_logp_forward(cfg)
        if forward:
            t0 = time.perf_counter()
            olds = jax.block_until_ready(self.trainer_logprobs(self.trainable, seqs, temperature))
            out["time/old_logp_s"] = time.perf_counter() - t0
        if rc.correction.enabled:
            tis, kept, corr = _corrected(olds, samplers, loss_masks, rc.correction)
            out.update({f"correction/{k}": float(v) for k, v in corr.items()})
            if rc.correction.tis != "off":
                weights = tis
            if rc.correction.mis != "off":
                seqs = [seq.replace(target_mask=k) for seq, k in zip(seqs, kept)]
        datas = []
        for m, seq in enumerate(seqs):
            rows = slice(m * micro, (m + 1) * micro)
            if m % n_micro == 0:
                # each micro-batch divides by its mini-batch's denominator, so accumulating them equals one update
                # on the whole mini-batch
                normalizer = loss_denominator(jnp.concatenate([s.target_mask for s in seqs[m : m + n_micro]]),
                                              rc.loss.aggregation) / n_micro
            if rc.loss.kl_coef > 0:
                ref_weights = self.trainable if self.reference is None else self.reference
                ref = st.reference_logprobs(self.graphdef, ref_weights, self.frozen, seq, temperature)
            else:
                ref = jnp.zeros(seq.target_mask.shape, jnp.float32)
            datas.append(st.RLData(seq=seq, old_logp=olds[m], ref_logp=st.shard_batch(ref, self.mesh),
                                   advantages=st.shard_batch(jnp.asarray(adv[rows], jnp.float32), self.mesh),
                                   normalizer=normalizer, is_weights=weights[m]))
        losses, loss_metrics, first = [], [], []
        calls = rc.updates_per_batch * len(datas)
        for epoch in range(rc.updates_per_batch):
            for m, data in enumerate(datas):
                rng = _dropout_rng(cfg, 1, step * calls + epoch * len(datas) + m)
                if rc.old_logp == "trainer":
                    # the first update's own forward runs at the step's starting weights: pi_old, ratio exactly 1
                    data = data.replace(own_old=jnp.float32(epoch == 0 and m < n_micro and rng is None))
                self.trainable, opt_state, loss, lm, logp = st.rl_update(
                    self.graphdef, self.trainable, self.frozen, opt_state, data, rc.loss, temperature, tx, rng
                )
                if epoch == 0 and m < n_micro:  # optax.MultiSteps applies the first update after its last micro-batch
                    first.append(logp)
                losses.append(float(loss))
                loss_metrics.append({k: float(v) for k, v in lm.items()})
        out["loss"] = float(np.mean(losses))
        for k in loss_metrics[0]:
            out[f"loss/{k}"] = float(np.mean([lm[k] for lm in loss_metrics]))
        for c, lm in enumerate(loss_metrics, 1):
            for k in ("clip_frac", "ratio_dev_max", "ratio_std"):
                out[f"call{c}/{k}"] = lm[k]
        # the trainer at the step's starting weights: its pi_old forward where it ran, else the first update's
        start, n = (olds, len(seqs)) if forward else (first, n_micro)
        out.update({f"gap/{k}": float(v) for k, v in _gap(start[:n], samplers[:n], loss_masks[:n]).items()})
        if behaviour is not None:
            then = self.trainer_logprobs(behaviour, seqs[:n], temperature)
            out.update({f"gap/numeric/{k}": float(v) for k, v in _gap(then, samplers[:n], loss_masks[:n]).items()})
            out.update({f"gap/staleness/{k}": float(v) for k, v in _gap(start[:n], then, loss_masks[:n]).items()})
        out["train_tokens"] = float(mask.sum()) * rc.updates_per_batch
        return opt_state, out

    def trainer_logprobs(self, weights: Any, seqs: list[st.SeqBatch], temperature: float) -> list[jax.Array]:
        """The trainer's log-probs of each micro-batch's targets under `weights` (no dropout)."""
        return [st.policy_logprobs(self.graphdef, weights, self.frozen, seq, temperature) for seq in seqs]

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
        summary, rows = evaluate(self.decoder(), self.tok, self.eval_share(), self.method, self.reward_cfg,
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


@functools.partial(jax.jit, static_argnums=3)
def _corrected(olds, samplers, masks, cfg: CorrectionConfig):
    """rollout_correction over the whole batch (its metrics are the batch's), split back into micro-batches."""
    w, kept, metrics = rollout_correction(jnp.concatenate(olds), jnp.concatenate(samplers), jnp.concatenate(masks),
                                          cfg)
    return jnp.split(w, len(olds)), jnp.split(kept, len(olds)), metrics


@jax.jit
def _gap(trainers, samplers, masks):
    return gap_metrics(jnp.concatenate(trainers), jnp.concatenate(samplers), jnp.concatenate(masks))


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
