"""The targets a plan compiles for: TPU topologies (libtpu describes a slice from any host), `cpu:N` host devices,
and GPUs (no compiler here: estimated, gpu.py); which chips of a topology one host or a rollout mesh holds."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

import jax
import numpy as np

from spatial_jax.config import ConfigError

GiB = 1 << 30


# HBM per chip, by the generation prefix of a topology name
TPU_HBM_GIB = {"v4": 32, "v5e": 16, "v5litepod": 16, "v5p": 95, "v6e": 32}


GPU_HBM_GIB = {"a100": 80, "h100": 80, "h200": 141, "b200": 180}


GPUS_PER_HOST = 8  # a GPU target of more chips is hosts of 8, each decoding its own block of rollouts


# Slices sold as one host of 8 chips (v5litepod-8, v6e-8: one VM), which libtpu describes as two hosts of 4 unless
# told the host's bounds
ONE_HOST_SLICES = {("v5e", "2x4"), ("v5litepod", "2x4"), ("v6e", "2x4")}


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    platform: str  # "tpu", "cpu" or "gpu"
    chip: str  # "v5p", "cpu", "h100", ...
    count: int
    hbm_bytes: int | None  # per chip; None for host devices
    devices: tuple = ()  # empty for a GPU target (nothing to compile for)


def tpu_compiler_installed() -> bool:
    """Whether jax finds libtpu: the libtpu package, or a library named by TPU_LIBRARY_PATH."""
    return importlib.util.find_spec("libtpu") is not None or os.path.isfile(os.environ.get("TPU_LIBRARY_PATH", ""))


def parse_target(name: str) -> Target:
    """`v5p:2x4x4` (TPU topology), `cpu:N` or `gpu:h100x8`; ConfigError naming what is wrong."""
    kind, _, rest = name.partition(":")
    if kind == "cpu":
        if not rest.isdigit() or int(rest) < 1:
            raise ConfigError(f"--topology {name!r}: write cpu:N with N >= 1 host devices")
        devices = jax.devices("cpu")
        if len(devices) < int(rest):
            raise ConfigError(f"--topology {name}: only {len(devices)} host device(s); set XLA_FLAGS="
                              f"--xla_force_host_platform_device_count={rest} before jax starts")
        return Target(name, "cpu", "cpu", int(rest), None, tuple(devices[: int(rest)]))
    if kind == "gpu":
        found = re.fullmatch(r"([a-z0-9]+)x(\d+)", rest)
        if not found or found.group(1) not in GPU_HBM_GIB or int(found.group(2)) < 1:
            raise ConfigError(f"--topology {name!r}: write gpu:<chip>x<count>, chip one of {sorted(GPU_HBM_GIB)}")
        chip = found.group(1)
        return Target(name, "gpu", chip, int(found.group(2)), GPU_HBM_GIB[chip] * GiB)
    if kind not in TPU_HBM_GIB:
        raise ConfigError(f"--topology {name!r}: unknown target; use a TPU topology ({', '.join(TPU_HBM_GIB)} as "
                          "in v5p:2x4x4), cpu:N or gpu:<chip>x<count>")
    # libtpu loads here; its machine-wide lock would bar a second process (a test run, a benchmark) using it
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        from jax.experimental import topologies

        bounds = {"chips_per_host_bounds": [2, 4, 1]} if (kind, rest) in ONE_HOST_SLICES else {}
        devices = topologies.get_topology_desc(platform="tpu", topology_name=name, **bounds).devices
    except Exception as err:  # no libtpu, or a shape libtpu does not know
        if not tpu_compiler_installed():
            raise ConfigError(f"--topology {name}: compiling for a TPU target needs libtpu; install the tpu extra "
                              "(pip install -e '.[tpu]')") from None
        raise ConfigError(f"--topology {name}: libtpu cannot describe this slice ({' '.join(str(err).split())[:300]})"
                          ) from None
    return Target(name, "tpu", kind, len(devices), TPU_HBM_GIB[kind] * GiB, tuple(devices))


def chips_slice(target: Target, devices) -> tuple:
    """`devices` of a TPU target as a slice of their own (e.g. v6e:2x2 of v6e:4x4): a program on some chips of a
    larger topology does not compile (XLA:TPU numbers its devices within the program). Host devices as they are."""
    devices = tuple(devices)
    if target.platform != "tpu" or len(devices) == target.count:
        return devices
    coords = np.asarray([d.coords for d in devices])
    dims = coords.max(axis=0) - coords.min(axis=0) + 1
    if target.chip in ("v5e", "v5litepod", "v6e"):  # 2-D slices
        dims = dims[:2]
    if int(np.prod(dims)) != len(devices):
        raise ConfigError(f"{len(devices)} chips of {target.name} from chip {devices[0].id} on do not form a "
                          "rectangular slice: choose a mesh and decode.devices that split the topology into slices")
    return parse_target(f"{target.chip}:{'x'.join(str(int(n)) for n in dims)}").devices


def host_slice(target: Target, mesh) -> tuple | None:
    """Host 0's chips of a TPU mesh spanning several hosts, as a slice of their own (`chips_slice`): a host's decode
    program spans only its own chips. None when the mesh is one host's."""
    local = [d for d in mesh.devices.flat if d.process_index == 0]
    if target.platform != "tpu" or len(local) == mesh.devices.size:
        return None
    return chips_slice(target, local)
