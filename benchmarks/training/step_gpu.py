"""The policy's RL update, its rollout decode step and a whole RL step on one accelerator, against the chip's limits,
each change measured beside what it replaces in one process.

    python benchmarks/training/step_gpu.py rl [--model qwen3-vl-4b] [--prompts 4] [--group 4] [--prompt-len 1024]
        [--completion 1024] [--image 448] [--steps 3] [--arms whole:full:auto whole:dots:auto shared:full:pallas]
        [--out F]
    python benchmarks/training/step_gpu.py decode [--model qwen3-vl-4b] [--slots 1 16 64] [--context 992] [--chunk 32]
        [--decode-arms xla pallas xla+graph pallas+graph] [--every-arm-at 16] [--repeats 5] [--out F]
    python benchmarks/training/step_gpu.py all [every option of both] [--step-arms xla/whole:full:auto
        pallas+graph/best]
        # decode, then rl, then whole RL steps, one JSON
    python benchmarks/training/step_gpu.py all --model tiny ...      # the same code on the tiny policy (CPU smoke run)

rl: a random policy of the named architecture (rl/plan/shapes.ARCHITECTURES: the published Qwen3-VL shapes), bfloat16
compute over float32 master weights, every weight trained (vision tower included) with AdamW, scanned layers. The
batch: `prompts` prompts of `prompt-len` tokens, each holding one `image` px square image, with `group` completions
of `completion` tokens each (all real tokens: no padding, so every FLOP counted is one a rollout needs). Each arm
is `rows:remat:attention`: rows "whole" runs each of the prompts x group rows through the decoder
(`rl.shared_prefix = false`), "shared" each prompt once for its group (`rl.shared_prefix = true`); remat the decoder
layers' policy ("full" recomputes each layer, "dots" keeps the matmul outputs: `spatial-jax plan` chooses between
them by memory); attention "auto" (cuDNN on a GPU where the mask allows it, the XLA path for the shared prefix's
completions), "pallas" (the Pallas flash kernel, whose causal mask is offset for the completions) or "xla". Each
arm is compiled, run once, then timed over `steps` updates (median; the weights and optimiser state carry over). An
arm that fails is reported and, unless its attention was "xla" or it ran out of memory, retried with "xla".

Model FLOPs per update (`model_flops`): 2 x parameters x tokens for every matmul weight the tokens pass through
(decoder layers: every decoder token; the LM head: the completion tokens only, as the fused kernel computes it;
vision blocks: every patch, each group's image once; the mergers: every merged token), plus causal attention in
the decoder (4 x heads x head_dim per visible query-key pair) and full attention within each image; the update is
3 x the forward (forward, then gradients of activations and of weights). Remat recomputation is not counted
(MFU, not hardware utilisation); XLA's own count of the compiled program is reported beside it. MFU = model FLOPs /
time / `--peak-tflops` (H200 SXM dense bf16, the datasheet's 989; H100 SXM the same); a bf16 8192^3 matmul
measured in the same process gives the achievable ceiling.

decode: the paged engine's decode chunk (rollout/engine.py: `chunk` steps of sampling, the step's decoder call and
the KV write, in one jitted loop) with every one of `slots` sequences at `context` cached tokens, bfloat16 weights
and KV cache (the decoding copy). Arms: "xla" (today's: each row's page window gathered, the XLA attention path),
"pallas" (rl.sampling.decode_kernel: the Pallas kernel reading pages in place), "+graph" (rl.sampling.command_buffers:
the chunk compiled with XLA's command buffers over its while loop). The first and last arms run at every slot
count, every arm at the `--every-arm-at` counts. Per-step time = the median chunk time / chunk. Roofline: the bytes
a step must read, the decoder's and the LM head's weights once plus every sequence's cached keys and values (the
vision tower and the embedding table are not read; a tied head is read as the head), over `--hbm-tbps` (4.8 TB/s,
the H200 datasheet; an H100 SXM's is 3.35); a device-to-device copy measured in the same process gives the
achievable bandwidth. The "xla" arm reads the KV of a power-of-two window of pages: those bytes are reported too.

all: decode, then rl, then a whole RL step per `--step-arms` entry `decode arm/update arm` (update arm "best": the
fastest the rl part measured; the default compares today's step with the best of everything): the rl part's policy
cast to a bfloat16 decoding copy, prompts x group rollouts of `completion` tokens drawn through the engine (all
rows in slots at once, the prompts' images encoded once per group), then one update of that arm on a batch of the
rollouts' shape; rollouts (prefill + decode) and update timed apart, compiles excluded (a warm-up of one chunk of
draws per request first). The 4B model's full-parameter update needs an H200's memory (~97 GiB at the defaults with
remat full; "dots" keeps ~60 KiB more per token and layer, ~70 GiB more here, which should not fit: measured).

Writes a JSON (--out, default benchmarks/out/step_gpu_<part>.json) and prints markdown tables.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from spatial_jax.cli.script_guard import check_counts, check_own_output, write_own
from spatial_jax.config import ConfigError
from spatial_jax.models import ModelConfig, Qwen3VL
from spatial_jax.models.registry import config_from_hf
from spatial_jax.models.sharding import make_mesh, shard_model
from spatial_jax.rl.losses import LossConfig
from spatial_jax.rl.plan.shapes import ARCHITECTURES
from spatial_jax.rl.step import rl_update
from spatial_jax.rollout import engine as eng
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.engine import Request

OUT = Path(__file__).resolve().parents[1] / "out"
OWNER = Path(__file__).name
# each size's (least, most): the most lies beyond any chip's memory, so a typo is refused instead of run for hours
BOUNDS = {"prompts": (1, 1024), "group": (1, 256), "prompt_len": (1, 2**17), "completion": (1, 2**17),
          "image": (1, 4096), "steps": (1, 1000), "matmul_n": (1, 2**16), "slots": (1, 4096), "context": (1, 2**17),
          "chunk": (1, 2**17), "page_size": (1, 4096), "every_arm_at": (1, 4096), "repeats": (1, 1000),
          "copy_gib": (1 / 1024, 256)}


def model_config(name: str, **kw) -> ModelConfig:
    """A published architecture by name, or "tiny" (the CPU smoke run's), with the given dtype/memory settings."""
    mc = ModelConfig.tiny(512, tie_word_embeddings=True) if name == "tiny" else config_from_hf(ARCHITECTURES[name])
    return mc.replace(scan_layers=True, **kw)


def random_model(mc: ModelConfig, mesh) -> Qwen3VL:
    """Random weights of `mc` built on the mesh's device(s) (what a checkpoint would hold, for timing); on an
    accelerator initialised in one compiled program (built eagerly, op by op, the 4B model took 99 s on the H200),
    on the CPU (the tiny smoke run) eagerly, which is quicker than compiling there."""
    build = lambda: Qwen3VL(mc, rngs=nnx.Rngs(0))
    with jax.set_mesh(mesh):
        return shard_model(build() if jax.default_backend() == "cpu" else nnx.jit(build)(), mesh)


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
    write_own(path, result, OWNER)
    print(f"wrote {path}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the RL update

def _compile_update(graphdef, state, data, tx, loss_cfg) -> tuple:
    t0 = time.perf_counter()
    compiled = rl_update.lower(graphdef, state[0], state[2], state[1], data, loss_cfg, 1.0, tx, None).compile()
    return compiled, time.perf_counter() - t0


def _one_update(compiled, state, data) -> float:
    """One update through the compiled executable (inputs put on the shardings it was compiled for: the jitted
    function would compile again when an update returns its state under an equivalent but other sharding
    spelling, on one device P('tensor', 'fsdp') for P('fsdp', 'tensor')); `state` = [trainable, opt_state, frozen]
    is donated and replaced. Returns the loss (which waits for the update)."""
    placed = compiled.input_shardings[0][:4]
    trainable, frozen, opt_state, data = jax.device_put((state[0], state[2], state[1], data), placed)
    state[0], state[1], loss, *_ = compiled(trainable, frozen, opt_state, data, None)
    return float(loss)


def _update_run(compiled, compile_s: float, state, data, steps: int) -> dict:
    """One warm-up update, `steps` timed ones."""
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    times, losses = [], []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        losses.append(_one_update(compiled, state, data))
        if i:
            times.append(time.perf_counter() - t0)
    return {"compile_s": compile_s, "seconds": statistics.median(times), "times": times, "losses": losses,
            "xla_flops": float(cost["flops"]) if isinstance(cost, dict) and "flops" in cost else None,
            "temp_bytes": int(mem.temp_size_in_bytes), "argument_bytes": int(mem.argument_size_in_bytes)}


def parse_update_arm(arm: str) -> tuple[str, str, str]:
    """`rows:remat:attention` -> (rows, remat, attention), each checked."""
    parts = arm.split(":")
    if (len(parts) != 3 or parts[0] not in ("whole", "shared") or parts[1] not in ("none", "full", "dots")
            or parts[2] not in ("auto", "xla", "cudnn", "pallas")):
        raise ValueError(f"update arm {arm!r}: write rows:remat:attention, rows whole|shared, remat none|full|dots, "
                         "attention auto|xla|cudnn|pallas")
    return parts[0], parts[1], parts[2]


def _grid(mc: ModelConfig, image: int) -> tuple[int, int, int]:
    p = mc.vision.patch_size
    return (1, image // p, image // p)


def build_policy(args) -> dict:
    """The rl part's random policy (float32 weights, `--dtype` compute): mesh, config, parameter counts, trainable
    and frozen state, build seconds."""
    mesh = make_mesh()
    mc = model_config(args.model, dtype=args.dtype, param_dtype="float32", attention_chunk=args.attention_chunk)
    t0 = time.perf_counter()
    model = random_model(mc, mesh)
    counts = parameter_counts(model)
    _, trainable, frozen = nnx.split(model, nnx.Param, ...)
    return {"mesh": mesh, "mc": mc, "counts": counts, "trainable": trainable, "frozen": frozen,
            "build_s": time.perf_counter() - t0}


def run_rl(args, result: dict, save, built: dict | None = None) -> dict:
    """The update arms into `result` (`save()` after each) on `built` (default: a policy built here); returns
    what a whole RL step reuses: the policy's state, the optimiser and each arm's compiled update with its batch."""
    built = built or build_policy(args)
    mesh, mc, counts = built["mesh"], built["mc"], built["counts"]
    trainable, frozen = built.pop("trainable"), built.pop("frozen")  # donated to the updates from here on
    tx = optax.adamw(1e-6)
    state = [trainable, tx.init(trainable), frozen]
    grid = _grid(mc, args.image)
    result.update({"model": args.model, "parameters": counts, "dtype": args.dtype, "prompts": args.prompts,
                   "group": args.group, "prompt_len": args.prompt_len, "completion": args.completion,
                   "image_grid": grid, "peak_tflops": args.peak_tflops, "build_s": built["build_s"],
                   "variants": {}})
    print(f"rl: built {sum(counts.values()) / 1e9:.2f} B parameters in {result['build_s']:.0f} s", file=sys.stderr,
          flush=True)
    loss_cfg = LossConfig()
    reuse = {"mc": mc, "mesh": mesh, "state": state, "tx": tx, "compiled": {}, "grid": grid, "counts": counts}
    for arm in args.arms:
        rows, remat, impl = parse_update_arm(arm)
        shared = rows == "shared"
        data = batch(mc, args.prompts, args.group, args.prompt_len, args.completion, shared, grid=grid, pad=0,
                     full=True)
        flops = model_flops(mc, counts, args.prompts, args.group, args.prompt_len, args.completion, grid, shared)
        attempts = []
        for attention in (impl, "xla") if impl != "xla" else (impl,):
            if attempts and "RESOURCE_EXHAUSTED" in attempts[-1]["error"]:
                break  # out of memory: another attention path would not change that
            gd = nnx.split(nnx.eval_shape(lambda: Qwen3VL(mc.replace(remat_policy=remat, attention_impl=attention),
                                                          rngs=nnx.Rngs(0))), nnx.Param, ...)[0]
            try:
                with jax.set_mesh(mesh):
                    compiled, compile_s = _compile_update(gd, state, data, tx, loss_cfg)
                    run = _update_run(compiled, compile_s, state, data, args.steps)
            except Exception as e:  # reported, and the XLA attention tried next
                attempts.append({"attention": attention, "remat": remat,
                                 "error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"})
                print(f"rl {arm} attention {attention}: {attempts[-1]['error']}", file=sys.stderr, flush=True)
                continue
            R = args.prompts * args.group
            run.update(attention=attention, remat=remat, model_flops=flops,
                       mfu=flops / run["seconds"] / (args.peak_tflops * 1e12),
                       tokens_per_s=R * (args.prompt_len + args.completion) / run["seconds"],
                       completion_tokens_per_s=R * args.completion / run["seconds"], peak_bytes=_peak_bytes())
            attempts.append(run)
            reuse["compiled"][arm] = (compiled, data, run["seconds"])
            print(f"rl {arm} attention {attention}: {run['seconds']:.3f} s per update, MFU {run['mfu']:.1%}, "
                  f"compiled in {run['compile_s']:.0f} s", file=sys.stderr, flush=True)
            break
        result["variants"][arm] = attempts
        save()
    result["matmul_tflops"] = matmul_tflops(args.matmul_n)
    save()
    return reuse


def rl_markdown(r: dict) -> str:
    lines = [f"{r['device']}, jax {r['jax']}, {r['date']}: {r['model']} ({sum(r['parameters'].values()) / 1e9:.2f} B "
             f"parameters, all trained), {r['dtype']} compute over float32 weights; "
             f"{r['prompts']} prompts x {r['group']} completions, {r['prompt_len']} + {r['completion']} tokens, one "
             f"image of {r['image_grid'][1]} x {r['image_grid'][2]} patches per prompt; bf16 matmul ceiling "
             f"{r.get('matmul_tflops', float('nan')):.0f} TFLOP/s measured, {r['peak_tflops']:.0f} datasheet", "",
             "| arm | remat | attention | s per update (median) | vs the first arm | tokens/s | completion tokens/s | "
             "model TFLOP per update | MFU | of the measured ceiling | XLA TFLOP | compile | XLA temp | peak in use |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    first = None
    for name, attempts in r["variants"].items():
        for a in attempts:
            if "error" in a:
                lines.append(f"| {name} | {a['remat']} | {a['attention']} | failed: {a['error'][:160]} "
                             "||||||||||")
                continue
            first = first or a["seconds"]
            ceiling = a["model_flops"] / a["seconds"] / (r.get("matmul_tflops", float("nan")) * 1e12)
            xla = "-" if a["xla_flops"] is None else f"{a['xla_flops'] / 1e12:.0f}"
            peak = "-" if a.get("peak_bytes") is None else f"{a['peak_bytes'] / 2**30:.1f} GiB"
            lines.append(f"| {name} | {a['remat']} | {a['attention']} | {a['seconds']:.3f} | "
                         f"{first / a['seconds']:.2f}x | {a['tokens_per_s']:,.0f} | "
                         f"{a['completion_tokens_per_s']:,.0f} | {a['model_flops'] / 1e12:.0f} | {a['mfu']:.1%} | "
                         f"{ceiling:.1%} | {xla} | {a['compile_s']:.0f} s | {a['temp_bytes'] / 2**30:.1f} GiB | "
                         f"{peak} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ the decode step

DECODE_ARMS = {"xla": ("auto", False), "pallas": ("pallas", False), "xla+graph": ("auto", True),
               "pallas+graph": ("pallas", True)}


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
    # the compiled executable, its inputs put on its own shardings: as in _one_update, the jitted function would
    # compile again for state returned under another spelling of the same sharding
    state = [params, *pool, logits, *inputs, jax.random.PRNGKey(0), jnp.asarray([-1], jnp.int32), suppressed]
    static = dataclasses.replace(sampling, seed=0, command_buffers=False)
    compiled = eng.chunk_function(sampling).lower(graphdef, *state, static, args.chunk).compile()
    placed = compiled.input_shardings[0]

    def chunk():
        (state[1], state[2], state[3], *_), out = compiled(*jax.device_put(tuple(state), placed))
        return out

    jax.block_until_ready(chunk())
    compile_s = time.perf_counter() - t0
    return _median_time(chunk, args.repeats) / args.chunk, int(inputs[0].shape[1]), compile_s


def decode_arms_at(args, S: int) -> list[str]:
    """Every arm at the --every-arm-at slot counts, else the first and the last."""
    arms = list(args.decode_arms)
    return arms if S in args.every_arm_at else list(dict.fromkeys((arms[0], arms[-1])))


def run_decode(args, result: dict, save, model=None) -> None:
    """The decode arms into `result`, `save()` after each, on `model` (bfloat16 weights; default: built here)."""
    if model is None:
        model = random_model(model_config(args.model, dtype="bfloat16", param_dtype="bfloat16"), make_mesh())
    mc = model.cfg
    graphdef, params = nnx.split(model)
    t = mc.text
    kv_token = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * jnp.dtype(mc.dtype).itemsize
    wbytes = weight_bytes_read(model)
    result.update({"model": args.model, "context": args.context, "chunk": args.chunk, "weight_bytes": wbytes,
                   "kv_bytes_per_token": kv_token, "hbm_tbps": args.hbm_tbps, "cases": []})
    for S in args.slots:
        for arm in decode_arms_at(args, S):
            kernel, graph = DECODE_ARMS[arm]
            sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.chunk, chunk=args.chunk,
                                      page_size=args.page_size, decode_kernel=kernel, command_buffers=graph)
            need = wbytes + S * (args.context + args.chunk / 2) * kv_token  # the context grows through the chunk
            case = {"slots": S, "arm": arm, "bytes_needed": need, "roofline_s": need / (args.hbm_tbps * 1e12)}
            try:
                step, window, compile_s = _decode_step(model, graphdef, params, sampling, S, args)
            except Exception as e:  # reported; the other arms still run
                case["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
                print(f"decode {S} slots {arm}: {case['error']}", file=sys.stderr, flush=True)
            else:
                case.update(step_s=step, tokens_per_s=S / step, compile_s=compile_s,
                            of_roofline=case["roofline_s"] / step,
                            bytes_window=wbytes + S * window * args.page_size * kv_token)
                print(f"decode {S} slots {arm}: {step * 1e3:.2f} ms per step, {case['of_roofline']:.0%} of the "
                      "roofline", file=sys.stderr, flush=True)
            result["cases"].append(case)
            save()
    del model, params
    result["copy_tbps"] = copy_tbps(args.copy_gib)
    save()


def decode_markdown(r: dict) -> str:
    bw = r.get("copy_tbps", float("nan"))
    lines = [f"{r['device']}, jax {r['jax']}, {r['date']}: {r['model']}, bf16 weights ({r['weight_bytes'] / 2**30:.2f} "
             f"GiB read per step) and KV cache ({r['kv_bytes_per_token'] / 2**10:.0f} KiB per token), {r['context']} "
             f"cached tokens per sequence, chunks of {r['chunk']} steps; HBM {r['hbm_tbps']} TB/s datasheet, copy "
             f"{bw:.2f} TB/s measured (read + write)", "",
             "| sequences | arm | ms per step | vs xla | tokens/s | bytes per step (needed) | roofline ms | "
             "of the roofline | of the measured copy rate | bytes read by xla (page window) | compile |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {c["slots"]: c["step_s"] for c in r["cases"] if c["arm"] == "xla" and "step_s" in c}
    for c in r["cases"]:
        if "error" in c:
            lines.append(f"| {c['slots']} | {c['arm']} | failed: {c['error'][:160]} ||||||||")
            continue
        measured = c["bytes_needed"] / (bw * 1e12) / c["step_s"]
        vs = f"{base[c['slots']] / c['step_s']:.2f}x" if c["slots"] in base else "-"
        lines.append(f"| {c['slots']} | {c['arm']} | {c['step_s'] * 1e3:.2f} | {vs} | {c['tokens_per_s']:,.0f} | "
                     f"{c['bytes_needed'] / 2**30:.2f} GiB | {c['roofline_s'] * 1e3:.2f} | {c['of_roofline']:.0%} | "
                     f"{measured:.0%} | {c['bytes_window'] / 2**30:.2f} GiB | {c['compile_s']:.0f} s |")
    return "\n".join(lines)


# ------------------------------------------------------------------ a whole RL step

def rollout_requests(mc: ModelConfig, prompts: int, group: int, prompt_len: int, grid) -> list[Request]:
    """prompts x group requests: each prompt `prompt_len` real tokens holding one image of `grid` patches (random
    pixels), its G requests one group (the image encoded once)."""
    rng = np.random.default_rng(0)
    vocab = mc.text.vocab_size
    special = [mc.image_token_id, mc.video_token_id, mc.vision_start_token_id, mc.vision_end_token_id]
    text_ids = np.setdiff1d(np.arange(vocab), special)
    n_img = int(np.prod(grid)) // mc.vision.spatial_merge_size**2
    out = []
    for p in range(prompts):
        tokens = rng.choice(text_ids, size=prompt_len).astype(np.int32)
        tokens[2], tokens[3 + n_img] = mc.vision_start_token_id, mc.vision_end_token_id
        tokens[3 : 3 + n_img] = mc.image_token_id
        pixels = rng.standard_normal((int(np.prod(grid)), mc.vision.patch_dim)).astype(np.float32)
        out += [Request(tokens, p * group + g, pixels, np.asarray([grid], np.int32), group=p) for g in range(group)]
    return out


def parse_step_arm(arm: str) -> tuple[str, str]:
    """`decode/update`: a decode arm and an update arm, or "best" (the fastest update arm the rl part measured)."""
    decode, _, update = arm.partition("/")
    if decode not in DECODE_ARMS:
        raise ValueError(f"step arm {arm!r}: write decode/update, decode one of {sorted(DECODE_ARMS)}")
    if update != "best":
        parse_update_arm(update)
    return decode, update


def run_step(args, reuse: dict, result: dict, save) -> None:
    """Per step arm: rollouts through the engine from a bfloat16 copy of the rl part's policy, then one update;
    into result["steps"], `save()` after each."""
    mc, state, grid = reuse["mc"], reuse["state"], reuse["grid"]
    R, P, N = args.prompts * args.group, args.prompt_len, args.completion
    requests = rollout_requests(mc, args.prompts, args.group, P, grid)
    result["steps"] = []
    for arm in args.step_arms:
        decode, update = parse_step_arm(arm)
        if update == "best" and reuse["compiled"]:
            update = min(reuse["compiled"], key=lambda name: reuse["compiled"][name][2])
        kernel, graph = DECODE_ARMS[decode]
        row = {"arm": f"{decode}/{update}", "decode": decode, "update": update}
        result["steps"].append(row)
        if update not in reuse["compiled"]:
            row["error"] = f"update arm {update} was not measured (or failed) in the rl part"
            save()
            continue
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=N, chunk=args.chunk, page_size=args.page_size,
                                  decode_kernel=kernel, command_buffers=graph)
        try:
            copy = _decoding_copy(mc, state)
            engine = eng.Engine(copy, sampling, slots=R, max_len=P + N, page_size=args.page_size, chunk=args.chunk)
            t0 = time.perf_counter()  # the warm-up compiles the prefill and the chunk: one chunk of draws each
            engine.run([dataclasses.replace(r, max_new_tokens=args.chunk) for r in requests])
            row["rollout_compile_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            rounds = engine.run(requests)
            row["rollout_s"] = time.perf_counter() - t0
            row["completion_tokens"] = int(sum(len(rnd.tokens) for (rnd,) in rounds))
            row["command_buffer_error"] = engine.command_buffer_error
            del copy, engine
            compiled, data, _ = reuse["compiled"][update]
            t0 = time.perf_counter()
            row["loss"] = _one_update(compiled, state, data)
            row["update_s"] = time.perf_counter() - t0
        except Exception as e:  # reported; the other arms still run
            row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
            print(f"step {arm}: {row['error']}", file=sys.stderr, flush=True)
            save()
            continue
        row["step_s"] = row["rollout_s"] + row["update_s"]
        print(f"step {arm}: rollouts {row['rollout_s']:.2f} s ({row['completion_tokens']} tokens) + update "
              f"{row['update_s']:.2f} s", file=sys.stderr, flush=True)
        save()


def _decoding_copy(mc: ModelConfig, state) -> nnx.Module:
    """The policy's weights (trainable and frozen) cast to bfloat16, as rollout/decode_copy.py makes them."""
    graphdef = nnx.split(nnx.eval_shape(lambda: Qwen3VL(mc, rngs=nnx.Rngs(0))), nnx.Param, ...)[0]
    cast = jax.jit(lambda t: jax.tree.map(
        lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x, t))
    return nnx.merge(graphdef, cast(state[0]), cast(state[2]))


def step_markdown(r: dict) -> str:
    lines = [f"Whole RL steps, {r['model']}: {r['prompts']} x {r['group']} rollouts of {r['completion']} tokens after "
             f"{r['prompt_len']}-token prompts (all in slots at once, bf16 decoding copy), then one update", "",
             "| decode / update arm | rollouts s | completion tokens | update s | step s | vs the first arm | "
             "rollouts share | rollout compile |",
             "|---|---|---|---|---|---|---|---|"]
    first = None
    for row in r.get("steps", []):
        if "error" in row:
            lines.append(f"| {row['arm']} | failed: {row['error'][:160]} |||||||")
            continue
        first = first or row["step_s"]
        lines.append(f"| {row['arm']} | {row['rollout_s']:.2f} | {row['completion_tokens']:,} | "
                     f"{row['update_s']:.2f} | {row['step_s']:.2f} | {first / row['step_s']:.2f}x | "
                     f"{row['rollout_s'] / row['step_s']:.0%} | "
                     f"{row['rollout_compile_s']:.0f} s |")
    return "\n".join(lines)


# ------------------------------------------------------------------ the command line

def _rl_args(p) -> None:
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--completion", type=int, default=1024)
    p.add_argument("--image", type=int, default=448, help="image side in pixels (a multiple of 2 x the patch)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--arms", nargs="+", default=["whole:full:auto", "whole:dots:auto", "shared:full:pallas"],
                   help="update arms rows:remat:attention")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--attention-chunk", type=int, default=256, help="the XLA attention path's query block")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the chip's dense bf16 peak (H200 SXM: 989)")
    p.add_argument("--matmul-n", type=int, default=8192)


def _decode_args(p, chunk: int = 32) -> None:
    p.add_argument("--slots", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--context", type=int, default=992, help="cached tokens per sequence")
    p.add_argument("--chunk", type=int, default=chunk)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--decode-arms", nargs="+", choices=list(DECODE_ARMS), default=list(DECODE_ARMS),
                   help="the first and the last run at every slot count")
    p.add_argument("--every-arm-at", type=int, nargs="*", default=[16], help="slot counts that run every arm")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hbm-tbps", type=float, default=4.8, help="the chip's HBM bandwidth (H200: 4.8, H100: 3.35)")
    p.add_argument("--copy-gib", type=float, default=4.0)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="part", required=True)
    models = ["tiny", *ARCHITECTURES]
    parts = {"rl": sub.add_parser("rl", help="the RL update: tokens/s and MFU"),
             "decode": sub.add_parser("decode", help="the paged engine's decode step against the HBM roofline"),
             "all": sub.add_parser("all", help="decode, rl, then whole RL steps (rollouts + update)")}
    for name, p in parts.items():
        p.add_argument("--model", choices=models, default="qwen3-vl-4b")
        p.add_argument("--out", type=Path, default=None)
        if name in ("rl", "all"):
            _rl_args(p)
        if name in ("decode", "all"):
            _decode_args(p)
    parts["all"].add_argument("--step-arms", nargs="+", default=["xla/whole:full:auto", "pallas+graph/best"],
                              help="decode arm/update arm per whole RL step (best: the fastest update arm)")
    args = parser.parse_args(argv)
    given = {name: getattr(args, name) for name in BOUNDS if hasattr(args, name)}
    out = args.out or OUT / f"step_gpu_{args.part}.json"
    try:
        check_counts({f"--{name.replace('_', '-')}": (value, *BOUNDS[name]) for name, value in given.items()})
        check_own_output(out, "--out", OWNER)
    except ConfigError as e:
        parser.error(str(e))
    try:
        for arm in getattr(args, "arms", ()):
            parse_update_arm(arm)
        for arm in getattr(args, "step_arms", ()):
            parse_step_arm(arm)
    except ValueError as e:
        parser.error(str(e))
    if args.part != "all":
        result = _device_info()
        (run_rl if args.part == "rl" else run_decode)(args, result, lambda: _write(out, result))
        print(rl_markdown(result) if args.part == "rl" else decode_markdown(result))
        return
    result = {"decode": _device_info(), "rl": _device_info()}  # the whole RL steps go with the rl part's figures
    save = lambda: _write(out, result)
    built = build_policy(args)  # one random policy for all parts: decode reads its bfloat16 copy
    copy = _decoding_copy(built["mc"], [built["trainable"], None, built["frozen"]])
    run_decode(args, result["decode"], save, copy)
    del copy
    run_step(args, run_rl(args, result["rl"], save, built), result["rl"], save)
    print("\n\n".join((decode_markdown(result["decode"]), rl_markdown(result["rl"]), step_markdown(result["rl"]))))


if __name__ == "__main__":
    main()
