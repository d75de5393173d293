"""Sparse mixture-of-experts MLP (Qwen3-VL-MoE): a softmax router picks each token's top-k experts, whose SwiGLU
outputs are summed with the renormalised top-k probabilities as weights (HF Qwen3VLMoeTextSparseMoeBlock).

Every token reaches all of its k experts (no capacity, nothing dropped): the N * k (token, expert) pairs are sorted
by expert and each expert's contiguous run goes through its weights in one grouped matmul, so the work is N * k rows,
not N * E. Which grouped matmul is ModelConfig.moe_matmul (kernels/grouped_matmul/): XLA's `jax.lax.ragged_dot`
or jax's Pallas TPU kernel megablox, which XLA cannot partition, so under a mesh of several devices the layer runs in
shard_map on every path (all experts on each chip's tokens where expert parallelism does not apply). `dense_moe` is
the same layer as a loop over every expert on every token, the benchmark's baseline (benchmarks/training/moe.py).

Expert weights are stacked [E, in, out] with a leading logical "expert" axis (models.sharding.RULES maps it to the
mesh), in the released checkpoints' layout: gate_up [E, D, 2I] (gate columns first), down [E, I, D].
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from spatial_jax.kernels.grouped_matmul import TILING, grouped_matmul
from spatial_jax.models.config import ModelConfig
from spatial_jax.models.layers import random_normal, random_uniform
from spatial_jax.models.lora import LoRALinear, LoRAParam
from spatial_jax.models.sharding import axes_of, constrain


class ExpertLinear(LoRALinear):
    """E stacked linear maps [E, in, out] applied to rows grouped by expert, each with its own LoRA adapter
    (A [E, in, r], B [E, r, out]; B = 0 at the start) when rank > 0. A LoRALinear, so merging, disabling and
    resetting adapters treat it like any other projection. `matmul` and `tiling`: the grouped matmul that runs the
    three products (kernels.grouped_matmul's impl and megablox tiles)."""

    def __init__(self, num_experts: int, in_features: int, out_features: int, *, axes: tuple[str, str, str],
                 rank: int = 0, alpha: float = 1.0, dropout: float = 0.0, dtype: str = "float32",
                 param_dtype: str = "float32", matmul: str = "ragged_dot",
                 tiling: tuple[int, int, int] = TILING, rngs: nnx.Rngs):
        pdt = jnp.dtype(param_dtype)
        self.in_features = in_features
        self.dtype = dtype
        self.matmul = matmul
        self.tiling = tiling
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
        """x [M, in], rows sorted by expert with group_sizes [E] rows each -> [M, out]; rows past
        sum(group_sizes) give 0."""
        return self.apply(x, group_sizes, *self.weights())

    def weights(self) -> tuple[jax.Array, ...]:
        """(kernel, lora_a, lora_b): what `apply` takes, the adapter's None without one."""
        return (self.kernel[...],) + ((self.lora_a[...], self.lora_b[...]) if self.rank > 0 else (None, None))

    def apply(self, x, group_sizes, kernel, lora_a, lora_b, dropout_key: jax.Array | None = None) -> jax.Array:
        """The layer with these weights (a shard's experts inside shard_map); `dropout_key` draws the adapter
        dropout's mask where the module's own stream cannot be advanced (inside shard_map)."""
        dt = jnp.dtype(self.dtype)
        x = x.astype(dt)

        def matmul(rows, w):
            return grouped_matmul(rows, w.astype(dt), group_sizes, impl=self.matmul, tiling=self.tiling)

        y = matmul(x, kernel)
        if self.rank > 0 and self.adapters_enabled:
            h = matmul(matmul(self.lora_dropout(x, rngs=dropout_key), lora_a), lora_b)
            y = y + (self.scaling * h).astype(dt)
        return y

    def dropout_live(self) -> bool:
        return self.rank > 0 and self.adapters_enabled and not self.lora_dropout.deterministic \
            and self.lora_dropout.rate > 0


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
        self.matmul = cfg.moe_matmul
        common = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
        # the router takes no adapter: low-rank updates to it would change which experts run
        self.gate = LoRALinear(D, E, axes=("embed", None), **common)
        self.experts = nnx.Dict({
            "gate_up_proj": ExpertLinear(E, D, 2 * inter, axes=("expert", "embed", "mlp"), matmul=cfg.moe_matmul,
                                         **common, **cfg.lora.layer_kwargs("experts_gate_up")),
            "down_proj": ExpertLinear(E, inter, D, axes=("expert", "mlp", "embed"), matmul=cfg.moe_matmul,
                                      **common, **cfg.lora.layer_kwargs("experts_down")),
        })

    def __call__(self, x: jax.Array) -> jax.Array:
        B, T, D = x.shape
        flat = x.reshape(B * T, D)
        logits = self.gate(flat)
        if self.record_router_logits:
            self.sow(nnx.Intermediate, "router_logits", logits)
        weights, experts = route(logits, self.top_k)
        axes = expert_parallel_axes(B, self.num_experts)
        mesh = jax.sharding.get_abstract_mesh()
        if axes is None and self.matmul == "megablox" and mesh is not None and not mesh.empty and mesh.size > 1:
            axes = (token_axes(B), ())  # all experts on each chip's tokens, in shard_map as a Mosaic kernel must be
        if axes is None:
            y = self._combine(flat, weights, experts, lambda rows, sizes: self._swiglu(
                rows, sizes, self.experts["gate_up_proj"].weights(), self.experts["down_proj"].weights()))
        else:
            y = self._expert_parallel(x, weights.reshape(B, T, -1), experts.reshape(B, T, -1), *axes)
        return constrain(y.reshape(B, T, D).astype(x.dtype), ("batch", "seq", "act_embed"))

    def _swiglu(self, rows, group_sizes, gate_up, down, keys=(None, None)):
        """The experts' SwiGLU on rows grouped by expert, with these (kernel, lora_a, lora_b) weights."""
        h = self.experts["gate_up_proj"].apply(rows, group_sizes, *gate_up, dropout_key=keys[0])
        h = jax.nn.silu(h[:, : self.intermediate]) * h[:, self.intermediate:]
        return self.experts["down_proj"].apply(h, group_sizes, *down, dropout_key=keys[1])

    def _combine(self, flat, weights, experts, run):
        """sum_j weights[:, j] * expert_j(flat) with `run(rows sorted by expert, group_sizes [E])`."""
        k = self.top_k
        # the N * k (token, expert) pairs, sorted by expert (stable, so tokens keep their order within an expert)
        order = jnp.argsort(experts.reshape(-1), stable=True)
        token = order // k
        group_sizes = jnp.bincount(experts.reshape(-1), length=self.num_experts).astype(jnp.int32)
        out = run(jnp.take(flat, token, axis=0), group_sizes)
        out = out * jnp.take(weights.reshape(-1), order)[:, None].astype(out.dtype)
        return jnp.zeros_like(flat, dtype=out.dtype).at[token].add(out)

    def _expert_parallel(self, x, weights, experts, batch_axes: tuple[str, ...], ep_axes: tuple[str, ...]):
        """Expert parallelism: each device of `ep_axes` holds E / n whole experts and its own tokens (batch over
        `batch_axes`); a token's k (token, expert) rows go to their experts' devices in one all-to-all and come
        back in another. Nothing is dropped: a destination's buffer holds every row one device could send it
        (N * min(k, E / n)), rows past a sender's count are padding that the grouped matmul leaves at 0.
        With no `ep_axes` every device holds all experts and runs them on its own tokens (no all-to-all)."""
        mesh = jax.sharding.get_abstract_mesh()
        sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
        n = math.prod(sizes[a] for a in ep_axes)
        E, k = self.num_experts, self.top_k
        local_experts = E // n
        gu, dn = self.experts["gate_up_proj"], self.experts["down_proj"]
        # the adapters' dropout draws its keys here, from the modules' streams, and folds in the token shard
        keys = tuple(m.lora_dropout.rngs() if m.dropout_live() else None for m in (gu, dn))
        ep = ep_axes[0] if len(ep_axes) == 1 else ep_axes
        dt = jnp.dtype(gu.dtype)

        def local(x, weights, experts, gate_up, down, keys):
            B, T, D = x.shape
            flat = x.reshape(B * T, D).astype(dt)
            if batch_axes:
                shard = jax.lax.axis_index(batch_axes)
                keys = tuple(None if key is None else jax.random.fold_in(key, shard) for key in keys)
            capacity = B * T * min(k, local_experts)

            def run(rows, group_sizes):
                if not ep_axes:
                    return self._swiglu(rows, group_sizes, gate_up, down, keys)
                per_dest = jnp.sum(group_sizes.reshape(n, local_experts), axis=1)
                dest = jnp.repeat(jnp.arange(n), per_dest, total_repeat_length=rows.shape[0])
                pos = jnp.arange(rows.shape[0]) - (jnp.cumsum(per_dest) - per_dest)[dest]
                send = jnp.zeros((n, capacity, D), dt).at[dest, pos].set(rows)
                recv = jax.lax.all_to_all(send, ep, 0, 0)  # [source, capacity, D]
                counts = jax.lax.all_to_all(group_sizes.reshape(n, local_experts), ep, 0, 0)  # [source, E / n]
                # each received row's local expert; a source's padding rows get E / n, after every group
                ends = jnp.cumsum(counts, axis=1)
                slot = jnp.sum(jnp.arange(capacity)[None, :, None] >= ends[:, None, :], axis=-1).reshape(-1)
                order = jnp.argsort(slot, stable=True)
                out = self._swiglu(recv.reshape(n * capacity, D)[order], jnp.sum(counts, axis=0), gate_up, down,
                                   keys)
                out = jnp.zeros_like(out).at[order].set(out).reshape(n, capacity, D)
                return jax.lax.all_to_all(out, ep, 0, 0)[dest, pos]

            return self._combine(flat, weights.reshape(B * T, k), experts.reshape(B * T, k), run).reshape(B, T, D)

        tokens, experts_spec = P(batch_axes or None), P(ep) if ep_axes else P()
        # check_vma only off for megablox: pallas_call results carry no varying-axes type for the checker to follow
        run = jax.shard_map(local, mesh=mesh, in_specs=(tokens, tokens, tokens, experts_spec, experts_spec, P()),
                            out_specs=tokens, check_vma=self.matmul != "megablox")
        return run(x, weights, experts, gu.weights(), dn.weights(), keys)


def expert_parallel_axes(batch: int, num_experts: int) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(token axes, expert axes) of the active mesh when its "expert" axes (models.sharding.RULES) have more than
    one device, divide the experts, and shard the batch of `batch` rows with the other "batch" axes; None
    otherwise (no mesh, one device, a batch they do not divide: every device then runs all experts on its rows)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return None
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    ep = tuple(a for a in axes_of("expert") if sizes.get(a, 1) > 1)
    n = math.prod(sizes[a] for a in ep)
    if not ep or num_experts % n:
        return None
    batch_axes = token_axes(batch)
    return (batch_axes, ep) if set(ep) <= set(batch_axes) else None


def token_axes(batch: int) -> tuple[str, ...]:
    """The active mesh's "batch" axes (models.sharding.RULES) of more than one device that together divide a batch
    of `batch` rows, in order: the axes the layer's shard_map puts its tokens on."""
    mesh = jax.sharding.get_abstract_mesh()
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    batch_axes, prod = [], 1
    for a in axes_of("batch"):
        if sizes.get(a, 1) > 1 and batch % (prod * sizes[a]) == 0:
            batch_axes.append(a)
            prod *= sizes[a]
    return tuple(batch_axes)


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
