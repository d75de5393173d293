"""The one home of the platform check: which platform a program is compiled for, so that every kernel picks its
implementation (and Pallas its interpret mode) alike."""

from __future__ import annotations

import jax


def active_platform() -> str:
    """The platform of the devices the program is compiled for: the active mesh's (jax.set_mesh), else the default
    backend's. A TPU slice described from a CPU host (`spatial-jax plan`) is then "tpu", not the host's "cpu"."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh is None or mesh.empty else mesh.abstract_device
    return device.platform if device is not None else jax.default_backend()
