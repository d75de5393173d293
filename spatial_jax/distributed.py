"""Multi-host start-up: join the JAX cluster when the environment names a coordinator.

Must run before anything touches a device. Explicit variables win (JAX_COORDINATOR_ADDRESS with JAX_NUM_PROCESSES
and JAX_PROCESS_ID); otherwise a multi-task SLURM job or a multi-host TPU slice is joined by jax's own cluster
detection. A single-process run is left alone.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


def cluster_requested(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return True
    if int(env.get("SLURM_NTASKS", "1") or 1) > 1:
        return True
    return "," in env.get("TPU_WORKER_HOSTNAMES", "")


def initialize(env: dict[str, str] | None = None) -> bool:
    """Joins the cluster if one is requested; returns whether it did."""
    env = os.environ if env is None else env
    if not cluster_requested(env):
        return False
    if env.get("JAX_COORDINATOR_ADDRESS"):
        missing = [k for k in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if not env.get(k)]
        if missing:
            raise RuntimeError(f"JAX_COORDINATOR_ADDRESS is set but {missing} are not")
        jax.distributed.initialize(
            coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(env["JAX_NUM_PROCESSES"]),
            process_id=int(env["JAX_PROCESS_ID"]),
        )
    else:
        jax.distributed.initialize()
    return True


def to_host(x) -> np.ndarray:
    """The global value of an array as numpy on this process. An array sharded across processes (multi-host) is
    gathered from all of them, so every process holds the same rollouts and makes the same host-side decisions."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def is_primary() -> bool:
    """Whether this process writes the run's files (logs, metrics, reports): process 0 of the cluster."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reaches the point `name` (e.g. until the first one has written files the others
    read next); a no-op in a single-process run."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def allgather_rows(x: np.ndarray) -> np.ndarray:
    """Every process's `x` concatenated along axis 0 in process order; the row counts may differ between processes,
    the other dimensions may not. `x` itself in a single-process run."""
    x = np.asarray(x)
    if jax.process_count() == 1:
        return x
    counts = multihost_utils.process_allgather(np.asarray(x.shape[0], np.int64)).reshape(-1)
    padded = np.zeros((int(counts.max()), *x.shape[1:]), x.dtype)
    padded[: x.shape[0]] = x
    everyone = multihost_utils.process_allgather(padded)  # [processes, most rows, ...]
    return np.concatenate([rows[:n] for rows, n in zip(everyone, counts)], axis=0)


def allgather_bytes(raw: bytes) -> list[bytes]:
    """Every process's byte string (of any length), in process order."""
    data = np.frombuffer(raw, np.uint8)
    sizes = allgather_rows(np.asarray([data.size], np.int64))
    ends, flat = np.cumsum(sizes), allgather_rows(data)
    return [flat[end - size : end].tobytes() for end, size in zip(ends, sizes)]


def allgather_json(obj: Any) -> list[Any]:
    """Every process's JSON-ready `obj` (numpy scalars become floats), in process order: small host records such as
    per-rollout scores. [obj] in a single-process run."""
    if jax.process_count() == 1:
        return [obj]
    return [json.loads(raw) for raw in allgather_bytes(json.dumps(obj, default=float).encode())]


def primary_says(value: bool) -> bool:
    """The first process's `value` on every process: a decision all must take alike (they then run the same
    collectives) though only the first can make it, e.g. from the files it wrote."""
    if jax.process_count() == 1:
        return bool(value)
    return bool(multihost_utils.broadcast_one_to_all(np.asarray(bool(value))))


def place(x: jax.Array, sharding: jax.sharding.Sharding) -> jax.Array:
    """`jax.device_put(x, sharding)`, also for a PRNG key array (e.g. LoRA dropout streams) onto devices of other
    processes, which device_put refuses for keys: their raw data is placed and wrapped again."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(jax.device_put(jax.random.key_data(x), sharding), impl=jax.random.key_impl(x))
    return jax.device_put(x, sharding)
