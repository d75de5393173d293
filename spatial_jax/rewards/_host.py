"""Running small jitted reward pieces on the host in float64 (SPEC 7: scores are float64 on the host)."""

from __future__ import annotations

import contextlib

import jax


def _cpu():
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:
        return None


@contextlib.contextmanager
def host_float64():
    """Scoped x64 on the CPU device; leaves the process-wide JAX settings untouched."""
    dev = _cpu()
    with jax.enable_x64(True):
        if dev is None:
            yield
        else:
            with jax.default_device(dev):
                yield


def bucket(n: int, minimum: int) -> int:
    """Smallest power of two >= max(n, minimum): padded shapes come from a few buckets, so jit compiles rarely."""
    size = max(int(n), minimum, 1)
    return 1 << (size - 1).bit_length()
