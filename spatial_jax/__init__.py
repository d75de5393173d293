"""spatial-jax: JAX-native RL post-training of vision-language models with spatially grounded rewards."""

from spatial_jax import platforms

__version__ = "0.1.0"

# first, so that every entry point (the CLI, tools/, benchmarks/) settles it before any of its modules imports jax
platforms.settle()
