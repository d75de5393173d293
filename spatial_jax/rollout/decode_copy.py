"""The decoding copy: the weights rollouts and evaluation sample from, laid out for sampling.

Training holds the policy's weights sharded FSDP over the whole (data, fsdp, tensor) mesh, so a decode step reading
them would gather every layer's weights on every device, every token. Rollouts read a copy instead:
- in the decode dtype ("auto": the policy's compute dtype: a bfloat16-compute run samples from the very bfloat16
  weights its forward casts to, and a float32 run's copy is exact);
- on this process's own devices of the mesh, tensor parallel over `tensor` of them and replicated (data parallel)
  over the rest, whole on every process: a process decodes its own prompts with no program spanning hosts.
Adapters stay separate and are applied in the forward, as in training, so the copy computes what the policy does.

`refresh` makes the copy again from the policy after an update: a reshard (as tunix's reshard_pytree and verl's
weight sync do), not a reload. The cast runs on the training layout (a bfloat16 cast of FSDP shards, a fraction of
the weights), then the arrays move to the decode shardings: within one process `jax.device_put` does it. Across
processes device_put cannot move data between different sets of devices, so the cast goes to a layout on the
training mesh whose shards every process holds whole (replicated over data and fsdp, split only over tensor groups
that lie within a process), and each local device takes its decode slice from its own process's shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spatial_jax.config import ConfigError, check_at_least
from spatial_jax.models.sharding import make_mesh, state_shardings


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The decoding copy (rollout/decode_copy.py). dtype: its weights' dtype ("auto": the policy's compute dtype).
    devices: 0 puts the copy on this process's devices of the training mesh; n > 0 on a rollout mesh of its own, the
    n devices after the training mesh's (disaggregated: rollouts and updates can run at once, rl.rollout_mode).
    tensor: devices each copy is split over (tensor parallel) among those, the copy replicated over the rest (data
    parallel); 0 = all of them."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    tensor: int = 0
    devices: int = 0

    def __post_init__(self):
        check_at_least(self, tensor=0, devices=0)

    def weights_dtype(self, compute_dtype) -> jnp.dtype:
        """The copy's weight dtype for a policy computing in `compute_dtype`."""
        return jnp.dtype(compute_dtype if self.dtype == "auto" else self.dtype)


def rollout_devices(train_mesh: Mesh, devices: int = 0) -> list:
    """The devices the decoding copy lives on: this process's devices of `train_mesh` (devices 0), or the `devices`
    of this process's devices that follow the training mesh's (a rollout mesh of its own)."""
    if devices == 0:
        local = [d for d in train_mesh.devices.flat if d.process_index == jax.process_index()]
        if not local:
            raise ConfigError(f"process {jax.process_index()} holds none of the mesh's {train_mesh.devices.size} "
                              "devices: it decodes its prompts on its own, so the mesh (data*fsdp*tensor) must span "
                              "every process's devices")
        return local
    if jax.process_count() > 1:
        raise ConfigError(f"decode.devices={devices}: a rollout mesh of its own runs on one process (each process "
                          "of a cluster decodes on its own devices of the training mesh: set decode.devices=0)")
    training = set(train_mesh.devices.flat)
    spare = [d for d in jax.local_devices() if d not in training]
    if len(spare) < devices:
        raise ConfigError(f"decode.devices={devices}: only {len(spare)} device(s) lie outside the training mesh "
                          f"of {len(training)}")
    return spare[:devices]


def decode_mesh(train_mesh: Mesh, tensor: int = 0, devices: int = 0) -> Mesh:
    """A (data, fsdp=1, tensor) mesh over `rollout_devices(train_mesh, devices)`."""
    local = rollout_devices(train_mesh, devices)
    tensor = tensor or len(local)
    if len(local) % tensor:
        raise ConfigError(f"decode.tensor={tensor} does not divide the {len(local)} devices the decoding copy "
                          "lives on")
    return make_mesh(len(local) // tensor, 1, tensor, devices=local)


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _cast(x, dtype):
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x


def _cast_all(leaves: list, dtype) -> list:
    """New arrays (never the policy's own buffers, which an update may donate), floats cast to `dtype`."""
    return [_cast(x, dtype) for x in leaves]


def _bounds(index: tuple, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(s.start or 0, n if s.stop is None else s.stop) for s, n in zip(index, shape)]


def _from_own_shards(x: jax.Array, target: NamedSharding) -> jax.Array:
    """`x` (sharded across processes) on the fully addressable `target`, each local device's slice cut from a shard
    this process holds that contains it."""
    shape = x.shape
    shards = [(_bounds(s.index, shape), s.data) for s in x.addressable_shards]
    pieces = []
    for device, index in target.addressable_devices_indices_map(shape).items():
        want = _bounds(index, shape)
        found = next(((b, d) for b, d in shards if all(lo <= a and c <= hi for (lo, hi), (a, c) in zip(b, want))),
                     None)
        if found is None:
            raise ValueError(f"no shard of this process holds slice {want} of an array of shape {shape}")
        have, data = found
        if have != want:  # cut on the shard's own device (the run's mesh, active around us, does not hold it alone)
            with jax.set_mesh(Mesh(np.asarray(list(data.devices())), ("device",))):
                data = data[tuple(slice(a - lo, c - lo) for (lo, _), (a, c) in zip(have, want))]
        pieces.append(jax.device_put(data, device))
    return jax.make_array_from_single_device_arrays(shape, target, pieces)


def _local_tensor_groups(mesh: Mesh) -> bool:
    """Whether every group of devices along the mesh's tensor axis lies within one process."""
    devices = np.asarray(mesh.devices)
    procs = np.vectorize(lambda d: d.process_index)(devices)
    return bool(np.all(procs == procs[..., :1]))


def _staged_spec(target: P, train_mesh: Mesh, keep_tensor: bool) -> P:
    """The target's split over "tensor" on the training mesh (when kept), replicated over every other axis."""

    def entry(e):
        axes = (e,) if isinstance(e, str) else tuple(e or ())
        return "tensor" if keep_tensor and "tensor" in axes else None

    return P(*(entry(e) for e in target))


class DecodeCopy:
    """The policy's weights in `dtype` on `mesh` (decode_mesh), as a model: `model` (an nnx module of the same
    graph) is what the sampler runs, under `scope()`, which makes `mesh` the active mesh (the KV cache and the
    forward's sharding constraints follow it)."""

    def __init__(self, model: nnx.Module, cfg: DecodeConfig, train_mesh: Mesh):
        self.cfg = cfg
        self.train_mesh = train_mesh
        self.mesh = decode_mesh(train_mesh, cfg.tensor, cfg.devices)
        self.dtype = cfg.weights_dtype(model.cfg.dtype)
        self.graphdef, state = nnx.split(model)
        self._treedef = jax.tree.structure(state)
        self._targets = jax.tree.leaves(state_shardings(state, self.mesh))
        keep = self.mesh.shape["tensor"] % train_mesh.shape["tensor"] == 0 and _local_tensor_groups(train_mesh)
        staged = [NamedSharding(train_mesh, _staged_spec(t.spec, train_mesh, keep)) for t in self._targets]
        # compiled once, reused by every refresh
        self._cast = jax.jit(functools.partial(_cast_all, dtype=self.dtype))
        self._cast_staged = jax.jit(functools.partial(_cast_all, dtype=self.dtype), out_shardings=staged)
        self.model: nnx.Module | None = None
        self.refreshes = 0
        self.refresh(model)

    def refresh(self, model: nnx.Module) -> None:
        """Makes the copy from `model`'s weights as they are now (every process together, when they span hosts)."""
        self.model = None  # the old copy's buffers go before the new one's are made (unless a caller holds them)
        leaves = jax.tree.leaves(nnx.state(model))
        keys = [_is_key(x) for x in leaves]
        impls = [jax.random.key_impl(x) if k else None for x, k in zip(leaves, keys)]
        raw = [jax.random.key_data(x) if k else x for x, k in zip(leaves, keys)]
        if all(x.is_fully_addressable for x in raw):
            placed = jax.device_put(self._cast(raw), self._targets)
        else:
            placed = [_from_own_shards(x, t) for x, t in zip(self._cast_staged(raw), self._targets)]
        placed = [jax.random.wrap_key_data(x, impl=i) if k else x for x, k, i in zip(placed, keys, impls)]
        self.model = nnx.merge(self.graphdef, jax.tree.unflatten(self._treedef, placed))
        self.refreshes += 1

    @contextlib.contextmanager
    def scope(self):
        with jax.set_mesh(self.mesh):
            yield self.model

    def nbytes(self) -> int:
        """Bytes of one copy (every process holds one, split over its `tensor` devices)."""
        return sum(x.nbytes for x in jax.tree.leaves(nnx.state(self.model)))
