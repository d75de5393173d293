"""Fused log-prob / entropy from hidden states and the LM head without [tokens x vocab] logits: one entry point
choosing the implementation per backend (xla.py, chunked pure JAX; pallas.py, TPU; triton_kernel.py, NVIDIA GPUs),
their shared math (common.py), and beside them the references they are held to (reference.py, materialised logits in
JAX; reference_torch.py, float64 torch)."""

from __future__ import annotations

import jax

from spatial_jax.kernels.platform import active_platform

from . import pallas, reference, xla

IMPLS = ("auto", "naive", "xla", "pallas")


def resolve_impl(impl: str, platform: str | None = None) -> str:
    """"auto" -> "pallas" on TPU, "xla" elsewhere (CPU and GPU), for `platform` (default: that of the active mesh's
    devices, else the default backend); other names are checked and returned."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}; got {impl!r}")
    if impl == "auto":
        return "pallas" if (platform or active_platform()) == "tpu" else "xla"
    return impl


def linear_logprob_entropy(
    h: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    *,
    impl: str = "auto",
    temperature: float = 1.0,
    block_n: int | None = None,
    block_v: int | None = None,
    block_d: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """h [N, D], w [D, V], targets [N] int -> (log p(target) [N], entropy [N]) of softmax(h @ w / T), float32.

    Inputs may be float32 or bfloat16. "xla" and "pallas" never hold [N, V] and differentiate h and w through one
    custom VJP; "naive" materialises the logits (reference). Block sizes left as None use the implementation's
    defaults; block_d applies to "pallas" only. A target outside [0, V) gets a nan log-prob (its entropy is kept).
    """
    impl = resolve_impl(impl)
    if impl == "naive":
        return reference.linear_logprob_entropy(h, w, targets, temperature=temperature)
    blocks = {k: v for k, v in (("block_n", block_n), ("block_v", block_v)) if v is not None}
    if impl == "xla":
        if block_d is not None:
            raise ValueError("block_d applies to impl='pallas' only")
        return xla.linear_logprob_entropy(h, w, targets, temperature=temperature, **blocks)
    return pallas.linear_logprob_entropy(h, w, targets, temperature=temperature, block_d=block_d, **blocks)
