"""The one home of the platform check: which platform a program is compiled for, so that every kernel picks its
implementation (and Pallas its interpret mode) alike."""

from __future__ import annotations

import jax


def compiled_device(mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None):
    """The abstract device programs are compiled for: `mesh`'s (default: the active one, jax.set_mesh); None without
    a mesh."""
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if isinstance(mesh, jax.sharding.Mesh):
        mesh = mesh.abstract_mesh
    return None if mesh is None or mesh.empty else mesh.abstract_device


def active_platform(mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None) -> str:
    """The platform of the devices the program is compiled for: `mesh`'s (default: the active one), else the default
    backend's. A TPU slice described from a CPU host (`spatial-jax plan`) is then "tpu", not the host's "cpu"."""
    device = compiled_device(mesh)
    return device.platform if device is not None else jax.default_backend()
