"""Compile time of the vision tower's train step for a TPU slice (XLA:TPU from this host, libtpu needed), with the
architecture's DeepStack taps (one scan segment per tap) against none (one scan), same depth.

  python benchmarks/kernels/vision_taps_tpu.py [--model qwen3-vl-8b] [--topology v5p:2x2x1] [--images 4] [--side 32]
"""

from __future__ import annotations

import argparse
import copy
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import topologies
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spatial_jax.models import prepare_vision_inputs
from spatial_jax.models.registry import config_from_hf
from spatial_jax.models.sharding import make_mesh
from spatial_jax.models.vision import VisionTower
from spatial_jax.rl.plan.measure import mosaic_kernels
from spatial_jax.rl.plan.shapes import ARCHITECTURES, _placed


def measure(model: str, taps: tuple[int, ...], mesh, images: int, side: int) -> dict:
    hf = copy.deepcopy(ARCHITECTURES[model])
    hf["vision_config"]["deepstack_visual_indexes"] = list(taps)
    mc = config_from_hf(hf).replace(dtype="bfloat16", param_dtype="float32", scan_layers=True)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: VisionTower(mc, rngs=nnx.Rngs(0))))
    params = _placed(params, mesh)
    grids = np.asarray([[1, side, side]] * images)
    pixels = np.zeros((images * side * side, mc.vision.patch_dim), np.float32)
    inputs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=NamedSharding(mesh, P())),
                          prepare_vision_inputs(pixels, grids, mc.vision))

    def loss(p, inputs):
        merged, deepstack = nnx.merge(graphdef, p)(inputs)
        return sum(jnp.sum(jnp.square(o.astype(jnp.float32))) for o in (merged, *deepstack))

    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = jax.jit(jax.grad(loss)).lower(params, inputs)
        t1 = time.perf_counter()
        compiled = lowered.compile()
    t2 = time.perf_counter()
    text = compiled.as_text()
    return {"taps": taps, "segments": len(set(taps) | {mc.vision.depth - 1}), "lower_s": t1 - t0,
            "compile_s": t2 - t1, "mosaic": mosaic_kernels(text)[0], "hlo_lines": len(text.splitlines())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-vl-8b", choices=sorted(ARCHITECTURES))
    p.add_argument("--topology", default="v5p:2x2x1")
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--side", type=int, default=32, help="patches per image side")
    args = p.parse_args()
    devices = topologies.get_topology_desc(platform="tpu", topology_name=args.topology).devices
    mesh = make_mesh(1, 2, 2, devices=devices[:4])
    taps = tuple(ARCHITECTURES[args.model]["vision_config"]["deepstack_visual_indexes"])
    print("| taps | scan segments | lower s | compile s | Mosaic kernels | HLO lines |\n|---|---|---|---|---|---|")
    for t in ((), taps):
        r = measure(args.model, t, mesh, args.images, args.side)
        print(f"| {list(r['taps']) or 'none'} | {r['segments']} | {r['lower_s']:.1f} | {r['compile_s']:.1f} | "
              f"{r['mosaic']} | {r['hlo_lines']:,} |", flush=True)


if __name__ == "__main__":
    main()
