"""`python -m spatial_jax.cli ...` runs the `spatial-jax` command (the multi-host test starts processes this way)."""

from spatial_jax.cli import entry

entry()
