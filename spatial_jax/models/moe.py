"""Sparse mixture-of-experts MLP (Qwen3-VL-MoE): a softmax router picks each token's top-k experts, whose SwiGLU
outputs are summed with the renormalised top-k probabilities as weights (HF Qwen3VLMoeTextSparseMoeBlock).

Every token reaches all of its k experts (no capacity, nothing dropped): the N * k (token, expert) pairs are sorted
by expert and each expert's contiguous run goes through its weights in one grouped matmul, `jax.lax.ragged_dot`
(megablox-style on TPU, a loop of dots elsewhere), so the work is N * k rows, not N * E. `dense_moe` is the same
layer as a loop over every expert on every token, the benchmark's baseline (benchmarks/training/moe.py).

Expert weights are stacked [E, in, out] with a leading logical "expert" axis (models.sharding.RULES maps it to the
mesh), in the released checkpoints' layout: gate_up [E, D, 2I] (gate columns first), down [E, I, D].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from spatial_jax.models.config import ModelConfig
from spatial_jax.models.layers import random_normal, random_uniform
from spatial_jax.models.lora import LoRALinear, LoRAParam
from spatial_jax.models.sharding import constrain


class ExpertLinear(LoRALinear):
    """E stacked linear maps [E, in, out] applied to rows grouped by expert, each with its own LoRA adapter
    (A [E, in, r], B [E, r, out]; B = 0 at the start) when rank > 0. A LoRALinear, so merging, disabling and
    resetting adapters treat it like any other projection."""

    def __init__(self, num_experts: int, in_features: int, out_features: int, *, axes: tuple[str, str, str],
                 rank: int = 0, alpha: float = 1.0, dropout: float = 0.0, dtype: str = "float32",
                 param_dtype: str = "float32", rngs: nnx.Rngs):
        pdt = jnp.dtype(param_dtype)
        self.in_features = in_features
        self.out_features = out_features
        self.dtype = dtype
        self.kernel = nnx.Param(random_normal(rngs.params(), (num_experts, in_features, out_features),
                                              in_features**-0.5, pdt), out_sharding=axes, eager_sharding=False)
        self.bias = None
        self.rank = rank
        self.scaling = alpha / rank if rank > 0 else 0.0
        self.adapters_enabled = True
        if rank > 0:
            self.lora_a = LoRAParam(random_uniform(rngs.params(), (num_experts, in_features, rank),
                                                   in_features**-0.5, pdt),
                                    out_sharding=(axes[0], axes[1], "lora_rank"), eager_sharding=False)
            self.lora_b = LoRAParam(jnp.zeros((num_experts, rank, out_features), pdt),
                                    out_sharding=(axes[0], "lora_rank", axes[2]), eager_sharding=False)
            self.lora_dropout = nnx.Dropout(dropout, deterministic=True, rngs=rngs)
        else:
            self.lora_a = self.lora_b = self.lora_dropout = None

    def __call__(self, x: jax.Array, group_sizes: jax.Array) -> jax.Array:
        """x [M, in], rows sorted by expert with group_sizes [E] rows each -> [M, out]."""
        dt = jnp.dtype(self.dtype)
        x = x.astype(dt)
        y = jax.lax.ragged_dot(x, self.kernel[...].astype(dt), group_sizes)
        if self.rank > 0 and self.adapters_enabled:
            h = jax.lax.ragged_dot(self.lora_dropout(x), self.lora_a[...].astype(dt), group_sizes)
            h = jax.lax.ragged_dot(h, self.lora_b[...].astype(dt), group_sizes)
            y = y + (self.scaling * h).astype(dt)
        return y


def route(logits: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """Router logits [N, E] -> (weights [N, k] in the logits' dtype, experts [N, k]): softmax in float32, top-k,
    the k probabilities renormalised to sum to 1 (HF Qwen3VLMoeTextTopKRouter)."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, idx = jax.lax.top_k(probs, top_k)
    return (top / jnp.sum(top, axis=-1, keepdims=True)).astype(logits.dtype), idx


def load_balancing_loss(router_logits: jax.Array, top_k: int, mask: jax.Array | None = None) -> jax.Array:
    """The auxiliary load-balancing loss (Switch Transformer eq. 4 with top-k, HF load_balancing_loss_func):
    E * sum_e f_e P_e over the tokens of every sparse layer together, f_e the share of (token, slot) picks going to
    expert e and P_e its mean router probability. router_logits [n_layers, N, E]; mask [N] (1 = real token)."""
    n_layers, N, E = router_logits.shape
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1).reshape(n_layers * N, E)
    _, idx = jax.lax.top_k(probs, top_k)
    picks = jax.nn.one_hot(idx, E, dtype=jnp.float32)  # [n_layers * N, k, E]
    w = jnp.ones((n_layers * N,), jnp.float32) if mask is None else jnp.tile(mask.astype(jnp.float32), n_layers)
    f = jnp.sum(picks * w[:, None, None], axis=0) / jnp.sum(w)  # [k, E]
    p = jnp.sum(probs * w[:, None], axis=0) / jnp.sum(w)  # [E]
    return E * jnp.sum(f * p[None, :])


class SparseMoE(nnx.Module):
    """x [B, T, D] -> the weighted sum of each token's top-k experts' SwiGLU outputs [B, T, D].

    With `record_router_logits` set (a static switch, off by default; not under ModelConfig.scan_layers) each call
    sows its router logits [B*T, E] as an nnx.Intermediate named "router_logits", for `load_balancing_loss`."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        t = cfg.text
        E, D, inter = t.num_experts, t.hidden_size, t.moe_intermediate_size
        self.top_k = t.num_experts_per_tok
        self.num_experts = E
        self.intermediate = inter
        self.record_router_logits = False
        common = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        # the router takes no adapter: low-rank updates to it would change which experts run
        self.gate = LoRALinear(D, E, axes=("embed", None), **common)
        self.experts = nnx.Dict({
            "gate_up_proj": ExpertLinear(E, D, 2 * inter, axes=("expert", "embed", "mlp"), **common,
                                         **cfg.lora.layer_kwargs("experts_gate_up")),
            "down_proj": ExpertLinear(E, inter, D, axes=("expert", "mlp", "embed"), **common,
                                      **cfg.lora.layer_kwargs("experts_down")),
        })

    def __call__(self, x: jax.Array) -> jax.Array:
        B, T, D = x.shape
        flat = x.reshape(B * T, D)
        logits = self.gate(flat)
        if self.record_router_logits:
            self.sow(nnx.Intermediate, "router_logits", logits)
        weights, experts = route(logits, self.top_k)
        k = self.top_k
        # the N * k (token, expert) pairs, sorted by expert (stable, so tokens keep their order within an expert)
        order = jnp.argsort(experts.reshape(-1), stable=True)
        token = order // k
        group_sizes = jnp.bincount(experts.reshape(-1), length=self.num_experts).astype(jnp.int32)
        h = self.experts["gate_up_proj"](jnp.take(flat, token, axis=0), group_sizes)
        h = jax.nn.silu(h[:, : self.intermediate]) * h[:, self.intermediate:]
        out = self.experts["down_proj"](h, group_sizes)
        out = out * jnp.take(weights.reshape(-1), order)[:, None].astype(out.dtype)
        y = jnp.zeros_like(flat, dtype=out.dtype).at[token].add(out)
        return constrain(y.reshape(B, T, D).astype(x.dtype), ("batch", "seq", "act_embed"))


def dense_moe(layer: SparseMoE, x: jax.Array) -> jax.Array:
    """The same layer computed as a loop over all E experts on all N tokens, each weighted by its routing weight
    (0 where not picked): E * N rows of work where `SparseMoE` does k * N. The benchmark's baseline."""
    B, T, D = x.shape
    flat = x.reshape(B * T, D)
    weights, experts = route(layer.gate(flat), layer.top_k)
    dense_w = jnp.sum(jax.nn.one_hot(experts, layer.num_experts, dtype=weights.dtype) * weights[..., None], axis=1)
    gu, dn = layer.experts["gate_up_proj"].kernel[...], layer.experts["down_proj"].kernel[...]
    n = layer.intermediate
    y = jnp.zeros_like(flat)
    for e in range(layer.num_experts):
        h = flat @ gu[e]
        y = y + (jax.nn.silu(h[:, :n]) * h[:, n:]) @ dn[e] * dense_w[:, e:e + 1]
    return y.reshape(B, T, D)
