"""Benchmark the MoE layer (spatial_jax.models.moe): grouped matmul over the routed (token, expert) pairs
(`SparseMoE`, jax.lax.ragged_dot) against the dense loop over every expert on every token (`dense_moe`).

Both compute the same layer (checked here: max |difference| printed); the grouped one does N * k rows of expert
work, the loop N * E. Shapes default to one Qwen3-VL-30B-A3B layer (D 2048, 128 experts of 768, top 8) at a few
token counts; --quick is a small smoke run. In one process on the default JAX backend, per (N, mode):
  fwd      the layer's output
  fwd_bwd  the gradient of sum(y * g) in the input and every weight (router included)
Time: wall time of the compiled function, min over --repeats runs after a warm-up, the two implementations in
interleaved rounds so load hits them alike. Memory: XLA's compiled memory analysis,
  peak = temp + argument + output - alias bytes.

    python benchmarks/training/moe.py                 # N 512 2048, D 2048, E 128, I 768, k 8
    python benchmarks/training/moe.py --quick
Writes benchmarks/out/moe.json (or --out) and prints a markdown table with the dense / grouped ratios.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spatial_jax.cli.script_guard import check_counts, check_own_output, write_own
from spatial_jax.config import ConfigError
from spatial_jax.models import ModelConfig
from spatial_jax.models.config import TextConfig
from spatial_jax.models.moe import SparseMoE, dense_moe

OUT = Path(__file__).resolve().parents[1] / "out" / "moe.json"
OWNER = Path(__file__).name


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[512, 2048], help="token counts N")
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--inter", type=int, default=768, help="each expert's intermediate size")
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="N 64 256, D 128, 16 experts of 64, top 4")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.d, args.experts, args.inter, args.top_k, args.repeats = [64, 256], 128, 16, 64, 4, 2
    try:
        check_counts({"--n": (args.n, 1, 2**20), "--d": (args.d, 1, 2**16), "--experts": (args.experts, 1, 4096),
                      "--inter": (args.inter, 1, 2**16), "--top-k": (args.top_k, 1, args.experts),
                      "--repeats": (args.repeats, 1, 1000)})
        check_own_output(args.out, "--out", OWNER)
    except ConfigError as e:
        p.error(str(e))
    return args


def layer_for(args) -> SparseMoE:
    head_dim = 128 if args.d % 128 == 0 else 32
    text = TextConfig(hidden_size=args.d, num_attention_heads=max(1, args.d // head_dim), num_key_value_heads=1,
                      head_dim=head_dim, mrope_section=(head_dim // 4, head_dim // 8, head_dim // 8),
                      num_experts=args.experts, num_experts_per_tok=args.top_k, moe_intermediate_size=args.inter)
    cfg = ModelConfig(text=text, dtype=args.dtype, param_dtype=args.dtype,
                      vision=ModelConfig().vision.__class__(out_hidden_size=args.d))
    return SparseMoE(cfg, rngs=nnx.Rngs(0))


def _peak(compiled) -> int:
    m = compiled.memory_analysis()
    return int(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes)


def programs(layer: SparseMoE, x, g):
    graphdef, params = nnx.split(layer)

    def grouped(p, x):
        return nnx.merge(graphdef, p)(x)

    def dense(p, x):
        return dense_moe(nnx.merge(graphdef, p), x)

    out = {}
    for name, f in (("grouped", grouped), ("dense", dense)):
        out[(name, "fwd")] = jax.jit(f).lower(params, x).compile()
        loss = jax.grad(lambda p, x, f=f: jnp.sum(f(p, x).astype(jnp.float32) * g), argnums=(0, 1))
        out[(name, "fwd_bwd")] = jax.jit(loss).lower(params, x).compile()
    return params, out


def main(argv=None) -> int:
    args = parse_args(argv)
    layer = layer_for(args)
    rows = []
    for n in args.n:
        rng = np.random.default_rng(n)
        x = jnp.asarray(rng.standard_normal((1, n, args.d)), jnp.dtype(args.dtype))
        g = jnp.asarray(rng.standard_normal((1, n, args.d)), jnp.float32)
        params, progs = programs(layer, x, g)
        diff = float(jnp.abs(progs[("grouped", "fwd")](params, x).astype(jnp.float32)
                             - progs[("dense", "fwd")](params, x).astype(jnp.float32)).max())
        for mode in ("fwd", "fwd_bwd"):
            best = {"grouped": float("inf"), "dense": float("inf")}
            for name in best:  # warm-up
                jax.block_until_ready(progs[(name, mode)](params, x))
            for _ in range(args.repeats):
                for name in best:
                    t = time.perf_counter()
                    jax.block_until_ready(progs[(name, mode)](params, x))
                    best[name] = min(best[name], time.perf_counter() - t)
            row = dict(n=n, mode=mode, max_abs_diff=diff,
                       **{f"{k}_s": v for k, v in best.items()},
                       **{f"{k}_peak_bytes": _peak(progs[(k, mode)]) for k in best})
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = dict(backend=jax.default_backend(), device=str(jax.devices()[0].device_kind), host=platform.node(),
                d=args.d, experts=args.experts, inter=args.inter, top_k=args.top_k, dtype=args.dtype,
                repeats=args.repeats)
    write_own(args.out, dict(meta=meta, rows=rows), OWNER)
    print(f"\n{meta['device']} ({meta['backend']}), D {args.d}, {args.experts} experts of {args.inter}, top "
          f"{args.top_k}, {args.dtype}\n")
    print("| N | mode | grouped (ms) | dense loop (ms) | dense / grouped | grouped peak (MiB) | dense peak (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['mode']} | {1e3 * r['grouped_s']:.1f} | {1e3 * r['dense_s']:.1f} | "
              f"{r['dense_s'] / r['grouped_s']:.1f}x | {r['grouped_peak_bytes'] / 2**20:.1f} | "
              f"{r['dense_peak_bytes'] / 2**20:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
