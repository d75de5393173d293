"""The policy's RL update and its rollout decode step on one accelerator, against the chip's limits.

    python benchmarks/step_gpu.py rl [--model qwen3-vl-4b] [--prompts 4] [--group 4] [--prompt-len 1024]
        [--completion 1024] [--image 448] [--steps 3] [--variants whole shared] [--remat full] [--out F]
    python benchmarks/step_gpu.py decode [--model qwen3-vl-4b] [--slots 1 16 64] [--context 992] [--chunk 32]
        [--repeats 5] [--out F]
    python benchmarks/step_gpu.py rl --model tiny ...      # the same code on the tiny policy (CPU smoke run)

rl: a random policy of the named architecture (plan.ARCHITECTURES: the published Qwen3-VL shapes), bfloat16
compute over float32 master weights, every weight trained (vision tower included) with AdamW, scanned layers with
the `--remat` policy, attention "auto" (cuDNN on a GPU, where the mask allows it). The batch: `prompts` prompts of
`prompt-len` tokens, each holding one `image` px square image, with `group` completions of `completion` tokens each
(all real tokens: no padding, so every FLOP counted is one a rollout needs). Variants: "whole" runs each of the
prompts x group rows through the decoder (`rl.shared_prefix = false`), "shared" each prompt once for its group
(`rl.shared_prefix = true`; its completions attend through the XLA path, cuDNN cannot offset a causal mask). Each
is compiled, run once, then timed over `steps` updates (median; the weights and optimiser state carry over).
A variant that fails with attention "auto" is retried with "xla", and both outcomes are reported.

Model FLOPs per update (`model_flops`): 2 x parameters x tokens for every matmul weight the tokens pass through
(decoder layers: every decoder token; the LM head: the completion tokens only, as the fused kernel computes it;
vision blocks: every patch, each group's image once; the mergers: every merged token), plus causal attention in
the decoder (4 x heads x head_dim per visible query-key pair) and full attention within each image; the update is
3 x the forward (forward, then gradients of activations and of weights). Remat recomputation is not counted
(MFU, not hardware utilisation); XLA's own count of the compiled program is reported beside it. MFU = model FLOPs /
time / `--peak-tflops` (H200 SXM dense bf16, the datasheet's 989); a bf16 8192^3 matmul measured in the same
process gives the achievable ceiling.

decode: the paged engine's decode chunk (rollout/engine.py: `chunk` steps of sampling, the step's decoder call and
the KV write, in one jitted loop) with every one of `slots` sequences at `context` cached tokens, bfloat16 weights
and KV cache (the decoding copy). Per-step time = the median chunk time / chunk. Roofline: the bytes a step must
read, the decoder's and the LM head's weights once plus every sequence's cached keys and values (the vision tower
and the embedding table are not read; a tied head is read as the head), over `--hbm-tbps` (4.8 TB/s, the H200
datasheet); a device-to-device copy measured in the same process gives the achievable bandwidth. The engine reads
the KV of a power-of-two window of pages: those bytes are reported too.

Writes a JSON (--out, default benchmarks/out/step_gpu_<part>.json) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from shared_prefix import batch  # this folder is sys.path[0] when the script runs

from spatial_jax.models import ModelConfig, Qwen3VL
from spatial_jax.models.sharding import make_mesh, shard_model
from spatial_jax.rl.losses import LossConfig
from spatial_jax.rl.plan import ARCHITECTURES
from spatial_jax.rl.step import rl_update
from spatial_jax.rollout import engine as eng
from spatial_jax.rollout.config import SamplingConfig

OUT = Path(__file__).resolve().parent / "out"


def model_config(name: str, **kw) -> ModelConfig:
    """A published architecture by name, or "tiny" (the CPU smoke run's), with the given dtype/memory settings."""
    mc = ModelConfig.tiny(512, tie_word_embeddings=True) if name == "tiny" else ModelConfig.from_hf(ARCHITECTURES[name])
    return mc.replace(scan_layers=True, **kw)


def random_model(mc: ModelConfig, mesh) -> Qwen3VL:
    """Random weights of `mc` built on the mesh's device(s) (what a checkpoint would hold, for timing)."""
    with jax.set_mesh(mesh):
        return shard_model(Qwen3VL(mc, rngs=nnx.Rngs(0)), mesh)


def _kind(path) -> str:
    keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    if keys[0] == "visual":
        if "pos_embed" in keys:
            return "lookup"
        return "merger" if any("merger" in k for k in keys) else "vision"
    if keys[0] in ("embed_tokens", "lm_head"):
        return keys[0]
    return "decoder" if keys[0] == "layers" else "norm"


def parameter_counts(model) -> dict[str, int]:
    """Parameters by where their tokens come from: decoder layers, vision blocks, mergers, embed_tokens, lm_head,
    and the rest (final norm, position table)."""
    counts: dict[str, int] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
        counts[_kind(path)] = counts.get(_kind(path), 0) + int(np.prod(leaf.shape))
    return counts


def model_flops(mc: ModelConfig, counts: dict[str, int], prompts: int, group: int, P: int, N: int, grid,
                shared: bool) -> float:
    """FLOPs of one full-parameter update (see the module docstring)."""
    t, v = mc.text, mc.vision
    R = prompts * group
    tokens = prompts * P + R * N if shared else R * (P + N)
    keys = (prompts * P * (P + 1) / 2 + R * (N * P + N * (N + 1) / 2)) if shared else R * (P + N) * (P + N + 1) / 2
    patches = int(np.prod(grid))
    head = counts.get("lm_head", counts["embed_tokens"])  # a tied head is the embedding table
    forward = (2 * counts["decoder"] * tokens + 4 * t.num_attention_heads * t.head_dim * t.num_hidden_layers * keys
               + 2 * head * R * N
               + prompts * (2 * counts["vision"] * patches + 4 * v.hidden_size * v.depth * patches**2
                            + 2 * counts["merger"] * patches // v.spatial_merge_size**2))
    return 3 * forward


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_tflops(n: int = 8192) -> float:
    """bf16 n^3 matmul rate on the default device, random operands (zeros run faster than real data)."""
    a, b = (jax.random.normal(jax.random.key(i), (n, n), jnp.bfloat16) for i in (1, 2))
    f = jax.jit(lambda a, b: a @ b)
    jax.block_until_ready(f(a, b))
    return 2 * n**3 / _median_time(lambda: f(a, b), 10) / 1e12


def copy_tbps(gib: float = 4.0) -> float:
    """Device-to-device copy rate, bytes read plus written."""
    x = jax.random.normal(jax.random.key(3), (int(gib * 2**30) // 4,), jnp.float32)
    f = jax.jit(lambda x: x * 1.0 + 0.0)  # one read and one write of every element
    jax.block_until_ready(f(x))
    return 2 * x.nbytes / _median_time(lambda: f(x), 10) / 1e12


def _device_info() -> dict:
    d = jax.devices()[0]
    return {"device": d.device_kind, "platform": d.platform, "jax": jax.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def _peak_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the RL update

def _update_run(graphdef, state, data, tx, loss_cfg, steps: int) -> dict:
    """Compile, one warm-up update, `steps` timed ones; `state` = [trainable, opt_state, frozen] (donated and
    replaced). The compiled executable runs every update, its inputs put on the shardings it was compiled for: the
    jitted function would compile again when an update returns its state under an equivalent but other sharding
    spelling (on one device, P('tensor', 'fsdp') for P('fsdp', 'tensor'))."""
    t0 = time.perf_counter()
    compiled = rl_update.lower(graphdef, state[0], state[2], state[1], data, loss_cfg, 1.0, tx, None).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    placed = compiled.input_shardings[0][:4]
    times, losses = [], []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        trainable, frozen, opt_state, data = jax.device_put((state[0], state[2], state[1], data), placed)
        state[0], state[1], loss, _ = compiled(trainable, frozen, opt_state, data, None)
        losses.append(float(loss))  # waits for the update
        if i:
            times.append(time.perf_counter() - t0)
    return {"compile_s": compile_s, "seconds": statistics.median(times), "times": times, "losses": losses,
            "xla_flops": float(cost["flops"]) if isinstance(cost, dict) and "flops" in cost else None,
            "temp_bytes": int(mem.temp_size_in_bytes), "argument_bytes": int(mem.argument_size_in_bytes)}


def run_rl(args) -> dict:
    mesh = make_mesh()
    mc = model_config(args.model, dtype=args.dtype, param_dtype="float32", remat_policy=args.remat,
                      attention_chunk=args.attention_chunk)
    t0 = time.perf_counter()
    model = random_model(mc, mesh)
    counts = parameter_counts(model)
    graphdef, trainable, frozen = nnx.split(model, nnx.Param, ...)
    del model
    tx = optax.adamw(1e-6)
    state = [trainable, tx.init(trainable), frozen]
    p = mc.vision.patch_size
    grid = (1, args.image // p, args.image // p)
    result = {**_device_info(), "model": args.model, "parameters": counts, "dtype": args.dtype, "remat": args.remat,
              "prompts": args.prompts, "group": args.group, "prompt_len": args.prompt_len,
              "completion": args.completion, "image_grid": grid, "peak_tflops": args.peak_tflops,
              "build_s": time.perf_counter() - t0, "variants": {}}
    print(f"rl: built {sum(counts.values()) / 1e9:.2f} B parameters in {result['build_s']:.0f} s", file=sys.stderr,
          flush=True)
    out = args.out or OUT / "step_gpu_rl.json"
    loss_cfg = LossConfig()
    for variant in args.variants:
        shared = variant == "shared"
        data = batch(mc, args.prompts, args.group, args.prompt_len, args.completion, shared, grid=grid, pad=0,
                     full=True)
        flops = model_flops(mc, counts, args.prompts, args.group, args.prompt_len, args.completion, grid, shared)
        attempts = []
        for impl in ("auto", "xla"):
            gd = graphdef if impl == "auto" else nnx.split(
                nnx.eval_shape(lambda: Qwen3VL(mc.replace(attention_impl=impl), rngs=nnx.Rngs(0))), nnx.Param, ...)[0]
            try:
                with jax.set_mesh(mesh):
                    run = _update_run(gd, state, data, tx, loss_cfg, args.steps)
            except Exception as e:  # reported, and the XLA attention tried next
                attempts.append({"attention": impl, "error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"})
                print(f"rl {variant} attention {impl}: {attempts[-1]['error']}", file=sys.stderr, flush=True)
                continue
            R = args.prompts * args.group
            run.update(attention=impl, model_flops=flops, mfu=flops / run["seconds"] / (args.peak_tflops * 1e12),
                       tokens_per_s=R * (args.prompt_len + args.completion) / run["seconds"],
                       completion_tokens_per_s=R * args.completion / run["seconds"], peak_bytes=_peak_bytes())
            attempts.append(run)
            print(f"rl {variant} attention {impl}: {run['seconds']:.3f} s per update, MFU {run['mfu']:.1%}, "
                  f"compiled in {run['compile_s']:.0f} s", file=sys.stderr, flush=True)
            break
        result["variants"][variant] = attempts
        _write(out, result)
    result["matmul_tflops"] = matmul_tflops(args.matmul_n)
    _write(out, result)
    return result


def rl_markdown(r: dict) -> str:
    lines = [f"{r['device']}, jax {r['jax']}, {r['date']}: {r['model']} ({sum(r['parameters'].values()) / 1e9:.2f} B "
             f"parameters, all trained), {r['dtype']} compute over float32 weights, remat {r['remat']}; "
             f"{r['prompts']} prompts x {r['group']} completions, {r['prompt_len']} + {r['completion']} tokens, one "
             f"image of {r['image_grid'][1]} x {r['image_grid'][2]} patches per prompt; bf16 matmul ceiling "
             f"{r.get('matmul_tflops', float('nan')):.0f} TFLOP/s measured, {r['peak_tflops']:.0f} datasheet", "",
             "| update | attention | s per update (median) | tokens/s | completion tokens/s | model TFLOP per update | "
             "MFU | of the measured ceiling | XLA TFLOP | compile | XLA temp |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, attempts in r["variants"].items():
        for a in attempts:
            if "error" in a:
                lines.append(f"| {name} | {a['attention']} | failed: {a['error'][:160]} |||||||||")
                continue
            ceiling = a["model_flops"] / a["seconds"] / (r.get("matmul_tflops", float("nan")) * 1e12)
            xla = "-" if a["xla_flops"] is None else f"{a['xla_flops'] / 1e12:.0f}"
            lines.append(f"| {name} | {a['attention']} | {a['seconds']:.3f} | {a['tokens_per_s']:,.0f} | "
                         f"{a['completion_tokens_per_s']:,.0f} | {a['model_flops'] / 1e12:.0f} | {a['mfu']:.1%} | "
                         f"{ceiling:.1%} | {xla} | {a['compile_s']:.0f} s | {a['temp_bytes'] / 2**30:.1f} GiB |")
    return "\n".join(lines)


# ------------------------------------------------------------------ the decode step

def weight_bytes_read(model) -> int:
    """Bytes of the weights one decode step reads: decoder layers, final norm and the LM head (a tied head is the
    embedding table, read whole as the head); not the vision tower, not the embedding rows of an untied model."""
    tied = model.cfg.tie_word_embeddings
    total = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
        kind = _kind(path)
        if kind in ("decoder", "norm", "lm_head") or (kind == "embed_tokens" and tied):
            total += leaf.size * leaf.dtype.itemsize
    return total


def _decode_step(model, graphdef, params, sampling: SamplingConfig, S: int, args) -> tuple[float, int, float]:
    """(seconds per decode step, pages in the chunk's window, compile seconds) with `S` sequences at
    `args.context` cached tokens; the KV pool holds random keys and values."""
    t = model.cfg.text
    engine = eng.Engine(model, sampling, slots=S, max_len=args.context + args.chunk, page_size=args.page_size,
                        chunk=args.chunk)
    inputs = [jnp.asarray(x) for x in engine.chunk_inputs_at(args.context)]
    shape = (t.num_key_value_heads, engine.pages, engine.page_size, t.head_dim)
    pool = [tuple(jax.random.normal(jax.random.key(2 * i + kv), shape, model.cfg.dtype)
                  for i in range(t.num_hidden_layers)) for kv in (0, 1)]
    logits = jax.random.normal(jax.random.key(7), (S, t.vocab_size), jnp.float32)
    suppressed = jnp.asarray([model.cfg.image_token_id, model.cfg.video_token_id], jnp.int32)
    t0 = time.perf_counter()
    # the compiled executable, its inputs put on its own shardings: as in _update_run, the jitted function would
    # compile again for state returned under another spelling of the same sharding
    state = [params, *pool, logits, *inputs, jax.random.PRNGKey(0), jnp.asarray([-1], jnp.int32), suppressed]
    compiled = eng._chunk_jit.lower(graphdef, *state, dataclasses.replace(sampling, seed=0), args.chunk).compile()
    placed = compiled.input_shardings[0]

    def chunk():
        (state[1], state[2], state[3], *_), out = compiled(*jax.device_put(tuple(state), placed))
        return out

    jax.block_until_ready(chunk())
    compile_s = time.perf_counter() - t0
    return _median_time(chunk, args.repeats) / args.chunk, int(inputs[0].shape[1]), compile_s


def run_decode(args) -> dict:
    mesh = make_mesh()
    mc = model_config(args.model, dtype="bfloat16", param_dtype="bfloat16")
    model = random_model(mc, mesh)
    graphdef, params = nnx.split(model)
    t = mc.text
    kv_token = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * jnp.dtype(mc.dtype).itemsize
    wbytes = weight_bytes_read(model)
    result = {**_device_info(), "model": args.model, "context": args.context, "chunk": args.chunk,
              "weight_bytes": wbytes, "kv_bytes_per_token": kv_token, "hbm_tbps": args.hbm_tbps, "cases": []}
    out = args.out or OUT / "step_gpu_decode.json"
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.chunk, chunk=args.chunk)
    for S in args.slots:
        step, window, compile_s = _decode_step(model, graphdef, params, sampling, S, args)
        need = wbytes + S * (args.context + args.chunk / 2) * kv_token  # the context grows through the chunk
        case = {"slots": S, "step_s": step, "tokens_per_s": S / step, "bytes_needed": need,
                "bytes_window": wbytes + S * window * args.page_size * kv_token,
                "roofline_s": need / (args.hbm_tbps * 1e12), "compile_s": compile_s}
        case["of_roofline"] = case["roofline_s"] / step
        result["cases"].append(case)
        print(f"decode {S} slots: {step * 1e3:.2f} ms per step, {case['of_roofline']:.0%} of the roofline",
              file=sys.stderr, flush=True)
        _write(out, result)
    result["copy_tbps"] = copy_tbps(args.copy_gib)
    _write(out, result)
    return result


def decode_markdown(r: dict) -> str:
    bw = r.get("copy_tbps", float("nan"))
    lines = [f"{r['device']}, jax {r['jax']}, {r['date']}: {r['model']}, bf16 weights ({r['weight_bytes'] / 2**30:.2f} "
             f"GiB read per step) and KV cache ({r['kv_bytes_per_token'] / 2**10:.0f} KiB per token), {r['context']} "
             f"cached tokens per sequence, chunks of {r['chunk']} steps; HBM {r['hbm_tbps']} TB/s datasheet, copy "
             f"{bw:.2f} TB/s measured (read + write)", "",
             "| sequences | ms per step | tokens/s | bytes per step (needed) | roofline ms | of the roofline | "
             "of the measured copy rate | bytes read (page window) | compile |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in r["cases"]:
        measured = c["bytes_needed"] / (bw * 1e12) / c["step_s"]
        lines.append(f"| {c['slots']} | {c['step_s'] * 1e3:.2f} | {c['tokens_per_s']:,.0f} | "
                     f"{c['bytes_needed'] / 2**30:.2f} GiB | {c['roofline_s'] * 1e3:.2f} | {c['of_roofline']:.0%} | "
                     f"{measured:.0%} | {c['bytes_window'] / 2**30:.2f} GiB | {c['compile_s']:.0f} s |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    models = ["tiny", *ARCHITECTURES]
    rl = sub.add_parser("rl", help="the RL update: tokens/s and MFU")
    rl.add_argument("--model", choices=models, default="qwen3-vl-4b")
    rl.add_argument("--prompts", type=int, default=4)
    rl.add_argument("--group", type=int, default=4)
    rl.add_argument("--prompt-len", type=int, default=1024)
    rl.add_argument("--completion", type=int, default=1024)
    rl.add_argument("--image", type=int, default=448, help="image side in pixels (a multiple of 2 x the patch)")
    rl.add_argument("--steps", type=int, default=3)
    rl.add_argument("--variants", nargs="+", choices=("whole", "shared"), default=["whole", "shared"])
    rl.add_argument("--remat", default="full")
    rl.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    rl.add_argument("--attention-chunk", type=int, default=256, help="the XLA attention path's query block")
    rl.add_argument("--peak-tflops", type=float, default=989.0, help="the chip's dense bf16 peak (H200 SXM: 989)")
    rl.add_argument("--matmul-n", type=int, default=8192)
    rl.add_argument("--out", type=Path, default=None)
    dec = sub.add_parser("decode", help="the paged engine's decode step against the HBM roofline")
    dec.add_argument("--model", choices=models, default="qwen3-vl-4b")
    dec.add_argument("--slots", type=int, nargs="+", default=[1, 16, 64])
    dec.add_argument("--context", type=int, default=992, help="cached tokens per sequence")
    dec.add_argument("--chunk", type=int, default=32)
    dec.add_argument("--page-size", type=int, default=16)
    dec.add_argument("--repeats", type=int, default=5)
    dec.add_argument("--hbm-tbps", type=float, default=4.8, help="the chip's HBM bandwidth (H200: 4.8)")
    dec.add_argument("--copy-gib", type=float, default=4.0)
    dec.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    for name in ("prompts", "group", "prompt_len", "completion", "image", "steps", "context", "chunk", "repeats"):
        if getattr(args, name, 1) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.part == "rl":
        print(rl_markdown(run_rl(args)))
    else:
        print(decode_markdown(run_decode(args)))


if __name__ == "__main__":
    main()
