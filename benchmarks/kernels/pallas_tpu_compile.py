"""Compile the Pallas LM-head kernel with the real XLA:TPU compiler from a CPU host (libtpu, no TPU needed).

For each topology x dtype x mode: lowers and compiles under a (data, tensor) mesh of the topology's chips, in
shard_map (tokens over `data`, vocabulary over `tensor`), and prints the compile time, the per-chip
memory_analysis() figures, and the scoped VMEM of each Pallas kernel, read from Mosaic's own
CompileTimeScopedVmemOom messages by compiling again under limits too small (scoped_vmem_bytes).

  python benchmarks/kernels/pallas_tpu_compile.py                       # all combos at the recipe shape
  python benchmarks/kernels/pallas_tpu_compile.py --topology v6e:2x2 --dtype bfloat16 --mode fwd_bwd --no-vmem-probe
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # libtpu's machine-wide lock would bar a parallel test run
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spatial_jax.kernels.logprob_entropy import pallas

TOPOLOGIES = ("v5p:2x2x1", "v6e:2x2")
DTYPES = ("float32", "bfloat16")
MODES = ("fwd", "fwd_bwd")


def mesh_for(topology: str, tensor: int = 2) -> Mesh:
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    return Mesh(np.asarray(devices).reshape(len(devices) // tensor, tensor), ("data", "tensor"))


def step(mesh: Mesh, mode: str, **kernel_kwargs):
    """The jitted step: the kernel's outputs (fwd), or value_and_grad of sum(g1 * log p + g2 * H) (fwd_bwd)."""

    def loss(h, w, targets, g_lp, g_h):
        lp, ent = pallas.linear_logprob_entropy(h, w, targets, mesh=mesh, **kernel_kwargs)
        return jnp.sum(g_lp * lp + g_h * ent)

    if mode == "fwd":
        return jax.jit(lambda h, w, t, g_lp, g_h: pallas.linear_logprob_entropy(h, w, t, mesh=mesh, **kernel_kwargs))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def abstract_args(mesh: Mesh, n: int, d: int, v: int, dtype):
    rows = NamedSharding(mesh, P("data"))
    return (
        jax.ShapeDtypeStruct((n, d), dtype, sharding=NamedSharding(mesh, P("data", None))),
        jax.ShapeDtypeStruct((d, v), dtype, sharding=NamedSharding(mesh, P(None, "tensor"))),
        jax.ShapeDtypeStruct((n,), jnp.int32, sharding=rows),
        jax.ShapeDtypeStruct((n,), jnp.float32, sharding=rows),
        jax.ShapeDtypeStruct((n,), jnp.float32, sharding=rows),
    )


def compile_step(topology: str, dtype: str, mode: str, n: int, d: int, v: int, **kernel_kwargs):
    """(compiled executable, compile seconds)."""
    mesh = mesh_for(topology)
    start = time.perf_counter()
    compiled = step(mesh, mode, **kernel_kwargs).lower(*abstract_args(mesh, n, d, v, jnp.dtype(dtype))).compile()
    return compiled, time.perf_counter() - start


def scoped_vmem_bytes(topology: str, dtype: str, mode: str, n: int, d: int, v: int) -> list[int]:
    """The scoped VMEM Mosaic allocates for each kernel of the step, ascending. Read from its out-of-memory message
    ("Scoped allocation with size X"): compile at a 1 MiB limit, then again at each reported size, until it fits."""
    sizes, limit = [], pallas.MiB
    while True:
        try:
            compile_step(topology, dtype, mode, n, d, v, vmem_limit_bytes=limit)
            return sizes
        except Exception as err:
            found = re.search(r"[Ss]coped allocation with size ([0-9.]+)([KMG])", str(err))
            if not found:
                raise
            size = int(float(found.group(1)) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[found.group(2)])
            sizes.append(size)
            limit = size + pallas.MiB // 4  # the message rounds to 0.01 M


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", choices=TOPOLOGIES, action="append")
    parser.add_argument("--dtype", choices=DTYPES, action="append")
    parser.add_argument("--mode", choices=MODES, action="append")
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--d", type=int, default=4096)
    parser.add_argument("--v", type=int, default=151_936)
    parser.add_argument("--no-vmem-probe", action="store_true")
    args = parser.parse_args()
    print("| topology | dtype | mode | blocks (n, v, d) / VMEM limit | compile s | temp | argument | output | "
          "scoped VMEM per kernel |")
    print("|---|---|---|---|---|---|---|---|---|")
    for topology in args.topology or TOPOLOGIES:
        kind = mesh_for(topology).devices.flat[0].device_kind
        for dtype in args.dtype or DTYPES:
            *blocks, limit = pallas.default_blocks(kind, args.d, jnp.dtype(dtype))
            for mode in args.mode or MODES:
                compiled, seconds = compile_step(topology, dtype, mode, args.n, args.d, args.v)
                mem = compiled.memory_analysis()
                vmem = [] if args.no_vmem_probe else scoped_vmem_bytes(topology, dtype, mode, args.n, args.d, args.v)
                figures = [f"{getattr(mem, f'{k}_size_in_bytes') / pallas.MiB:,.0f} MiB"
                           for k in ("temp", "argument", "output")]
                vmem_text = ", ".join(f"{x / pallas.MiB:.2f}" for x in vmem) + " MiB" if vmem else "-"
                print(f"| {topology} ({kind}) | {dtype} | {mode} | {tuple(blocks)} / {limit // pallas.MiB} MiB | "
                      f"{seconds:.1f} | {' | '.join(figures)} | {vmem_text} |", flush=True)


if __name__ == "__main__":
    main()
