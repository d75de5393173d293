"""The experience producer: a step's prompts to scored groups.

It owns the rollouts: the decoding copy of the policy (refreshed when the weights changed), G sampled completions
per prompt with the method's blank or tool rollouts, their scores and overlong penalties, dynamic sampling's further
rounds until the batch is full of informative groups, and one-step-off rollouts sampled in a thread while the
learner updates (rl/async_rollouts.py), saved beside each checkpoint and taken back on resume.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spatial_jax.data.pipeline import Batch, DataIterator
from spatial_jax.rewards.overlong import overlong_penalties
from spatial_jax.rl.async_rollouts import Rolled, RolloutsAhead
from spatial_jax.rl.config import TrainConfig, overlong_max_length
from spatial_jax.rl.dynamic_sampling import fill
from spatial_jax.rl.workspace import Workspace, WorkspacePart
from spatial_jax.rollout.collect import Collected, ToolSettings, collect
from spatial_jax.rollout.completions import Completions, take_rows
from spatial_jax.rollout.decode_copy import DecodeCopy
from spatial_jax.rollout.hosts import HostShare


def _seed(cfg: TrainConfig, stage: int, step: int) -> int:
    return int(jax.random.randint(jax.random.fold_in(jax.random.key(cfg.seed), stage * 1_000_003 + step), (),
                                  0, 2**31 - 1))


class Experience(WorkspacePart):
    """Prompts -> scored groups, sampled from the decoding copy of the workspace's weights."""

    def __init__(self, ws: Workspace, hosts: HostShare):
        super().__init__(ws, hosts)
        self._decoder: DecodeCopy | None = None
        self._decoded_from = None  # the trainable state the decoding copy was made from
        # the running stage's batches: a step that samples more prompts (dynamic sampling) reads them here, so the
        # checkpointed data state counts them
        self.batches: DataIterator | None = None
        self.ahead = RolloutsAhead(ws.run_dir / "rl" / "pending")  # rl.rollout_mode = "one_step_off"
        # one_step_off with old_logp = trainer: by step, a copy of the trainable weights its rollouts are sampled
        # from (one copy of the trainable state more), for the gap's split into numerics and staleness
        self.behaviour: dict[int, Any] = {}

    def take_back(self, record: dict[str, Any], it: DataIterator) -> None:
        """The rollouts a one_step_off checkpoint was saved with; where they are lost, the data position goes back
        to before their prompts, which the step then rolls out from the restored weights."""
        why = self.ahead.load(record)
        if why is not None:
            # record["step"] counts from 0; the metrics and the checkpoints number a step by the steps done after it
            self.ws.warn(f"{why}: step {record['step'] + 1}'s rollouts are sampled again from the restored weights, "
                         "so that step is on-policy where the interrupted run's was one step stale")
            it.set_state(record["data_before"])

    def roll_ahead(self, step: int, sampling) -> None:
        """Starts sampling step `step`'s rollouts in the worker thread from the weights as they are now."""
        if step >= self.cfg.rl.steps:
            return
        before = self.batches.get_state()
        batch = next(self.batches)
        decoder = self.decoder()  # the copy is made here, before the update may donate the weights it reads
        version = step - self.cfg.rl.rollout_lag
        if self.cfg.rl.old_logp == "trainer" and self.cfg.rl.rollout_lag == 1:
            self.behaviour[step] = jax.tree.map(jnp.copy, self.ws.trainable)
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
            comps = take_rows([(c, rows) for (c, _), rows in picks], self.ws.tok.pad_id)
            scores = [sc[i] for (_, sc), rows in picks for i in rows]
            trained = np.repeat(selection.trained, G)
            sampled = [s for _, sc in rounds for s in sc]
            out.update(selection.metrics())
            out["dynamic/reward_mean_sampled"] = float(np.mean([s["reward"] for s in sampled]))
            out["dynamic/accuracy_sampled"] = float(np.mean([s[self.ws.method.accuracy_key] for s in sampled]))
        else:
            sample_round(0)
            (comps, scores), trained = rounds[0], None
        for row, name in enumerate(("prompts_read", "rows_decoded", "rollouts_scored")):
            out[f"host/{name}_min"], out[f"host/{name}_max"] = int(counts[row].min()), int(counts[row].max())
        return Rolled(step, version, comps, scores, trained, out, time.perf_counter() - t0,
                      sum(float(c.mask.sum()) for c, _ in rounds))

    def decoder(self) -> DecodeCopy:
        """The decoding copy of the policy as it is now: made on first use, and again whenever the trainable weights
        changed since (an update, a restore)."""
        if self._decoder is None:
            self._decoder = DecodeCopy(self.ws.model, self.cfg.decode, self.ws.mesh)
        elif self._decoded_from is not self.ws.trainable:
            self._decoder.refresh(self.ws.model)
        self._decoded_from = self.ws.trainable
        return self._decoder

    def collect(self, step: int, batch: Batch, sampling, round_: int = 0,
                decoder: DecodeCopy | None = None) -> Collected:
        """G sampled completions per prompt (and the method's blank or tool rollouts) of this process's prompts,
        decoded from `decoder` (default: the decoding copy of the weights as they are now) and scored; each sampling
        round of a step (dynamic sampling) draws its own random streams."""
        cfg, rc = self.cfg, self.cfg.rl
        return collect(decoder or self.decoder(), batch, self.ws.tok, self.ws.method, self.ws.reward_cfg, sampling,
                       rc.group_size, _seed(cfg, 1 + 2 * round_, step), blank_seed=_seed(cfg, 2 + 2 * round_, step),
                       step=step, tools=ToolSettings(rc.max_tool_turns, rc.max_tool_tokens), blank_fill=rc.blank_fill,
                       image_cfg=self.ws.policy.image_cfg, hosts=self.hosts)
