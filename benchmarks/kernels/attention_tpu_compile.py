"""Compile one attention layer's train step (value_and_grad) with the real XLA:TPU compiler from a CPU host (libtpu,
no TPU needed), splash attention against the XLA path (query blocks of `--chunk`), side by side: per-chip
memory_analysis() figures and compile time. Batch over `data`, heads over `tensor` (a 2 x 2 mesh), bfloat16.

  python benchmarks/kernels/attention_tpu_compile.py              # decoder and vision shapes, v5p:2x2x1 and v6e:2x2
  python benchmarks/kernels/attention_tpu_compile.py --topology v5p:2x2x1 --case vision
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spatial_jax.models.attention import AttentionMask, attention

# rows, length, heads, kv heads, head_dim, model dim, causal: an 8B decoder layer at 4096 tokens (2 rows per data
# shard), and the Qwen3-VL vision block at 16 frames of 1024 patches
CASES = {"decoder": (4, 4096, 32, 8, 128, 4096, True), "vision": (16, 1024, 16, 16, 72, 1152, False)}


def compile_layer(topology: str, case: str, impl: str, chunk: int):
    B, T, H, Hkv, D, E, causal = CASES[case]
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    mesh = Mesh(np.asarray(devices).reshape(2, 1, 2), ("data", "fsdp", "tensor"))

    def step(x, seg, *ws):
        def loss(ws):
            wq, wk, wv, wo = ws
            q, k, v = (jnp.einsum("bte,ehd->bthd", x, w) for w in (wq, wk, wv))
            out = attention(q, k, v, AttentionMask(segment_ids=seg, causal=causal), scale=D**-0.5, impl=impl,
                            chunk=chunk)
            return jnp.mean(jnp.square(jnp.einsum("bthd,hde->bte", out, wo).astype(jnp.float32)))

        return jax.value_and_grad(loss)(ws)

    def arg(shape, spec, dt=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, P(*spec)))

    args = (arg((B, T, E), (("data", "fsdp"), None, None)), arg((B, T), (("data", "fsdp"), None), jnp.int32),
            arg((E, H, D), (None, "tensor", None)), arg((E, Hkv, D), (None, "tensor", None)),
            arg((E, Hkv, D), (None, "tensor", None)), arg((H, D, E), ("tensor", None, None)))
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        compiled = jax.jit(step).lower(*args).compile()
    return compiled, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topology", nargs="+", default=["v5p:2x2x1", "v6e:2x2"])
    ap.add_argument("--case", nargs="+", default=sorted(CASES), choices=sorted(CASES))
    ap.add_argument("--chunk", type=int, default=1024, help="the XLA path's query block")
    args = ap.parse_args()
    mib = 2**20
    print("| topology | case | impl | kernels | args MiB | temp MiB | out MiB | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for topology in args.topology:
        for case in args.case:
            for impl in ("splash", "xla"):
                compiled, seconds = compile_layer(topology, case, impl, args.chunk)
                m = compiled.memory_analysis()
                kernels = compiled.as_text().count('custom_call_target="tpu_custom_call"')
                print(f"| {topology} | {case} | {impl} | {kernels} | {m.argument_size_in_bytes / mib:.1f} | "
                      f"{m.temp_size_in_bytes / mib:.1f} | {m.output_size_in_bytes / mib:.1f} | {seconds:.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()
