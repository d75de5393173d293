"""The jitted KV-cache sampler: prefill, extend (multi-turn), decode; token choice and per-token statistics."""

from spatial_jax.sampling.config import SamplingConfig
from spatial_jax.sampling.sampler import (
    SampleOutput,
    SamplerState,
    decode,
    extend,
    generate,
    init_state,
    prefill,
)

__all__ = ["SampleOutput", "SamplerState", "SamplingConfig", "decode", "extend", "generate", "init_state", "prefill"]
