"""The training job: optional SFT cold start, evaluation, GRPO/GSPO with the method's reward, evaluation, summary.

Every stage checkpoints with orbax into the run directory and resumes from its last checkpoint when the same
command runs again; randomness is a function of (seed, step), so a resumed run ends where an uninterrupted one does.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spatial_jax.config import from_dict, to_dict
from spatial_jax.data.pipeline import Batch, blank_batch, eval_iterator, train_iterator
from spatial_jax.eval.evaluate import ACCURACY_KEY, evaluate
from spatial_jax.rewards.advantages import group_advantages
from spatial_jax.rewards.registry import get_method
from spatial_jax.rl import rollouts as ro
from spatial_jax.rl import step as st
from spatial_jax.rl.checkpoint import Checkpointer
from spatial_jax.rl.config import TrainConfig, validate
from spatial_jax.rl.distributed import is_primary
from spatial_jax.rl.losses import loss_denominator
from spatial_jax.rl.metrics import MetricsWriter, ProgressBar, plot_curves
from spatial_jax.rl.multiturn import sample_multiturn
from spatial_jax.rl.optim import lr_schedule, make_optimizer
from spatial_jax.rl.policy import Policy, build_mesh, build_policy


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
                             loss_mask=batch.loss_mask[:, 1:])


class Job:
    """One run directory's training job; `run()` does every configured stage, resuming where it stopped."""

    def __init__(self, cfg: TrainConfig, record_config: bool = True):
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
        self.method = get_method(cfg.method)
        self.reward_cfg = cfg.reward_config()
        self.tok = self.policy.tokenizer
        self.reference = None  # KL reference weights when there are no adapters to switch off (set by the RL stage)

    @property
    def model(self):
        return nnx.merge(self.graphdef, self.trainable, self.frozen)

    def log(self, text: str) -> None:
        if self.cfg.progress and self.primary:
            print(text, flush=True)

    # ---- stages -------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        results: dict[str, Any] = {"run_dir": str(self.run_dir), "method": cfg.method}
        with jax.set_mesh(self.mesh):
            if cfg.sft.steps > 0:
                self.sft()
                if cfg.eval.after_sft:
                    results["after_sft"] = self.evaluate("sft")
            if cfg.rl.steps > 0:
                self.rl()
                if cfg.eval.after_rl:
                    results["after_rl"] = self.evaluate("rl")
        if not self.primary:
            return results
        (self.run_dir / "summary.json").write_text(json.dumps(results, indent=2))
        curves = self.plot()
        if curves:
            results["curves_png"] = curves
        self.print_summary(results)
        return results

    def _state(self, opt_state) -> dict[str, Any]:
        """What a checkpoint holds: trainable weights, optimiser state and, when it is a copy, the KL reference."""
        state = {"params": self.trainable, "opt": opt_state}
        if self.reference is not None:
            state["ref"] = self.reference
        return state

    def _start_reference(self, stage: str, cfg: TrainConfig | None = None) -> None:
        """Full fine-tuning with a KL term: pi_ref is the policy the RL stage starts from, kept as a copy (and
        checkpointed, so a resumed run keeps the same reference)."""
        cfg = cfg or self.cfg
        lora = cfg.policy.lora
        if stage == "rl" and cfg.rl.loss.kl_coef > 0 and lora.rank == 0 and lora.vision_rank == 0:
            self.reference = jax.tree.map(jnp.copy, self.trainable)

    def _restore(self, ck: Checkpointer, opt_state, iterator) -> tuple[int, Any, bool]:
        step = ck.latest_step()
        if step is None:
            return 0, opt_state, False
        state, meta = ck.restore(self._state(opt_state), step)
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
        for stage in ("rl", "sft"):
            ck = Checkpointer(self.run_dir / stage, async_save=False)
            if ck.latest_step() is not None:
                saved = ck.read_meta().get("config")
                trained = from_dict(TrainConfig, saved) if saved is not None else self.cfg
                self._start_reference(stage, trained)
                self._restore(ck, make_optimizer(self.optim_config(stage, trained)).init(self.trainable), None)
                ck.close()
                return stage
            ck.close()
        return None

    def stage(self, name: str, steps: int, batch_size: int, checkpoint_every: int, keys: tuple[str, ...],
              step_fn: Callable[[int, Batch, Any, Any], tuple[dict[str, Any], Any]]) -> None:
        """Runs `steps` steps of a stage, resuming from its checkpoints; `step_fn(step, batch, tx, opt_state)` ->
        (metrics, opt_state) does the work. A finished stage only hands its weights on."""
        cfg = self.cfg
        optim = self.optim_config(name)
        tx = make_optimizer(optim)
        schedule = lr_schedule(optim)
        updates = self.cfg.rl.updates_per_batch if name == "rl" else 1
        ck = Checkpointer(self.run_dir / name, max_to_keep=2, save_interval=checkpoint_every)
        self._start_reference(name)
        if ck.latest_step() == steps:
            self._restore(ck, tx.init(self.trainable), None)
            ck.close()
            return
        it = train_iterator(cfg.data, self.tok, cfg.method, batch_size, mode=name, image_cfg=self.policy.image_cfg)
        start, opt_state, resumed = self._restore(ck, tx.init(self.trainable), it)
        writer = MetricsWriter(self.run_dir / name, resume_step=start if resumed else None, tensorboard=cfg.tensorboard,
                               active=self.primary)
        bar = ProgressBar(steps, initial=start, keys=keys, desc=name, disable=not (cfg.progress and self.primary))
        saved_config = to_dict(cfg)  # goes with the weights: `eval` rebuilds the optimiser state and reference from it
        for step in range(start, steps):
            metrics, opt_state = step_fn(step, next(it), tx, opt_state)
            metrics["lr"] = float(schedule(step * updates))
            bar.update(writer.log(step + 1, metrics))
            ck.save(step + 1, self._state(opt_state), {"step": step + 1, "data": it.get_state(),
                                                       "config": saved_config}, force=step + 1 == steps)
        bar.close()
        writer.close()
        ck.close()

    def sft(self) -> None:
        sc = self.cfg.sft
        self.stage("sft", sc.steps, sc.batch_size, sc.checkpoint_every, ("loss", "lr"), self.sft_step)

    def sft_step(self, step: int, batch: Batch, tx, opt_state) -> tuple[dict[str, Any], Any]:
        t0 = time.perf_counter()
        seq = st.shard_batch(full_seq_batch(self.policy.model.cfg, batch), self.mesh)
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
                   lambda step, batch, tx, opt_state: self.rl_step(step, batch, sampling, tx, n_micro, opt_state))

    def rl_step(self, step: int, batch: Batch, sampling, tx, n_micro: int, opt_state) -> tuple[dict[str, Any], Any]:
        """Rollouts -> rewards -> advantages -> updates_per_batch passes of n_micro micro-batches."""
        t0 = time.perf_counter()
        comps, scores = self.collect(step, batch, sampling)
        t_rollout = time.perf_counter() - t0
        G = self.cfg.rl.group_size
        rewards = np.asarray([s["reward"] for s in scores], np.float32).reshape(-1, G)
        adv = np.asarray(group_advantages(jnp.asarray(rewards), getattr(self.reward_cfg, "adv_eps", 1e-4),
                                          getattr(self.reward_cfg, "adv_std", "population"))).reshape(-1)
        t1 = time.perf_counter()
        opt_state, out = self.update(step, comps, adv, tx, n_micro, opt_state, sampling.temperature or 1.0)
        t_train = time.perf_counter() - t1
        out.update(self.rollout_metrics(scores, rewards, adv, comps))
        out["rollout_tokens_per_s"] = float(comps.mask.sum()) / max(t_rollout, 1e-9)
        out["train_tokens_per_s"] = out.pop("train_tokens") / max(t_train, 1e-9)
        return out, opt_state

    def collect(self, step: int, batch: Batch, sampling) -> tuple[ro.Completions, list[dict[str, float]]]:
        """G sampled completions per prompt (ProSR: plus one blank-image rollout per prompt), scored."""
        cfg, rc = self.cfg, self.cfg.rl
        model = self.model
        if cfg.method == "allospatial" and rc.max_tool_turns > 0:
            comps = sample_multiturn(model, batch, self.tok, sampling, rc.group_size, _seed(cfg, 1, step),
                                     max_turns=rc.max_tool_turns, max_tool_tokens=rc.max_tool_tokens)
        else:
            comps = ro.sample(model, batch, self.tok, sampling, rc.group_size, _seed(cfg, 1, step))
        blank = None
        if cfg.method == "prosr":  # one blank-image rollout per prompt, paired with its whole group (ProSR eq. 8)
            blank = ro.sample(model, blank_batch(batch, rc.blank_fill, self.policy.image_cfg), self.tok, sampling, 1,
                              _seed(cfg, 2, step))
        rollouts = ro.to_rollouts(batch, comps, rc.group_size, step, blank)
        return comps, self.method.score_batch(rollouts, self.reward_cfg)

    def update(self, step: int, comps: ro.Completions, adv: np.ndarray, tx, n_micro: int, opt_state,
               temperature: float) -> tuple[Any, dict[str, Any]]:
        """updates_per_batch passes over the rollouts in n_micro accumulated micro-batches (completion tokens only
        carry loss; prompts are masked, and so are rollouts that never stopped under overlong filtering)."""
        cfg, rc = self.cfg, self.cfg.rl
        mask = comps.mask
        if rc.overlong_filter:
            stopped = np.any((comps.tokens == self.tok.im_end_id) & (mask > 0), axis=1)
            mask = mask * stopped[:, None].astype(mask.dtype)
        context = getattr(comps, "context_mask", comps.mask)  # tool output is attended to, never trained on
        # each micro-batch divides by the whole batch's denominator, so accumulation equals one full-batch step
        normalizer = loss_denominator(jnp.asarray(mask), rc.loss.aggregation) / n_micro
        micro = len(adv) // n_micro
        starts = np.concatenate([[0], np.cumsum(np.prod(comps.image_grid_thw, axis=-1))])
        datas = []
        for m in range(n_micro):
            rows = slice(m * micro, (m + 1) * micro)
            seq = st.make_seq_batch(
                self.policy.model.cfg, comps.prompt_ids[rows], comps.prompt_mask[rows], comps.tokens[rows],
                context[rows], comps.pixel_values[starts[rows.start] : starts[rows.stop]], comps.image_grid_thw[rows],
                loss_mask=mask[rows],
            )
            seq = st.shard_batch(seq, self.mesh)
            if rc.loss.kl_coef > 0:
                ref_weights = self.trainable if self.reference is None else self.reference
                ref = st.reference_logprobs(self.graphdef, ref_weights, self.frozen, seq, temperature)
            else:
                ref = jnp.zeros(seq.target_mask.shape, jnp.float32)
            datas.append(st.RLData(seq=seq, old_logp=st.shard_batch(jnp.asarray(comps.logprobs[rows]), self.mesh),
                                   ref_logp=st.shard_batch(ref, self.mesh),
                                   advantages=st.shard_batch(jnp.asarray(adv[rows], jnp.float32), self.mesh),
                                   normalizer=normalizer))
        losses, loss_metrics = [], []
        for epoch in range(rc.updates_per_batch):
            for m, data in enumerate(datas):
                rng = _dropout_rng(cfg, 1, (step * rc.updates_per_batch + epoch) * n_micro + m)
                self.trainable, opt_state, loss, lm = st.rl_update(
                    self.graphdef, self.trainable, self.frozen, opt_state, data, rc.loss, temperature, tx, rng
                )
                losses.append(float(loss))
                loss_metrics.append({k: float(v) for k, v in lm.items()})
        out: dict[str, Any] = {"loss": float(np.mean(losses))}
        for k in loss_metrics[0]:
            out[f"loss/{k}"] = float(np.mean([lm[k] for lm in loss_metrics]))
        out["train_tokens"] = float(mask.sum()) * rc.updates_per_batch
        return opt_state, out

    def rollout_metrics(self, scores, rewards: np.ndarray, adv: np.ndarray, comps: ro.Completions) -> dict[str, Any]:
        out: dict[str, Any] = {"reward_mean": float(rewards.mean()), "reward_std": float(rewards.std())}
        for k in scores[0]:
            out[f"reward/{k}"] = float(np.mean([s[k] for s in scores]))
        out["accuracy"] = out[f"reward/{ACCURACY_KEY[self.cfg.method]}"]
        with_h = [s["mean_H"] for s in scores if s.get("n_with_H", 0) > 0]
        out["mean_H"] = float(np.mean(with_h)) if with_h else None
        matched = [s["mean_matched_iou"] for s in scores if s.get("n_matched", 0) > 0]
        out["mean_matched_iou"] = float(np.mean(matched)) if matched else None
        out["adv_mean"], out["adv_std"] = float(adv.mean()), float(adv.std())
        out["adv_abs_max"] = float(np.abs(adv).max())
        out["completion_len"] = float(comps.mask.sum(1).mean())
        out["entropy_mean"] = float((comps.entropies * comps.mask).sum() / max(comps.mask.sum(), 1))
        if hasattr(comps, "num_tool_calls"):
            out["tool_calls_mean"] = float(np.mean(comps.num_tool_calls))
        return out

    def evaluate(self, stage: str) -> dict[str, Any]:
        """Held-out evaluation after `stage`; cached in the run directory so a resumed job does not redo it."""
        cfg = self.cfg
        path = self.run_dir / f"eval_{stage}.json"
        # reused only for the same weights (stage length) and the same evaluation
        key = {"steps": cfg.sft.steps if stage == "sft" else cfg.rl.steps, "data": cfg.data.eval,
               "eval": to_dict(cfg.eval), "method": cfg.method,
               "blank_fill": cfg.rl.blank_fill if cfg.method == "prosr" else None}
        if path.exists():
            cached = json.loads(path.read_text())
            if cached.get("key") == key:
                return cached["summary"]
        it = eval_iterator(cfg.data, self.tok, cfg.method, cfg.eval.batch_size, image_cfg=self.policy.image_cfg)
        bar = ProgressBar(cfg.eval.max_samples or None, keys=(), desc=f"eval after {stage}",
                          disable=not (cfg.progress and self.primary))
        summary, rows = evaluate(self.model, self.tok, it, cfg.method, self.reward_cfg, cfg.eval.max_new_tokens,
                                 cfg.eval.max_samples, progress=lambda n: bar.update({}, n),
                                 max_tool_turns=cfg.rl.max_tool_turns, max_tool_tokens=cfg.rl.max_tool_tokens,
                                 blank_fill=cfg.rl.blank_fill, image_cfg=self.policy.image_cfg)
        bar.close()
        if self.primary:
            path.write_text(json.dumps({"key": key, "summary": summary, "rows": rows}, indent=1))
        return summary

    def plot(self) -> str | None:
        out = None
        metrics = self.run_dir / "rl" / "metrics.jsonl"
        if metrics.exists():
            out = str(self.run_dir / "curves.png")
            plot_curves(metrics, out, ["reward_mean", "accuracy", "mean_H", "mean_matched_iou", "loss", "reward/format"],
                        smooth=5)
        sft = self.run_dir / "sft" / "metrics.jsonl"
        if sft.exists():
            plot_curves(sft, self.run_dir / "sft_curves.png", ["loss"], smooth=5)
            out = out or str(self.run_dir / "sft_curves.png")
        return out

    def print_summary(self, results: dict[str, Any]) -> None:
        lines = [f"run: {results['run_dir']}  method: {results['method']}"]
        for stage in ("after_sft", "after_rl"):
            s = results.get(stage)
            if not s:
                continue
            parts = []
            for key in ("accuracy", "mean_matched_iou", "mean_H", "reward", "well_formed"):
                if key in s and s[key]["n"] > 0:
                    e = s[key]
                    parts.append(f"{key} {e['mean']:.3f} ± {e['sem']:.3f} (n={e['n']})")
            lines.append(f"{stage}: " + "; ".join(parts))
        if results.get("curves_png"):
            lines.append(f"curves: {results['curves_png']}")
        print("\n".join(lines), flush=True)


def train(cfg: TrainConfig) -> dict[str, Any]:
    return Job(cfg).run()
