"""Splash attention compiled by XLA:TPU (libtpu, no TPU needed) for a v5p and a v6e slice inside a sharded train
step: the decoder's causal + padding case (GQA) and the vision tower's per-frame case (head_dim 72), batch over
`data`, heads over `tensor`, kernel in shard_map; forward and backward are Mosaic kernels."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from test_kernels_pallas_tpu import _tpu_topology

from spatial_jax.models.attention import AttentionMask, attention

# (batch rows, length, heads, kv heads, head_dim, model dim, causal): small shapes keep the compile short; the
# recipe shapes' figures are in benchmarks/RESULTS.md
CASES = {"decoder": (4, 1024, 8, 4, 128, 512, True), "vision": (8, 1024, 4, 4, 72, 288, False)}


def compile_step(topology: str, dtype=jnp.bfloat16):
    """One train step holding both cases: value_and_grad of a loss over a decoder and a vision attention layer."""
    mesh = Mesh(np.asarray(_tpu_topology(topology)).reshape(2, 1, 2), ("data", "fsdp", "tensor"))

    def layer(x, seg, ws, case):
        B, T, H, Hkv, D, E, causal = CASES[case]
        wq, wk, wv, wo = ws
        q, k, v = (jnp.einsum("bte,ehd->bthd", x, w) for w in (wq, wk, wv))
        out = attention(q, k, v, AttentionMask(segment_ids=seg, causal=causal), scale=D**-0.5, impl="auto")
        return jnp.mean(jnp.square(jnp.einsum("bthd,hde->bte", out, wo).astype(jnp.float32)))

    def step(inputs, weights):
        def loss(weights):
            return sum(layer(*inputs[c], weights[c], c) for c in sorted(CASES))

        return jax.value_and_grad(loss)(weights)

    def arg(shape, spec, dt=dtype):
        return jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, P(*spec)))

    inputs, weights = {}, {}
    for case, (B, T, H, Hkv, D, E, _) in CASES.items():
        inputs[case] = (arg((B, T, E), (("data", "fsdp"), None, None)),
                        arg((B, T), (("data", "fsdp"), None), jnp.int32))
        weights[case] = (arg((E, H, D), (None, "tensor", None)), arg((E, Hkv, D), (None, "tensor", None)),
                         arg((E, Hkv, D), (None, "tensor", None)), arg((H, D, E), ("tensor", None, None)))
    with jax.set_mesh(mesh):  # impl="auto" picks splash from the mesh's TPU devices
        return jax.jit(step).lower(inputs, weights).compile()


@pytest.mark.parametrize("topology", ["v5p:2x2x1", "v6e:2x2"])
def test_splash_compiles_in_a_sharded_train_step(topology):
    compiled = compile_step(topology)
    # forward, dq and dkv kernels of both layers, each per shard (a Mosaic kernel outside shard_map would not
    # lower on 4 chips)
    assert compiled.as_text().count('custom_call_target="tpu_custom_call"') >= 6
    mem = compiled.memory_analysis()
    # per chip: no [T, T] float32 score matrix of its 2 rows x H/2 heads of either layer is ever held
    scores = sum((B // 2) * (H // 2) * T * T * 4 for B, T, H, *_ in CASES.values())
    assert mem.temp_size_in_bytes < scores // 2


def test_splash_with_a_causal_offset_compiles_in_a_sharded_train_step():
    """A shared-prefix update's completion attention: T queries over their prompt's P keys and their own, in
    splash (CausalMask with offset P) under shard_map, forward and backward, for a v5p slice."""
    mesh = Mesh(np.asarray(_tpu_topology("v5p:2x2x1")).reshape(2, 1, 2), ("data", "fsdp", "tensor"))
    B, T, Pre, H, Hkv, D = 4, 384, 640, 8, 4, 128

    def loss(q, k, v, seg, kv_seg):
        mask = AttentionMask(segment_ids=seg, kv_segment_ids=kv_seg, causal=True, causal_offset=Pre)
        return jnp.mean(jnp.square(attention(q, k, v, mask, scale=D**-0.5, impl="auto").astype(jnp.float32)))

    def arg(shape, spec, dt=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, P(*spec)))

    heads = (("data", "fsdp"), None, "tensor", None)
    args = (arg((B, T, H, D), heads), arg((B, Pre + T, Hkv, D), heads), arg((B, Pre + T, Hkv, D), heads),
            arg((B, T), (("data", "fsdp"), None), jnp.int32), arg((B, Pre + T), (("data", "fsdp"), None), jnp.int32))
    with jax.set_mesh(mesh):
        compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
    assert compiled.as_text().count('custom_call_target="tpu_custom_call"') >= 3  # forward, dq, dkv
