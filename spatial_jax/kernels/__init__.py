"""Fused log-prob / entropy kernels (imported as spatial_jax.kernels).

linear_logprob_entropy(h, w, targets, impl=...) gives per-token log p(target) and full-vocabulary entropy from final
hidden states and the LM head without holding [N, V]; position_entropy and coordinate_uncertainty give entropy at
chosen positions only and the box uncertainty of eq. 5 (SpatialCORE).
"""

from .logprob_entropy import IMPLS, linear_logprob_entropy, resolve_impl
from .position import coordinate_uncertainty, position_entropy

__all__ = ["IMPLS", "coordinate_uncertainty", "linear_logprob_entropy", "position_entropy", "resolve_impl"]
