"""Layers with stacked parameters, run under `jax.lax.scan` (ModelConfig.scan_layers), and the remat policies.

A stack is one module of the layer's class whose parameters (nnx.Param, LoRA factors included) carry a leading
"layers" axis. Its other state, the RNG streams of adapter dropout, is one unstacked copy threaded through the
layers as part of the scan carry, so every layer draws fresh masks from the same streams. The scan body rebuilds a
plain layer from one slice of the parameters (nnx.split / nnx.merge), so the layer classes need no scan-awareness.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spatial_jax.models.config import REMAT_POLICY_NAMES
from spatial_jax.models.sharding import variable_names

# The one place remat policy names meet jax: None is jax.checkpoint's default (save nothing, recompute the layer).
REMAT_POLICIES: dict[str, Callable[..., bool] | None] = {
    "full": None,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
assert set(REMAT_POLICIES) == set(REMAT_POLICY_NAMES) - {"none"}

LayerFn = Callable[[nnx.Module, jax.Array, Any], tuple[jax.Array, Any]]


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def stack_modules(modules: list[nnx.Module]) -> nnx.Module:
    """One module whose parameters are the modules' parameters stacked on a leading "layers" axis (logical name
    "layers" prepended to their sharding names); its other state is the first module's."""
    graphdef, _, rest = nnx.split(modules[0], nnx.Param, ...)

    def stack(*vs: nnx.Variable) -> nnx.Variable:
        names = variable_names(vs[0])
        meta = {} if names is None else {"out_sharding": ("layers", *names)}
        return vs[0].replace(jnp.stack([v.get_value() for v in vs]), **meta)

    params = jax.tree.map(stack, *[nnx.state(m, nnx.Param) for m in modules], is_leaf=_is_var)
    return nnx.merge(graphdef, params, rest)


def num_layers(stack: nnx.Module) -> int:
    return jax.tree.leaves(nnx.state(stack, nnx.Param))[0].shape[0]


def run_stack(stack: nnx.Module, fn: LayerFn, x: jax.Array, xs: Any = None, *, start: int = 0,
              stop: int | None = None, remat: str = "none", scan: bool = True) -> tuple[jax.Array, Any]:
    """x, y_l = fn(layer_l, x, xs_l) for layers start .. stop-1 of `stack`. Scanned: `xs` leaves have a leading
    axis of stop - start (None: nothing per layer) and ys come back stacked. With `scan=False` (a Python loop over
    parameter slices, for the KV-cache path: see Qwen3VL._run_stacked) `xs` is a sequence with one entry per layer
    and ys a list.
    `remat` names a REMAT_POLICIES entry applied to each layer ("none": no recomputation)."""
    stop = num_layers(stack) if stop is None else stop
    # Only live dropout advances the RNG streams; otherwise nothing is written back, so a forward may run inside a
    # trace that must not write the model's variables (the sampler calls it in a while_loop).
    live = any(isinstance(m, nnx.Dropout) and not m.deterministic for _, m in nnx.iter_graph(stack))
    graphdef, params, rest = nnx.split(stack, nnx.Param, ...)
    params = jax.tree.map(lambda a: a[start:stop], params)

    def body(carry, inputs):
        x, rest = carry
        p, xs_l = inputs
        layer = nnx.merge(graphdef, p, rest)
        x, y = fn(layer, x, xs_l)
        return (x, nnx.split(layer, nnx.Param, ...)[2]), y

    if remat != "none":
        # the scan already keeps the recomputation from being CSE'd into the forward
        body = jax.checkpoint(body, policy=REMAT_POLICIES[remat], prevent_cse=not scan)
    if scan:
        (x, rest), ys = jax.lax.scan(body, (x, rest), (params, xs))
    else:
        ys = []
        for i in range(stop - start):
            p = jax.tree.map(lambda a, i=i: a[i], params)
            (x, rest), y = body((x, rest), (p, None if xs is None else xs[i]))
            ys.append(y)
    if live:
        nnx.update(stack, rest)
    return x, ys
