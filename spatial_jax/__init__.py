"""spatial-jax: JAX-native RL post-training of vision-language models with spatially grounded rewards."""

__version__ = "0.1.0"
