"""The MoE layer's expert parallelism compiled by XLA:TPU from this CPU host (libtpu, jax.experimental.topologies;
no TPU needed): one Qwen3-VL-30B-A3B sparse layer (D 2048, 128 experts of 768, top 8, bf16 compute, float32
masters) on a TPU slice, experts and tokens over the fsdp axis, side by side in one process, two ways of placing
the experts:
  all-to-all  models.moe as it runs: shard_map, tokens to their experts' chips and back (three all-to-alls)
  xla         the same layer with expert parallelism switched off: for ragged_dot XLA's partitioner is left to place
              the grouped matmul over expert-sharded weights (what models.moe did before); megablox, which XLA
              cannot partition, then runs every expert on each chip's tokens in shard_map (weights gathered)
times two grouped matmuls for the experts (ModelConfig.moe_matmul, kernels/grouped_matmul/):
  ragged_dot  XLA's jax.lax.ragged_dot (which XLA:TPU lowers to its own Mosaic kernels, ragged-dot-*)
  megablox    jax's Pallas TPU grouped matmul (gmm forward; gmm and tgmm backward), default tiles
For each, the forward (`fwd`) and the gradient of sum(y * g) in the input and the weights (`fwd_bwd`): collective
call sites in the compiled HLO, Mosaic kernel call sites of each grouped matmul (evidence of which one runs),
per-chip memory (XLA's memory analysis: argument, temp, peak = argument + output - alias + temp) and compile seconds.

    python benchmarks/training/moe_tpu_compile.py                      # v5p:2x2x1 (4 chips), 8 rows x 512 tokens
    python benchmarks/training/moe_tpu_compile.py --paths all-to-all --matmul megablox ragged_dot
    python benchmarks/training/moe_tpu_compile.py --topology v5p:2x4x4 --rows 32 --tokens 1024
Writes benchmarks/out/moe_tpu_compile.json (or --out) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path
from unittest import mock

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spatial_jax.cli.script_guard import check_counts, check_own_output, write_own
from spatial_jax.config import ConfigError
from spatial_jax.kernels.grouped_matmul import IMPLS, kernel_calls
from spatial_jax.models import moe
from spatial_jax.models.registry import config_from_hf
from spatial_jax.models.sharding import logical_to_spec, make_mesh, variable_names
from spatial_jax.rl.plan.measure import collective_calls, fmt_bytes
from spatial_jax.rl.plan.shapes import ARCHITECTURES
from spatial_jax.rl.plan.targets import parse_target

OUT = Path(__file__).resolve().parents[1] / "out" / "moe_tpu_compile.json"
OWNER = Path(__file__).name
COLLECTIVES = ("all-to-all", "all-gather", "reduce-scatter", "all-reduce", "collective-permute")
PATHS = ("all-to-all", "xla")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topology", default="v5p:2x2x1")
    p.add_argument("--rows", type=int, default=8, help="batch rows (over the fsdp axis: every chip's tokens)")
    p.add_argument("--tokens", type=int, default=512, help="tokens a row")
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS), help="expert placements to compile")
    p.add_argument("--matmul", nargs="+", choices=IMPLS, default=list(IMPLS), help="grouped matmuls to compile")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    try:
        check_counts({"--rows": (args.rows, 1, 2**16), "--tokens": (args.tokens, 1, 2**20)})
        check_own_output(args.out, "--out", OWNER)
        args.target = parse_target(args.topology)
    except ConfigError as e:
        p.error(str(e))
    return args


def collectives(hlo: str) -> dict[str, int]:
    return {op: collective_calls(hlo, op) for op in COLLECTIVES}


def main(argv=None) -> None:
    args = parse_args(argv)
    target = args.target
    mesh = make_mesh(1, target.count, 1, devices=target.devices)
    hf = copy.deepcopy(ARCHITECTURES["qwen3-vl-30b-a3b"])
    hf["text_config"]["num_hidden_layers"] = 1
    hf["vision_config"]["deepstack_visual_indexes"] = [0]
    mc = config_from_hf(hf).replace(dtype="bfloat16", param_dtype="float32")
    D = mc.text.hidden_size
    x = jax.ShapeDtypeStruct((args.rows, args.tokens, D), jnp.bfloat16, sharding=NamedSharding(mesh, P("fsdp")))

    def placed(v):
        names = variable_names(v) or (None,) * v.ndim
        spec = logical_to_spec(names, v.shape, mesh)
        return jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, spec))

    def programs(matmul):  # fresh functions for each path: jax would reuse a traced one, whatever is patched
        layer = nnx.eval_shape(lambda: moe.SparseMoE(mc.replace(moe_matmul=matmul), rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(layer)
        params = jax.tree.map(placed, state, is_leaf=lambda v: isinstance(v, nnx.Variable))

        def fwd(params, x):
            return nnx.merge(graphdef, params)(x)

        def fwd_bwd(params, x, g):
            return jax.grad(lambda p, x: jnp.sum(fwd(p, x).astype(jnp.float32) * g), argnums=(0, 1))(params, x)

        # outputs laid out as a train step keeps them: y and dx like x, the weights' gradients like the weights
        # (left to XLA, megablox's weight gradients without expert parallelism would come out whole on every chip)
        like = jax.tree.map(lambda a: a.sharding, (params, x))
        return (("fwd", fwd, (params, x), like[1]), ("fwd_bwd", fwd_bwd, (params, x, x), like))

    rows = []
    for mode in args.paths:
        for matmul in args.matmul:
            off = mock.patch.object(moe, "expert_parallel_axes", lambda *a: None) if mode == "xla" \
                else mock.MagicMock()
            for name, fn, fargs, out_shardings in programs(matmul):
                t0 = time.perf_counter()
                with off, jax.set_mesh(mesh):
                    compiled = jax.jit(fn, out_shardings=out_shardings).lower(*fargs).compile()
                seconds = time.perf_counter() - t0
                mem = compiled.memory_analysis()
                peak = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes \
                    + mem.temp_size_in_bytes
                hlo = compiled.as_text()
                kernels = {f"{k}_kernels": n for k, n in kernel_calls(hlo).items()}
                rows.append({"mode": mode, "matmul": matmul, "program": name, "compile_s": seconds,
                             "argument": mem.argument_size_in_bytes, "temp": mem.temp_size_in_bytes, "peak": peak,
                             **collectives(hlo), **kernels})
                print(f"{mode} {matmul} {name}: {rows[-1]}", flush=True)
                write_own(args.out, {"topology": args.topology, "rows": args.rows, "tokens": args.tokens,
                                     "results": rows}, OWNER)
    print(f"\n{args.topology} ({target.count} chips, fsdp={target.count}), {args.rows} rows x {args.tokens} tokens\n")
    print("| path | matmul | program | Mosaic kernels (megablox / ragged-dot) | all-to-all | all-gather | "
          "reduce-scatter | all-reduce | argument | temp | peak | compile (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['matmul']} | {r['program']} | {r['megablox_kernels']} / {r['ragged_dot_kernels']} "
              f"| {r['all-to-all']} | {r['all-gather']} | {r['reduce-scatter']} | {r['all-reduce']} | "
              f"{fmt_bytes(r['argument'])} | {fmt_bytes(r['temp'])} | {fmt_bytes(r['peak'])} | {r['compile_s']:.0f} |")


if __name__ == "__main__":
    main()
