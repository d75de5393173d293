"""On a host without a TPU chip, no command prints libtpu's failed initialisation (issue 36 item 21): jax starts on
the CPU without loading libtpu, and libtpu, loaded to describe a TPU target as `plan` does, asks no metadata
server."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spatial_jax import platforms

ROOT = Path(__file__).resolve().parents[1]
SETTLED = ("JAX_PLATFORMS", "TPU_HOST_BOUNDS", "TPU_WORKER_HOSTNAMES", "JAX_FORCE_TPU_INIT")


@pytest.fixture
def bare_env(monkeypatch):
    for name in SETTLED:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _devices(monkeypatch, present: set[str]):
    monkeypatch.setattr(platforms, "_present", lambda patterns: bool(present & set(patterns)))


def test_a_host_without_accelerators_starts_on_the_cpu(bare_env):
    _devices(bare_env, set())
    platforms.settle()
    assert os.environ["JAX_PLATFORMS"] == "cpu"
    assert os.environ["TPU_HOST_BOUNDS"] == "1,1,1" and os.environ["TPU_WORKER_HOSTNAMES"] == "localhost"


def test_a_gpu_host_keeps_jax_choosing(bare_env):
    _devices(bare_env, {"/dev/nvidiactl"})
    platforms.settle()
    assert "JAX_PLATFORMS" not in os.environ and os.environ["TPU_HOST_BOUNDS"] == "1,1,1"


@pytest.mark.parametrize("force", [False, True])
def test_a_tpu_host_is_left_to_libtpu(bare_env, force):
    _devices(bare_env, set() if force else {"/dev/accel*"})
    if force:
        bare_env.setenv("JAX_FORCE_TPU_INIT", "1")
    platforms.settle()
    assert not {"JAX_PLATFORMS", "TPU_HOST_BOUNDS", "TPU_WORKER_HOSTNAMES"} & set(os.environ)


def test_the_users_platform_is_kept(bare_env):
    _devices(bare_env, set())
    bare_env.setenv("JAX_PLATFORMS", "tpu")
    platforms.settle()
    assert os.environ["JAX_PLATFORMS"] == "tpu"


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed: nothing to print")
@pytest.mark.skipif(platforms._present(platforms.TPU_DEVICES + platforms.GPU_DEVICES),
                    reason="an accelerator is attached: libtpu or jax rightly probes it")
def test_no_libtpu_line_on_a_cpu_host():
    """A fresh process as a user starts one (no JAX_PLATFORMS): jax's devices, then a TPU slice described."""
    code = ("import spatial_jax, jax; print(jax.devices()[0].platform)\n"
            "from jax.experimental import topologies\n"
            "print(len(topologies.get_topology_desc(platform='tpu', topology_name='v5p:2x2x1').devices))\n")
    env = {k: v for k, v in os.environ.items() if k not in SETTLED}
    env.update(PYTHONPATH=str(ROOT), ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cpu", "4"]
    assert done.stderr == ""
