"""Box coordinate uncertainty (eq. 5, SpatialCORE) from the entropies of each coordinate's digit tokens.

Lives beside the kernels because `position.coordinate_uncertainty` fuses it with position entropy; the rewards import
it from here (kernels sit below rewards and import nothing of the project above them).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

LN10 = math.log(10.0)


def box_uncertainty_from_digits(
    digit_entropy: jax.Array, digit_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Eq. 5: H = clip(mean_c mean_{t in S_c} h_t / ln|D|, 0, 1) per box, and whether H is defined.

    digit_entropy, digit_mask: [..., 4, K]. Non-finite entropies count as masked. A box whose 4 coordinates do
    not each keep >= 1 usable digit has no uncertainty: has_uncertainty is False and H is 0 (so omega = 1).
    """
    usable = digit_mask & jnp.isfinite(digit_entropy)
    h = jnp.where(usable, digit_entropy, jnp.zeros((), digit_entropy.dtype))
    count = jnp.sum(usable, axis=-1)
    per_coord = jnp.sum(h, axis=-1) / jnp.maximum(count, 1).astype(h.dtype)
    has = jnp.all(count > 0, axis=-1)
    value = jnp.clip(jnp.mean(per_coord, axis=-1) / jnp.asarray(LN10, h.dtype), 0.0, 1.0)
    return jnp.where(has, value, jnp.zeros((), h.dtype)), has
