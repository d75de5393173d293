"""Fused log-prob / entropy kernels (imported as spatial_jax.kernels)."""
