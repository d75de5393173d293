"""Linear layers with optional low-rank adapters, and the operations on adapters.

y = x W + b + (alpha / r) * dropout(x) A B, with A [in, r] uniform(+-1/sqrt(in)) and B [r, out] zero, so a fresh
adapter leaves the model unchanged. A and B are `LoRAParam`s: a distinct Variable type, so the trainer can
differentiate and optimise only them (`nnx.DiffState(0, LoRAParam)`, `nnx.Optimizer(model, tx, wrt=LoRAParam)`),
while the base weights W, b stay frozen `nnx.Param`s.

Adapter dropout is inactive by default (`deterministic=True`); training turns it on with
`nnx.view(model, deterministic=False, raise_if_not_found=False)`, a view that shares every Variable with `model`
(optimiser updates through it are the model's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from spatial_jax.models.layers import random_normal, random_uniform


class LoRAParam(nnx.Param):
    """A trainable low-rank adapter factor (A or B)."""


class LoRALinear(nnx.Module):
    """Dense layer, kernel [in, out] with logical axis names `axes`; a LoRA adapter when `rank > 0`."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        axes: tuple[str | None, str | None],
        use_bias: bool = False,
        rank: int = 0,
        alpha: float = 1.0,
        dropout: float = 0.0,
        dtype: str = "float32",
        param_dtype: str = "float32",
        rngs: nnx.Rngs,
    ):
        pdt = jnp.dtype(param_dtype)
        self.in_features = in_features
        self.dtype = dtype
        std = in_features**-0.5
        self.kernel = nnx.Param(random_normal(rngs.params(), (in_features, out_features), std, pdt),
                                out_sharding=axes, eager_sharding=False)
        self.bias = (
            nnx.Param(jnp.zeros((out_features,), pdt), out_sharding=(axes[1],), eager_sharding=False)
            if use_bias else None
        )
        self.rank = rank
        self.scaling = alpha / rank if rank > 0 else 0.0
        self.adapters_enabled = True
        if rank > 0:
            bound = in_features**-0.5
            self.lora_a = LoRAParam(
                random_uniform(rngs.params(), (in_features, rank), bound, pdt),
                out_sharding=(axes[0], "lora_rank"), eager_sharding=False,
            )
            self.lora_b = LoRAParam(jnp.zeros((rank, out_features), pdt),
                                    out_sharding=("lora_rank", axes[1]), eager_sharding=False)
            self.lora_dropout = nnx.Dropout(dropout, deterministic=True, rngs=rngs)
        else:
            self.lora_a = None
            self.lora_b = None
            self.lora_dropout = None

    def __call__(self, x: jax.Array) -> jax.Array:
        dt = jnp.dtype(self.dtype)
        x = x.astype(dt)
        y = jnp.dot(x, self.kernel[...].astype(dt))
        if self.bias is not None:
            y = y + self.bias[...].astype(dt)
        if self.rank > 0 and self.adapters_enabled:
            h = self.lora_dropout(x)
            h = jnp.dot(jnp.dot(h, self.lora_a[...].astype(dt)), self.lora_b[...].astype(dt))
            y = y + (self.scaling * h).astype(dt)
        return y

    def merged_kernel(self) -> jax.Array:
        """W + (alpha / r) A B in the parameter dtype (W when there is no adapter)."""
        w = self.kernel[...]
        if self.rank == 0:
            return w
        # matmul, not dot: stacked layers (ModelConfig.scan_layers) hold [L, in, r] and [L, r, out]
        delta = jnp.matmul(self.lora_a[...].astype(jnp.float32), self.lora_b[...].astype(jnp.float32))
        return (w.astype(jnp.float32) + self.scaling * delta).astype(w.dtype)


def lora_layers(model: nnx.Module) -> Iterator[LoRALinear]:
    for _, node in nnx.iter_graph(model):
        if isinstance(node, LoRALinear):
            yield node


def _disable_adapters(model: nnx.Module) -> Iterator[nnx.Module]:
    """Within the block, `model` runs with every adapter switched off: the frozen base policy (the KL reference),
    from the same weights. Works inside traced functions too (the switch is a static attribute)."""
    layers = list(lora_layers(model))
    previous = [layer.adapters_enabled for layer in layers]
    for layer in layers:
        layer.adapters_enabled = False
    try:
        yield model
    finally:
        for layer, prev in zip(layers, previous):
            layer.adapters_enabled = prev


# applied by a call, not as a decorator, so that tools/mutation.sh (mutmut skips decorated functions) reaches it
disable_adapters = contextlib.contextmanager(_disable_adapters)


def merge_lora(model: nnx.Module) -> nnx.Module:
    """A copy of `model` whose kernels include their adapters (W <- W + alpha/r A B) and whose B factors are zero,
    so it computes the same function with or without adapters (for export)."""
    merged = nnx.clone(model)
    for layer in lora_layers(merged):
        if layer.rank > 0:
            layer.kernel[...] = layer.merged_kernel()
            layer.lora_b[...] = jnp.zeros_like(layer.lora_b[...])
    return merged


def reset_adapters(model: nnx.Module, seed: int = 0) -> nnx.Module:
    """Fresh adapters in place: A ~ U(+-1/sqrt(in)), B = 0, new dropout streams. Also fills the adapters of an
    abstract model (nnx.eval_shape) whose base weights were loaded from a checkpoint."""
    rngs = nnx.Rngs(seed)
    for layer in lora_layers(model):
        if layer.rank == 0:
            continue
        # shapes from the variables: stacked layers carry a leading layer axis
        a, b = layer.lora_a.get_value(), layer.lora_b.get_value()
        layer.lora_a.set_value(random_uniform(rngs.params(), a.shape, layer.in_features**-0.5, a.dtype))
        layer.lora_b.set_value(jnp.zeros(b.shape, b.dtype))
        layer.lora_dropout.rngs = rngs.dropout.fork()
    return model


def lora_param_count(model: nnx.Module) -> int:
    state = nnx.state(model, LoRAParam)
    return int(sum(x.size for x in jax.tree.leaves(state)))
