"""The learner: a step's scored groups to optimiser updates, and the SFT stage's steps.

It owns what happens between the scores and the new weights: the group advantages (eq. 2), the micro-batches of
the update (shared prompts, masks for overlong filtering and dynamic sampling's padding), where pi_old comes from
(the sampler's log-probs, or the trainer's own forward: rl.old_logp), verl's rollout correction, the KL reference's
log-probs, the optimiser calls and the gap metrics between sampler and trainer. The weights are the workspace's
(rl/workspace.py): the learner reads them and writes each update back there, so a restore or the decoding copy sees
them as the driver does.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spatial_jax.data.pipeline import Batch
from spatial_jax.rewards.advantages import group_advantages
from spatial_jax.rl import report
from spatial_jax.rl import step as st
from spatial_jax.rl.async_rollouts import Rolled
from spatial_jax.rl.config import TrainConfig, old_logp_forward
from spatial_jax.rl.losses import loss_denominator
from spatial_jax.rl.rollout_correction import CorrectionConfig, gap_metrics, rollout_correction
from spatial_jax.rl.workspace import WorkspacePart, rl_batches
from spatial_jax.rollout.completions import Completions


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


class Learner(WorkspacePart):
    """Scored groups -> updates of the workspace's trainable weights (SFT batches -> SFT updates)."""

    def sft_step(self, step: int, batch: Batch, tx, opt_state) -> tuple[dict[str, Any], Any]:
        t0 = time.perf_counter()
        seq = st.shard_batch(full_seq_batch(self.ws.policy.model.cfg, self.hosts.gather(batch)), self.ws.mesh)
        self.ws.trainable, opt_state, loss, metrics = st.sft_update(
            self.ws.graphdef, self.ws.trainable, self.ws.frozen, opt_state, tx, seq, _dropout_rng(self.cfg, 0, step)
        )
        loss = float(loss)  # waits for the step, so the throughput below is real
        return {"loss": loss, "grad_norm": float(metrics["grad_norm"]),
                "tokens_per_s": float(metrics["num_tokens"]) / max(time.perf_counter() - t0, 1e-9)}, opt_state

    def learn(self, rolled: Rolled, tx, n_micro: int, opt_state, sampling,
              behaviour: Any = None) -> tuple[dict[str, Any], Any]:
        """Advantages of a step's rollouts -> updates_per_batch passes of an update per mini-batch, each of n_micro
        accumulated micro-batches. `behaviour`: as in update()."""
        G = self.cfg.rl.group_size
        comps, scores = rolled.completions, rolled.scores
        rewards = np.asarray([s["reward"] for s in scores], np.float32).reshape(-1, G)
        eq2 = self.ws.reward_cfg.advantage
        adv = np.asarray(group_advantages(jnp.asarray(rewards), eq2.eps, eq2.std)).reshape(-1)
        t1 = time.perf_counter()
        opt_state, trained_out = self.update(rolled.step, comps, adv, tx, n_micro, opt_state,
                                             sampling.temperature or 1.0, rolled.trained,
                                             behaviour)
        t_train = time.perf_counter() - t1
        out: dict[str, Any] = dict(rolled.metrics)
        out.update(trained_out)
        out.update(report.rollout_metrics(self.ws.method, scores, rewards, adv, comps))
        out["rollout/lag"] = float(rolled.step - rolled.version)
        out["rollout_tokens_per_s"] = rolled.tokens / max(rolled.seconds, 1e-9)
        out["train_tokens_per_s"] = out.pop("train_tokens") / max(t_train, 1e-9)
        out["time/rollout_s"] = rolled.seconds
        out["time/update_s"] = t_train  # the whole update, the trainer's pi_old forward (time/old_logp_s) included
        return out, opt_state

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
            stopped = np.any((comps.tokens == self.ws.tok.im_end_id) & (mask > 0), axis=1)
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
                self.ws.policy.model.cfg, comps.prompt_ids[rows], comps.prompt_mask[rows], comps.tokens[rows],
                context[rows], comps.pixel_values[patches[items[rows.start]] : patches[items[rows.stop]]],
                comps.image_grid_thw[items[rows.start] : items[rows.stop]],
                loss_mask=mask[rows],
                row_group=np.arange(rows.start, rows.stop) // G if share else None,
                row_image_counts=comps.image_counts[rows] if share else None, group=group,
                second_per_grid=None if comps.second_per_grid is None
                else comps.second_per_grid[items[rows.start] : items[rows.stop]],
            )
            seqs.append(st.shard_batch(seq, self.ws.mesh))
            samplers.append(st.shard_batch(jnp.asarray(comps.logprobs[rows], jnp.float32), self.ws.mesh))
        loss_masks = [seq.target_mask for seq in seqs]
        out: dict[str, Any] = {}
        olds, weights = samplers, [None] * len(seqs)
        forward = old_logp_forward(cfg)
        if forward:
            t0 = time.perf_counter()
            olds = jax.block_until_ready(self.logprobs(self.ws.trainable, seqs, temperature))
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
                ref_weights = self.ws.trainable if self.ws.reference is None else self.ws.reference
                ref = st.reference_logprobs(self.ws.graphdef, ref_weights, self.ws.frozen, seq, temperature)
            else:
                ref = jnp.zeros(seq.target_mask.shape, jnp.float32)
            datas.append(st.RLData(seq=seq, old_logp=olds[m], ref_logp=st.shard_batch(ref, self.ws.mesh),
                                   advantages=st.shard_batch(jnp.asarray(adv[rows], jnp.float32), self.ws.mesh),
                                   normalizer=normalizer, is_weights=weights[m]))
        losses, loss_metrics, first = [], [], []
        calls = rc.updates_per_batch * len(datas)
        for epoch in range(rc.updates_per_batch):
            for m, data in enumerate(datas):
                rng = _dropout_rng(cfg, 1, step * calls + epoch * len(datas) + m)
                if rc.old_logp == "trainer":
                    # the first update's own forward runs at the step's starting weights: pi_old, ratio exactly 1
                    data = data.replace(own_old=jnp.float32(epoch == 0 and m < n_micro and rng is None))
                self.ws.trainable, opt_state, loss, lm, logp = st.rl_update(
                    self.ws.graphdef, self.ws.trainable, self.ws.frozen, opt_state, data, rc.loss, temperature, tx, rng
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
            then = self.logprobs(behaviour, seqs[:n], temperature)
            out.update({f"gap/numeric/{k}": float(v) for k, v in _gap(then, samplers[:n], loss_masks[:n]).items()})
            out.update({f"gap/staleness/{k}": float(v) for k, v in _gap(start[:n], then, loss_masks[:n]).items()})
        out["train_tokens"] = float(mask.sum()) * rc.updates_per_batch
        return opt_state, out

    def logprobs(self, weights: Any, seqs: list[st.SeqBatch], temperature: float) -> list[jax.Array]:
        """The trainer's log-probs of each micro-batch's targets under `weights` (no dropout)."""
        return [st.policy_logprobs(self.ws.graphdef, weights, self.ws.frozen, seq, temperature) for seq in seqs]


@functools.partial(jax.jit, static_argnums=3)
def _corrected(olds, samplers, masks, cfg: CorrectionConfig):
    """rollout_correction over the whole batch (its metrics are the batch's), split back into micro-batches."""
    w, kept, metrics = rollout_correction(jnp.concatenate(olds), jnp.concatenate(samplers), jnp.concatenate(masks),
                                          cfg)
    return jnp.split(w, len(olds)), jnp.split(kept, len(olds)), metrics


@jax.jit
def _gap(trainers, samplers, masks):
    return gap_metrics(jnp.concatenate(trainers), jnp.concatenate(samplers), jnp.concatenate(masks))


