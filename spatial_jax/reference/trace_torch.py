"""How the torch references read a token trace, written apart from spatial_jax.rewards.uncertainty.

A token counts only when its offsets lie in the completion, 0 <= start < end <= len(completion), and its entropy is
a number in [-ENTROPY_ROUNDING, ENTROPY_LIMIT] nats (a negative one is float32 rounding and reads 0); any other
token is left out as if the trace lacked it (a NaN entropy is the records' "missing"; a more negative, infinite or
absurd one cannot be an entropy). Tokens past the end of the shorter of the two sequences lack an entropy or
offsets and are left out too.
"""

from __future__ import annotations

import torch

from spatial_jax.records import ENTROPY_LIMIT, ENTROPY_ROUNDING

DTYPE = torch.float64


def usable_tokens(completion: str, entropies, offsets) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """([start, end) of each usable token, their entropies [U]), in trace order."""
    spans, values = [], []
    for (s, e), h in zip(offsets, entropies):
        h = float(h)
        if 0 <= s < e <= len(completion) and -ENTROPY_ROUNDING <= h <= ENTROPY_LIMIT:  # NaN fails the comparison
            spans.append((int(s), int(e)))
            values.append(max(h, 0.0))
    return spans, torch.tensor(values, dtype=DTYPE)
