"""GPU targets: an analytic estimate of each program's per-GPU memory (jax cannot compile for CUDA without a GPU),
and the updates' remat policy chosen to fit."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spatial_jax.models import ModelConfig, Qwen3VL
from spatial_jax.rl.config import TrainConfig, old_logp_forward
from spatial_jax.rl.optim import make_optimizer
from spatial_jax.rl.plan.measure import Program
from spatial_jax.rl.plan.shapes import (
    Shapes,
    _batch_placed,
    _local_bytes,
    _placed,
    _seq_batch,
    image_grid,
    model_config,
)
from spatial_jax.rl.plan.targets import GPUS_PER_HOST, Target
from spatial_jax.rl.plan.update import _rl_data, _sft_seq
from spatial_jax.rl.policy import trainable_filter
from spatial_jax.rollout.engine import Engine

# The updates' remat policies `choose_remat` tries, fastest first: "dots" keeps every matmul's output for the backward
# pass (only the elementwise ops are recomputed), "full" keeps a layer's input alone (the whole layer recomputed)
REMAT_CHOICES = ("dots", "full")


UPDATES = ("rl_update", "sft_update")


def _saved_per_token(mc: ModelConfig, policy: str, tensor: int) -> float:
    """Bytes one decoder layer keeps per token for the backward pass under a remat policy (compute dtype)."""
    t, b = mc.text, jnp.dtype(mc.dtype).itemsize
    heads = t.num_attention_heads * t.head_dim / tensor
    kv = 2 * t.num_key_value_heads * t.head_dim / max(1, min(tensor, t.num_key_value_heads))
    mlp = t.intermediate_size / tensor
    dots = heads + kv + t.hidden_size + 2 * mlp + t.hidden_size  # q, k, v, o, gate, up, down
    if policy == "full":
        return b * t.hidden_size
    if policy in ("dots", "dots_no_batch"):
        return b * (dots + t.hidden_size)
    return b * (dots + heads + 3 * mlp + 4 * t.hidden_size)  # every elementwise input too


def _layer_working_set(mc: ModelConfig, rows: float, tokens: int, keys: int, tensor: int) -> float:
    """One decoder layer's live temporaries (recomputed forward + backward) for `rows` rows: activations of every
    op, and float32 attention scores of one query chunk over `keys` keys (x3: scores, probabilities, their
    gradient)."""
    t = mc.text
    chunk = min(tokens, mc.attention_chunk or tokens)
    scores = 3 * 4 * rows * (t.num_attention_heads / tensor) * chunk * keys
    return 2 * rows * tokens * _saved_per_token(mc, "none", tensor) + scores


def _forward_working_set(mc: ModelConfig, rows: float, tokens: int, keys: int, tensor: int) -> float:
    """One decoder layer's live temporaries in a forward without backward: the residual stream, normed input and
    attention output, the MLP's gate, up and product, and float32 scores and probabilities of one query chunk."""
    t, b = mc.text, jnp.dtype(mc.dtype).itemsize
    chunk = min(tokens, mc.attention_chunk or tokens)
    per_token = 4 * t.hidden_size + 3 * t.intermediate_size / tensor
    return rows * tokens * per_token * b + 2 * 4 * rows * (t.num_attention_heads / tensor) * chunk * keys


def _vision_bytes(mc: ModelConfig, images: float, grid, trains: bool) -> float:
    """The vision tower's activations for `images` images: per block inputs kept (remat) when it trains, one
    block's working set (with the dense [P, P] scores of one image) otherwise too."""
    v, b = mc.vision, jnp.dtype(mc.dtype).itemsize
    p = int(np.prod(grid))
    block = images * p * (6 * v.hidden_size + 2 * v.intermediate_size) * b + 3 * 4 * images * v.num_heads * p * p
    return block + (images * p * v.hidden_size * b * v.depth if trains else 0)


def choose_remat(cfg: TrainConfig, target: Target) -> tuple[str, dict[str, int]]:
    """The first of REMAT_CHOICES under which every update's estimated peak fits the target's memory ("full" when
    none does), and each choice's largest update peak."""
    peaks = {}
    for policy in REMAT_CHOICES:
        peaks[policy] = max((p.peak for p in estimate_gpu(cfg, target, remat=policy) if p.name in UPDATES),
                            default=0)
    return next((p for p in REMAT_CHOICES if peaks[p] <= target.hbm_bytes), REMAT_CHOICES[-1]), peaks


def estimate_gpu(cfg: TrainConfig, target: Target, remat: str | None = None) -> list[Program]:
    """Per-GPU memory of each program from the layout (exact argument bytes of the sharded state on the recipe's
    mesh) and an activation model (remat policy: `remat`, else the recipe's; micro-batch, sequence lengths, KV
    cache). Labelled an estimate: jax cannot compile for a CUDA target on a machine without one."""
    mc = model_config(cfg)
    mesh = jax.sharding.AbstractMesh((cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor), ("data", "fsdp", "tensor"))
    model = nnx.eval_shape(lambda: Qwen3VL(mc, rngs=nnx.Rngs(0)))
    _, trainable, frozen = nnx.split(model, trainable_filter(cfg.policy), ...)
    trainable, frozen = _placed(trainable, mesh), _placed(frozen, mesh)
    weights = _local_bytes(trainable, mesh) + _local_bytes(frozen, mesh)
    grads = _local_bytes(trainable, mesh)
    shapes, rc, t = Shapes.of(cfg), cfg.rl, mc.text
    grid = image_grid(cfg, mc)
    shards, tensor = cfg.mesh.batch_shards, cfg.mesh.tensor
    b = jnp.dtype(mc.dtype).itemsize
    policy = remat or mc.decoder_remat
    out = []

    lora = cfg.policy.lora
    reference = grads if rc.loss.kl_coef > 0 and lora.rank == 0 and lora.vision_rank == 0 else 0

    def optimiser_bytes(accumulate: bool) -> int:
        tx = make_optimizer(dataclasses.replace(rc.optim, grad_accum_steps=2 if accumulate else 1))
        return _local_bytes(_placed(jax.eval_shape(tx.init, trainable), mesh), mesh)

    def update(name: str, rows: int, tokens: int, what: str, accumulate: bool, batch, resident: int) -> Program:
        args = weights + optimiser_bytes(accumulate) + _local_bytes(_batch_placed(batch, mesh, rows), mesh)
        local = rows / shards
        acts = t.num_hidden_layers * local * tokens * _saved_per_token(mc, policy, tensor)
        temp = (grads + acts + _layer_working_set(mc, local, tokens, tokens, tensor)
                + _vision_bytes(mc, local, grid, cfg.policy.train_vision))
        return Program(name, what, args, 0, 0, int(temp), int(args + temp + resident), 0.0, None, resident)

    if rc.steps > 0:
        R, T = shapes.micro_batch, shapes.prompt + shapes.completion
        what = f"{R} rollouts x ({shapes.prompt} + {shapes.completion}) tokens"
        data = _rl_data(_seq_batch(mc, R, shapes.prompt, shapes.completion, grid), R, shapes.completion, cfg)
        out.append(update("rl_update", R, T, what, shapes.mini_batch > R, data, reference))
        sampling_resident = optimiser_bytes(shapes.rollouts > R) + reference
        local = R / shards
        forward = (local * T * t.hidden_size * b + _forward_working_set(mc, local, T, T, tensor)
                   + _vision_bytes(mc, local, grid, False))
        if rc.loss.kl_coef > 0:
            resident = sampling_resident - reference
            out.append(Program("reference_forward", what, weights, 0, 0, int(forward),
                               int(weights + forward + resident), 0.0, None, resident))
        if old_logp_forward(cfg):
            out.append(Program("old_logp_forward", what, weights, 0, 0, int(forward),
                               int(weights + forward + sampling_resident), 0.0, None, sampling_resident))
        # rollouts run on each host's decoding copy (rollout/decode_copy.py), the trainer's state resident meanwhile
        hosts = -(-cfg.mesh.size // GPUS_PER_HOST)
        local = cfg.mesh.size // hosts
        if cfg.decode.devices:  # a rollout mesh of its own on the one host: the trainer's state is not there
            hosts, local = 1, cfg.decode.devices
        dec_tensor = cfg.decode.tensor or local
        dec_mesh = jax.sharding.AbstractMesh((local // dec_tensor, 1, dec_tensor), ("data", "fsdp", "tensor"))
        dec_dtype = cfg.decode.weights_dtype(mc.dtype)
        copy = _local_bytes(_placed(nnx.state(model), dec_mesh, float_dtype=dec_dtype), dec_mesh)
        resident = 0 if cfg.decode.devices else weights + sampling_resident
        sc, rows = rc.sampling, shapes.rollouts / hosts
        kv_shards = max(1, min(dec_tensor, t.num_key_value_heads))
        if sc.engine == "paged":  # the engine's pool of pages, whole on each device of the copy; `slots` at a time
            eng = Engine(model, sc, slots=sc.slots or int(rows), max_len=shapes.cache, page_size=sc.page_size,
                         pages=sc.pages, chunk=sc.chunk)
            B, cache, how = eng.slots, eng.kv_bytes / kv_shards, f"paged, {eng.slots} slots, {eng.pages} pages"
        else:  # the static sampler: every row's whole cache, rows over the copy's data axis
            B = rows / dec_mesh.axis_sizes[0]
            per_token = t.num_hidden_layers * 2 * t.num_key_value_heads * t.head_dim * b / kv_shards
            cache, how = B * shapes.cache * per_token, f"static, {int(rows)} rows"
        logits = B * t.vocab_size * 4
        prefill = (_forward_working_set(mc, B, shapes.prompt, shapes.cache, dec_tensor)
                   + _vision_bytes(mc, max(1.0, B / rc.group_size), grid, False))
        shape = f"{how} per host of {local}, up to {shapes.cache} tokens a row"
        out.append(Program("rollout_prefill", f"{shape}, prompts of {shapes.prompt}", int(copy + cache), int(cache),
                           int(cache), int(prefill + logits), int(copy + cache + prefill + logits + resident), 0.0,
                           None, resident))
        decode = 4 * logits + B * sc.max_new_tokens * 16
        out.append(Program("rollout_decode", shape, int(copy + cache), int(cache), int(cache), int(decode),
                           int(copy + cache + decode + resident), 0.0, None, resident))
    if cfg.sft.steps > 0:
        S = cfg.sft.batch_size
        out.append(update("sft_update", S, shapes.prompt, f"{S} rows x {shapes.prompt} tokens", False,
                          _sft_seq(mc, S, shapes.prompt, grid), 0))
    return out
