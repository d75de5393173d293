"""Jitted training steps: sequences -> final hidden states -> fused log-prob/entropy kernel -> loss -> update.

A `SeqBatch` is a prompt block [R, P] (left-padded) followed by a target block [R, N] (right-padded): the completion
in RL, the reference completion in SFT. Only the N target positions go through the LM head, via the fused kernel,
so [R * N, V] logits are never held. With `group` G > 1 (the G rollouts of a prompt, consecutive rows) each
prompt goes through the decoder once and its completions attend to its keys (Qwen3VL.shared_prefix_hidden).
Steps are pure functions of (trainable state, frozen state, optimiser state, batch) with the graph definition
static, so one compile serves every step of a shape.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from spatial_jax.kernels import linear_logprob_entropy
from spatial_jax.models import VisionInputs, disable_adapters, prepare_vision_inputs, rope_index
from spatial_jax.models.sharding import logical_to_spec
from spatial_jax.rl.losses import LossConfig, policy_loss, sft_loss


@flax.struct.dataclass
class SeqBatch:
    input_ids: jax.Array  # int32 [R, P + N]
    attention_mask: jax.Array  # int32 [R, P + N]
    positions: jax.Array  # int32 [3, R, P + N]
    vision: VisionInputs | None
    target_mask: jax.Array  # float32 [R, N]: tokens that carry loss
    prompt_len: int = flax.struct.field(pytree_node=False)
    group: int = flax.struct.field(pytree_node=False, default=1)


@flax.struct.dataclass
class RLData:
    seq: SeqBatch
    old_logp: jax.Array  # [R, N] at the sampling temperature
    ref_logp: jax.Array  # [R, N] (zeros when the KL term is off)
    advantages: jax.Array  # [R]
    normalizer: jax.Array  # scalar: the whole batch's loss denominator / micro-batches (losses.loss_denominator)
    is_weights: jax.Array | None = None  # [R, N] rollout-correction (TIS) weights; None: no correction
    # scalar, rl.old_logp = "trainer" only: 1 where this call's own forward (stop-gradient) is pi_old, on the first
    # pass without dropout: the same function at the same weights as the recomputed old_logp, whose separate
    # forward-only program XLA may round differently (1 ulp), so the first call's ratio is exactly 1
    own_old: jax.Array | None = None


def make_seq_batch(model_cfg, prompt_ids, prompt_mask, targets, target_mask, pixel_values, image_grid_thw,
                   loss_mask=None, row_group=None, row_image_counts=None, group: int = 1,
                   second_per_grid=None) -> SeqBatch:
    """Host arrays -> SeqBatch (positions from the model's M-RoPE index over the whole sequence). With `row_group`
    (rows with one id show the same images, given row by row: vision.prepare_vision_inputs) each group's images
    are encoded once in the step and their features shared by its rows. With `group` G > 1 every run of G rows
    shares its prompt (ids, mask and positions, checked here) and the step runs each prompt once; the targets
    then hold no image token. second_per_grid [items] beside image_grid_thw: each video item's seconds per temporal
    patch (models.rope_index)."""
    prompt_ids = np.asarray(prompt_ids, np.int32)
    targets = np.asarray(targets, np.int32)
    target_mask = np.asarray(target_mask, np.int32)
    ids = np.concatenate([prompt_ids, targets], axis=1)
    mask = np.concatenate([np.asarray(prompt_mask, np.int32), target_mask], axis=1)
    positions, _ = rope_index(model_cfg, ids, image_grid_thw, mask, second_per_grid)
    vision = None
    if pixel_values is not None:
        vision = prepare_vision_inputs(pixel_values, image_grid_thw, model_cfg.vision,
                                       buckets=model_cfg.vision_buckets, row_group=row_group,
                                       row_image_counts=row_image_counts)
    loss = target_mask if loss_mask is None else np.asarray(loss_mask, np.int32) * target_mask
    P = prompt_ids.shape[1]
    if group > 1:
        check_shared_prefix(model_cfg, ids, mask, np.asarray(positions), P, group)
    return SeqBatch(
        input_ids=jnp.asarray(ids), attention_mask=jnp.asarray(mask), positions=jnp.asarray(positions, jnp.int32),
        vision=vision, target_mask=jnp.asarray(loss, jnp.float32), prompt_len=P, group=group,
    )


def check_shared_prefix(model_cfg, ids, mask, positions, P: int, group: int) -> None:
    """ValueError unless the rows come in whole runs of `group` with one prompt each (ids, mask, positions) and no
    image token after the prompt (it would need features the shared forward writes into prompts only)."""
    R = ids.shape[0]
    if R % group:
        raise ValueError(f"{R} rows do not make whole groups of {group} for a shared-prefix step")
    for name, a in (("ids", ids[:, :P]), ("mask", mask[:, :P]), ("positions", positions[:, :, :P].swapaxes(0, 1))):
        g = a.reshape(R // group, group, *a.shape[1:])
        bad = np.flatnonzero(np.any((g != g[:, :1]).reshape(R // group, -1), axis=1))
        if bad.size:
            raise ValueError(f"rows {bad[0] * group}..{bad[0] * group + group - 1} differ in their prompt {name}: "
                             "a shared-prefix step needs each group's rows to share it")
    media = [t for t in (model_cfg.image_token_id, model_cfg.video_token_id) if t is not None]
    if media and np.isin(ids[:, P:], media).any():
        raise ValueError("a target holds an image token (a tool picture): a shared-prefix step takes images in "
                         "the prompt only")


def shard_batch(tree: Any, mesh) -> Any:
    """Places every array with a leading rollout axis across (data, fsdp), and the vision tower's frame slots
    [F, L, ...] and per-row feature offsets the same way (an axis that does not divide is dropped); the feature
    index and scalars are replicated."""

    def put(path, x):
        x = jnp.asarray(x)
        names = [getattr(p, "name", "") for p in path]
        if x.ndim == 0 or "feature_index" in names:
            spec = jax.sharding.PartitionSpec()
        elif "positions" in names:
            spec = logical_to_spec((None, "batch"), x.shape[:2], mesh)
        else:
            spec = logical_to_spec(("batch",), x.shape[:1], mesh)
        return jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(put, tree)


def target_logprobs(model, seq: SeqBatch, temperature: float, impl: str = "auto") -> tuple[jax.Array, jax.Array]:
    """(log pi(target) at `temperature`, full-vocabulary entropy at `temperature`), each [R, N], float32."""
    P, G = seq.prompt_len, seq.group
    # position t predicts token t + 1: the prompt's last position the first target, each target the next
    if G > 1:
        last, rest = model.shared_prefix_hidden(seq.input_ids, positions=seq.positions,
                                                attention_mask=seq.attention_mask, vision=seq.vision, prompt_len=P,
                                                group=G)
        hidden = jnp.concatenate([jnp.repeat(last, G, axis=0)[:, None], rest[:, :-1]], axis=1)
    else:
        hidden, _ = model(seq.input_ids, positions=seq.positions, attention_mask=seq.attention_mask,
                          vision=seq.vision, return_hidden=True)
        hidden = hidden[:, P - 1 : -1]
    R, N, D = hidden.shape
    h = hidden.reshape(-1, D)
    tgt = seq.input_ids[:, P:].reshape(-1)
    # the head in the compute dtype, as the forward's logits use it (a float32 master would make the matmul float32)
    lp, ent = linear_logprob_entropy(h, model.lm_head_weight().astype(h.dtype), tgt, impl=impl,
                                     temperature=temperature)
    return lp.reshape(R, N), ent.reshape(R, N)


@functools.partial(jax.jit, static_argnums=(0, 4))
def policy_logprobs(graphdef, trainable, frozen, seq: SeqBatch, temperature: float) -> jax.Array:
    """log pi_theta of the targets at `temperature` with the weights as they are, adapters on and no dropout: the
    trainer's pi_old (rl.old_logp = "trainer"), the same forward as the update's."""
    return target_logprobs(_merged(graphdef, trainable, frozen, None), seq, temperature)[0]


@functools.partial(jax.jit, static_argnums=(0, 4))
def reference_logprobs(graphdef, trainable, frozen, seq: SeqBatch, temperature: float) -> jax.Array:
    """log pi_ref with adapters switched off: with LoRA the frozen base (no second copy); without adapters the caller
    passes the weights the RL stage started from as `trainable`."""
    model = nnx.merge(graphdef, trainable, frozen)
    with disable_adapters(model):
        return target_logprobs(model, seq, temperature)[0]


def _merged(graphdef, trainable, frozen, rng):
    """The model for a training forward. The frozen variables are re-created in this trace, since lifted transforms
    (remat) and dropout write to them; `rng` (None: no adapter dropout) keys dropout for this step alone, so the
    sampler and the KL reference stay deterministic and a resumed run draws the same masks."""
    keys = iter(range(1 << 30))

    def fresh(v):
        if rng is not None and isinstance(v, nnx.RngKey):
            return v.replace(jax.random.fold_in(rng, next(keys)))
        return v.replace(v.get_value())

    frozen = jax.tree.map(fresh, frozen, is_leaf=lambda x: isinstance(x, nnx.Variable))
    model = nnx.merge(graphdef, trainable, frozen)
    return model if rng is None else nnx.view(model, deterministic=False, raise_if_not_found=False)


def rl_loss(trainable, graphdef, frozen, data: RLData, cfg: LossConfig, temperature: float, rng):
    model = _merged(graphdef, trainable, frozen, rng)
    logp, ent = target_logprobs(model, data.seq, temperature)
    ref = data.ref_logp if cfg.kl_coef > 0 else None
    old = data.old_logp
    if data.own_old is not None:
        old = jnp.where(data.own_old > 0, jax.lax.stop_gradient(logp), old)
    loss, metrics = policy_loss(logp, old, data.advantages, data.seq.target_mask, cfg, ref_logp=ref,
                                entropy=ent, normalizer=data.normalizer, is_weights=data.is_weights)
    return loss, (metrics, jax.lax.stop_gradient(logp))


@functools.partial(jax.jit, static_argnums=(0, 5, 6, 7), donate_argnums=(1, 3))
def rl_update(graphdef, trainable, frozen, opt_state, data: RLData, cfg: LossConfig, temperature: float,
              tx: optax.GradientTransformation, rng):
    """One optimiser call on one micro-batch; returns (trainable, opt_state, loss, metrics, logp): logp [R, N] the
    trainer's log-probs of this call's forward, before the update (the sampler-trainer gap is measured on them)."""
    (loss, (metrics, logp)), grads = jax.value_and_grad(rl_loss, has_aux=True)(
        trainable, graphdef, frozen, data, cfg, temperature, rng
    )
    updates, opt_state = tx.update(grads, opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
    return trainable, opt_state, loss, metrics, logp


def sft_objective(trainable, graphdef, frozen, seq: SeqBatch, rng):
    model = _merged(graphdef, trainable, frozen, rng)
    logp, _ = target_logprobs(model, seq, 1.0)
    return sft_loss(logp, seq.target_mask)


@functools.partial(jax.jit, static_argnums=(0, 4), donate_argnums=(1, 3))
def sft_update(graphdef, trainable, frozen, opt_state, tx: optax.GradientTransformation, seq: SeqBatch, rng):
    (loss, metrics), grads = jax.value_and_grad(sft_objective, has_aux=True)(trainable, graphdef, frozen, seq, rng)
    updates, opt_state = tx.update(grads, opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    return trainable, opt_state, loss, dict(metrics, grad_norm=optax.tree.norm(grads))
