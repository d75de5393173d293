"""The rollout layer: the jitted KV-cache sampler, single-turn and multi-turn (tool) rollouts, ProSR blank rollouts,
and `collect`, the one entry point that training and evaluation both call.

Layered as gemma's samplers are: `sampler` (prefill / extend / decode) and `engine` (continuous batching over a
paged KV cache; SamplingConfig.engine picks one) <- `completions` (prompts -> G completions with text and token
offsets) <- `multiturn` (tool turns, with `tools`) <- `collect` (what a method needs).
"""

from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.sampler import SampleOutput, SamplerState, decode, extend, generate, init_state, prefill

__all__ = ["SampleOutput", "SamplerState", "SamplingConfig", "decode", "extend", "generate", "init_state", "prefill"]
