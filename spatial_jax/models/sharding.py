"""The one place where logical axis names meet mesh axes.

Every parameter of the model carries logical axis names in its `out_sharding` metadata (e.g. ("embed", "mlp")), and
the forward pass names its activations the same way. `RULES` maps each logical name to mesh axes of the 3-D mesh
("data", "fsdp", "tensor"). A mesh axis that does not divide the dimension is dropped for that array (the dimension
is replicated over it), so tiny test models run on any mesh.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spatial_jax.distributed import place

MESH_AXES = ("data", "fsdp", "tensor")

# logical name -> mesh axis (or tuple of mesh axes); names absent here are replicated.
RULES: dict[str, str | tuple[str, ...] | None] = {
    # activations
    "batch": ("data", "fsdp"),
    "seq": None,
    "act_embed": None,
    "act_heads": "tensor",
    "act_kv_heads": "tensor",
    "act_mlp": "tensor",
    "act_vocab": "tensor",
    "patches": None,
    "cache_seq": None,
    # parameters: FSDP over the model dimension, tensor parallel over heads / MLP / vocabulary
    "embed": "fsdp",
    "vocab": "tensor",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "norm": None,
    "lora_rank": None,
    "layers": None,  # the stacked-layer axis of ModelConfig.scan_layers: every device holds all layers' shards
    "vision_embed": "fsdp",
    "vision_mlp": "tensor",
    "vision_heads": "tensor",
    "vision_patch": None,
    "vision_pos": None,
    "merger_in": "fsdp",
    # expert parallelism: each device of the fsdp axis holds whole experts of every MoE layer (their embed axis
    # then stays unsharded, since a mesh axis serves one dimension of an array); tokens reach their experts
    # through the all-to-all of models.moe (left to XLA, the grouped matmul all-gathers the experts instead)
    "expert": "fsdp",
}


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over the first data*fsdp*tensor devices."""
    devices = list(jax.devices() if devices is None else devices)
    n = data * fsdp * tensor
    if min(data, fsdp, tensor) < 1:
        raise ValueError(f"mesh sizes must be >= 1, got data={data} fsdp={fsdp} tensor={tensor}")
    if n > len(devices):
        raise ValueError(f"mesh {data}x{fsdp}x{tensor} needs {n} devices, only {len(devices)} available")
    return Mesh(np.asarray(devices[:n]).reshape(data, fsdp, tensor), MESH_AXES)


def _mesh_axis_sizes(mesh) -> dict[str, int]:
    return dict(zip(mesh.axis_names, mesh.axis_sizes)) if hasattr(mesh, "axis_sizes") else dict(mesh.shape)


def logical_to_spec(names: Sequence[str | None], shape: Sequence[int] | None = None, mesh=None) -> P:
    """PartitionSpec for an array with these logical axis names; mesh axes that do not divide `shape` are dropped."""
    sizes = _mesh_axis_sizes(mesh) if mesh is not None else {}
    used: set[str] = set()
    out = []
    for i, name in enumerate(names):
        rule = RULES.get(name) if name is not None else None
        axes = () if rule is None else ((rule,) if isinstance(rule, str) else tuple(rule))
        kept = []
        dim = None if shape is None else int(shape[i])
        for ax in axes:
            if ax in used or (mesh is not None and ax not in sizes):
                continue
            size = sizes.get(ax, 1)
            prod = int(np.prod([sizes.get(a, 1) for a in kept])) * size
            if dim is not None and dim % prod:
                continue
            kept.append(ax)
        used.update(kept)
        out.append(None if not kept else (kept[0] if len(kept) == 1 else tuple(kept)))
    return P(*out)


def axes_of(name: str) -> tuple[str, ...]:
    """The mesh axes a logical name maps to (empty when replicated)."""
    rule = RULES.get(name)
    return () if rule is None else ((rule,) if isinstance(rule, str) else tuple(rule))


def _active_mesh():
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh is None or mesh.empty else mesh


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` by logical names under an active mesh (`jax.set_mesh`); identity without one."""
    mesh = _active_mesh()
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(names, x.shape, mesh))


def variable_names(var: nnx.Variable) -> tuple[str | None, ...] | None:
    """The logical axis names a Variable was created with (None for unannotated state such as RNG counters)."""
    meta = var.get_metadata()
    names = meta.get("out_sharding") or meta.get("sharding_names")
    return None if names is None else tuple(names)


def state_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
    """NamedSharding for every leaf of an NNX state, from its logical names (replicated when unannotated)."""

    def one(var):
        names = variable_names(var)
        shape = np.shape(var.get_value())
        spec = P() if names is None else logical_to_spec(names, shape, mesh)
        return var.replace(NamedSharding(mesh, spec))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Places every parameter of `model` on `mesh` by the rules (in place) and returns the model."""
    state = nnx.state(model)
    shardings = state_shardings(state, mesh)
    placed = jax.tree.map(
        lambda v, s: v.replace(place(v.get_value(), s.get_value())),
        state, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    nnx.update(model, placed)
    return model
