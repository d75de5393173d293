"""The platform jax starts on, settled before jax starts its backends.

jax loads libtpu whenever it is installed (the test and tpu extras install it, so that `plan` and the tests compile
for TPU slices from any host) and, on a host without a TPU chip, libtpu asks a metadata server that is not there and
prints the failure (accelerator type, worker hostnames, an INVALID_ARGUMENT trace) before jax falls back to the CPU.
"""

from __future__ import annotations

import glob
import os
import platform
from pathlib import Path

# A TPU chip is reached through /dev/accel<N> (v2 to v5p) or a VFIO group /dev/vfio/<N> (v5e and later); a GPU
# through the driver's device files (NVIDIA, WSL2, AMD), as jax itself looks for them.
TPU_DEVICES = ("/dev/accel*", "/dev/vfio/[0-9]*")
GPU_DEVICES = ("/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def _present(patterns: tuple[str, ...]) -> bool:
    return any(glob.glob(pattern) for pattern in patterns)


def settle() -> None:
    """Before jax is imported, on a host without a TPU chip: libtpu is told this machine is one host with no TPU
    workers (it then only describes targets, as for `plan`, and asks no metadata server), and with no GPU either,
    jax starts on the CPU without loading libtpu. A platform the user chose (JAX_PLATFORMS) is kept."""
    if _present(TPU_DEVICES) or "JAX_FORCE_TPU_INIT" in os.environ:
        return
    os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    if not _present(GPU_DEVICES):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def cpu_name() -> str:
    """The host's CPU model ("AMD EPYC ..."), as the benchmark tables name their machine."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine())
