"""Benchmark the Triton fused log-prob/entropy kernel against the materialised torch path on one NVIDIA GPU.

Shapes: N in {8192, 32768}, D = 4096, V = 151,936 (Qwen vocabulary), bfloat16 inputs.
For each N it times and measures peak memory (torch.cuda.max_memory_allocated) of
  triton  : linear_logprob_entropy_triton
  naive   : float32 logits [N, V] materialised, log_softmax, gather, entropy, autograd backward (OOM -> "OOM")
  floor   : bare bf16 matmuls: h @ w for the forward; + dz @ w^T (dh) and h^T @ dz (dw) for the backward
in three modes: forward, forward+backward with a frozen head (dh only), forward+backward (dh and dw).
Before timing it checks the GPU numerics (bf16 dots, bf16 dz) against the float64 reference on a mid-size shape
(several backward chunks) and against the naive path (values and gradients) on the first benchmark shape, and
records the errors.

    python benchmarks/gpu/triton_entropy.py                # GPU run: table + benchmarks/out/triton_entropy.json
    python benchmarks/gpu/triton_entropy.py --sweep        # first time launch configs at the first N, then use the best
    python benchmarks/gpu/triton_entropy.py --interpret    # no GPU: tiny shape under TRITON_INTERPRET=1 (smoke test)
    python benchmarks/gpu/triton_entropy.py --peers        # beside CCE, Liger and verl:
        benchmarks/out/*_peers.{json,md}
    python benchmarks/gpu/triton_entropy.py --peers --interpret   # the peers' parity on tiny shapes, on CPU
Without CUDA and without --interpret it prints why and exits 0.

--peers (benchmarks/gpu/peers.py has the adapters and their conventions): first every kernel's parity against the
float64 reference at N = --parity-n, D = --d, V = --v and --v - 1, in two logit regimes of a trained head (std 4,
mean 0 and mean -16), forward and backward; then, for the kernels that run here, forward and forward+backward
(dh, dw) time and memory above inputs at N in --ns, V = --v, bf16, logits of std 4, targets sampled from the model,
the same timing rules as above, at V = --v and --v - 1, with the bare matmuls (the floor) in the same table and
each kernel's errors from the parity case of that V. A kernel whose package is missing is reported "not
installed"; one that fails, with its error. CCE and Liger compute log p only (cross-entropy); this kernel is timed
both as is and with entropy=False (log p alone) beside them, and the JAX kernel (impl="xla") beside all of them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path

from spatial_jax.cli.script_guard import check_counts, check_own_output, write_own
from spatial_jax.config import ConfigError

OUT_DIR = Path(__file__).resolve().parents[1] / "out"
OWNER = Path(__file__).name
MODES = ("fwd", "fwd_bwd_dh", "fwd_bwd_dh_dw")


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--interpret", action="store_true", help="run a tiny shape under the Triton CPU interpreter")
    p.add_argument("--ns", type=int, nargs="+", default=[8192, 32768], help="numbers of rows N")
    p.add_argument("--d", type=int, default=4096, help="hidden size D")
    p.add_argument("--v", type=int, default=151936, help="vocabulary size V")
    p.add_argument("--blocks", type=int, nargs=3, default=[128, 256, 64], metavar=("BN", "BV", "BD"))
    p.add_argument("--num-warps", type=int, default=8)
    p.add_argument("--num-stages", type=int, default=3, help="software-pipelining depth")
    p.add_argument("--sweep", action="store_true",
                   help="first time forward and forward+backward for a few launch configs at the first N, then run "
                        "the benchmark with the config fastest at forward+backward")
    p.add_argument("--budget-s", type=float, default=2.0, help="target seconds of timed repeats per measurement")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/out/triton_entropy*.json)")
    p.add_argument("--peers", action="store_true", help="parity and timing beside CCE, Liger and verl")
    p.add_argument("--parity-n", type=int, default=256, help="rows N of the --peers parity inputs")
    args = p.parse_args()
    args.out = args.out or OUT_DIR / f"triton_entropy{'_peers' * args.peers}{'_interpret' * args.interpret}.json"
    try:
        check_counts({"--ns": (args.ns, 1, 2**20), "--d": (args.d, 1, 2**16), "--v": (args.v, 2, 2**20),
                      "--blocks": (args.blocks, 1, 2**12), "--num-warps": (args.num_warps, 1, 64),
                      "--num-stages": (args.num_stages, 1, 16), "--budget-s": (args.budget_s, 1e-3, 3600),
                      "--parity-n": (args.parity_n, 1, 2**16)})
        for path in [args.out, args.out.with_suffix(".md")] if args.peers else [args.out]:
            check_own_output(path, "--out", OWNER)
    except ConfigError as e:
        p.error(str(e))
    return args


ARGS = _parse()
if ARGS.interpret:
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first triton import

import peers  # noqa: E402  (benchmarks/gpu/peers.py, beside this script)
import torch  # noqa: E402
import triton  # noqa: E402

from spatial_jax.kernels.logprob_entropy.reference_torch import logprob_entropy  # noqa: E402
from spatial_jax.kernels.logprob_entropy.triton_kernel import linear_logprob_entropy_triton  # noqa: E402


def _naive(h, w, targets, temperature=1.0):
    """The materialised path a trainer would write: float32 logits [N, V]."""
    logp = torch.log_softmax((h @ w).float() / temperature, dim=-1)
    lp = logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return lp, -(logp.exp() * logp).sum(-1)


def _triton(h, w, targets, **overrides):
    bn, bv, bd = ARGS.blocks
    options = dict(block_n=bn, block_v=bv, block_d=bd, num_warps=ARGS.num_warps, num_stages=ARGS.num_stages)
    return linear_logprob_entropy_triton(h, w, targets, **{**options, **overrides})


def _make(n, d, v, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(n, d, generator=g, device=device).to(dtype)
    w = (torch.randn(d, v, generator=g, device=device) * 0.02).to(dtype)  # LM-head scale
    targets = torch.randint(0, v, (n,), generator=g, device=device)
    return h, w, targets


def _run_mode(fn, h, w, targets, g_lp, g_ent, mode):
    """One call of `fn` in `mode`; returns nothing, leaves no grads behind."""
    if mode == "fwd":
        with torch.no_grad():
            fn(h, w, targets)
        return
    hh = h.detach().requires_grad_()
    ww = w.detach().requires_grad_(mode == "fwd_bwd_dh_dw")
    lp, ent = fn(hh, ww, targets)
    inputs = (hh, ww) if ww.requires_grad else (hh,)
    if ent is None:  # a cross-entropy-only kernel
        torch.autograd.grad(lp, inputs, g_lp)
    else:
        torch.autograd.grad((lp, ent), inputs, (g_lp, g_ent))


def _floor(h, w, dz, mode):
    """Bare bf16 GEMMs the fused computation cannot beat: 1 (fwd), 2 (+dh) or 3 (+dh, dw) of [N, D] x [D, V]."""
    z = h @ w
    if mode != "fwd":
        (dz if dz is not None else z) @ w.t()
    if mode == "fwd_bwd_dh_dw":
        h.t() @ (dz if dz is not None else z)


def _measure(call):
    """(median seconds, peak bytes above the memory held before the call) or ('OOM', 'OOM')."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        t0 = time.perf_counter()
        call()  # warm-up: compiles the kernels, sizes the repeat count
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() - base
        reps = max(3, min(20, int(ARGS.budget_s / max(first, 1e-4))))
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return sorted(times)[len(times) // 2], peak
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "OOM", "OOM"


def _errors(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def _grad_rel(fn, h, w, targets, g_lp, g_ent):
    hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
    lp, ent = fn(hh, ww, targets)
    return (lp, ent), torch.autograd.grad((lp, ent), (hh, ww), (g_lp.to(lp.dtype), g_ent.to(ent.dtype)))


def _parity_vs_reference(device, n, d, v, dtypes):
    """Max forward abs error and max gradient relative error vs the float64 reference, per dtype."""
    out = {}
    for dtype in dtypes:
        h, w, targets = _make(n, d, v, dtype, device, seed=1)
        w = w * 50  # logits of tens: peaked rows, like a trained head at low temperature
        g = torch.Generator(device=device).manual_seed(2)
        g_lp, g_ent = torch.randn(n, generator=g, device=device), torch.randn(n, generator=g, device=device)
        # chunks of 1,024 columns: the backward walks several chunks and a partial last one
        fwd, grads = _grad_rel(functools.partial(_triton, vocab_chunk=1024), h, w, targets, g_lp, g_ent)
        rfwd, rgrads = _grad_rel(lambda a, b, t: logprob_entropy(a, b, t), h, w, targets, g_lp, g_ent)
        rel = [((x.double() - y.double()).abs().max() / y.double().abs().max()).item() for x, y in zip(grads, rgrads)]
        out[str(dtype).removeprefix("torch.")] = {"shape": [n, d, v], "fwd_max_abs": _errors(fwd, rfwd),
                                                  "dh_rel": rel[0], "dw_rel": rel[1]}
    return out


def _fmt(x, unit):
    if x == "OOM":
        return "OOM"
    return f"{x * 1e3:.1f} ms" if unit == "s" else f"{x / 2**30:.2f} GiB"


def _ratio(a, b):
    return None if "OOM" in (a, b) or not b else a / b


def _gpu(out_path: Path, device: str) -> None:
    d, v = ARGS.d, ARGS.v
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "d": d, "v": v, "dtype": "bfloat16",
              "blocks": dict(zip(("block_n", "block_v", "block_d"), ARGS.blocks)), "num_warps": ARGS.num_warps,
              "num_stages": ARGS.num_stages, "cases": []}
    result["parity_vs_float64_reference"] = _parity_vs_reference(device, 300, 512, 5003,
                                                                 (torch.float32, torch.bfloat16))
    print(json.dumps(result["parity_vs_float64_reference"], indent=1))
    if ARGS.sweep:
        result["sweep"] = _sweep(ARGS.ns[0], d, v, device)
        timed = [r for r in result["sweep"] if isinstance(r["fwd_bwd_dh_dw"], float)]
        if timed:
            best = min(timed, key=lambda r: r["fwd_bwd_dh_dw"])
            ARGS.blocks, ARGS.num_warps, ARGS.num_stages = best["blocks"], best["num_warps"], best["num_stages"]
            result.update(blocks=dict(zip(("block_n", "block_v", "block_d"), ARGS.blocks)),
                          num_warps=ARGS.num_warps, num_stages=ARGS.num_stages, config_from="sweep")
            print(f"using the sweep's best config: blocks {ARGS.blocks}, warps {ARGS.num_warps}, "
                  f"stages {ARGS.num_stages}", flush=True)
        _write(out_path, result)
    for i, n in enumerate(ARGS.ns):
        h, w, targets = _make(n, d, v, torch.bfloat16, device)
        g = torch.Generator(device=device).manual_seed(3)
        g_lp, g_ent = torch.randn(n, generator=g, device=device), torch.randn(n, generator=g, device=device)
        case = {"n": n, "modes": {}}
        if i == 0:  # informational: the naive path rounds its logits to bf16 before the float32 softmax
            try:
                fwd, grads = _grad_rel(_triton, h, w, targets, g_lp, g_ent)
                nfwd, ngrads = _grad_rel(_naive, h, w, targets, g_lp, g_ent)
                case["fwd_max_abs_vs_naive"] = _errors(fwd, nfwd)
                case["grad_rel_vs_naive"] = [((a.double() - b.double()).norm() / b.double().norm()).item()
                                             for a, b in zip(grads, ngrads)]
                del fwd, grads, nfwd, ngrads
            except torch.cuda.OutOfMemoryError:
                case["fwd_max_abs_vs_naive"] = "OOM"
        for mode in MODES:
            row = {}
            for name, fn in (("triton", _triton), ("naive", _naive)):
                t, m = _measure(lambda fn=fn: _run_mode(fn, h, w, targets, g_lp, g_ent, mode))
                row[name] = {"seconds": t, "peak_bytes": m}
            dz = None if mode == "fwd" else torch.randn(n, v, device=device, dtype=torch.bfloat16)
            t, m = _measure(lambda dz=dz: _floor(h, w, dz, mode))
            dz = None
            row["floor"] = {"seconds": t, "peak_bytes": m}
            row["triton_over_floor_time"] = _ratio(row["triton"]["seconds"], row["floor"]["seconds"])
            row["triton_over_naive_time"] = _ratio(row["triton"]["seconds"], row["naive"]["seconds"])
            row["naive_over_triton_memory"] = _ratio(row["naive"]["peak_bytes"], row["triton"]["peak_bytes"])
            case["modes"][mode] = row
            times = ", ".join(f"{k} {_fmt(row[k]['seconds'], 's')}" for k in ("triton", "naive", "floor"))
            print(f"N={n} {mode}: {times}", flush=True)
        result["cases"].append(case)
        _write(out_path, result)  # a later case may run out of time: keep what is measured
        h = w = targets = None  # frees the device memory before the next shape
    _write(out_path, result)
    _table(result)


# (block_n, block_v, block_d, num_warps, num_stages); None = Triton's default pipelining depth
SWEEP = ((64, 256, 64, 8, 3), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 3),
         (128, 128, 64, 4, 4), (64, 128, 64, 4, 4))


def _sweep(n, d, v, device):
    h, w, targets = _make(n, d, v, torch.bfloat16, device)
    g = torch.Generator(device=device).manual_seed(3)
    g_lp, g_ent = torch.randn(n, generator=g, device=device), torch.randn(n, generator=g, device=device)
    rows = []
    for bn, bv, bd, nw, ns in SWEEP:
        fn = functools.partial(linear_logprob_entropy_triton, block_n=bn, block_v=bv, block_d=bd, num_warps=nw,
                               num_stages=ns)
        row = {"blocks": [bn, bv, bd], "num_warps": nw, "num_stages": ns}
        for mode in ("fwd", "fwd_bwd_dh_dw"):
            try:
                row[mode], _ = _measure(lambda: _run_mode(fn, h, w, targets, g_lp, g_ent, mode))
            except Exception as e:  # a config may not compile (shared memory, registers): record it and go on
                row[mode] = f"error: {type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        shown = [_fmt(row[m], "s") if isinstance(row[m], float) else row[m] for m in ("fwd", "fwd_bwd_dh_dw")]
        print(f"sweep N={n} blocks={bn},{bv},{bd} warps={nw} stages={ns}: fwd {shown[0]}, fwd+bwd {shown[1]}",
              flush=True)
    return rows


def _table(result):
    print(f"\n{result['device']}  D={result['d']} V={result['v']} bf16  blocks={result['blocks']}")
    head = f"{'N':>6} {'mode':<14} {'triton':>10} {'naive':>10} {'floor':>10} {'tri/floor':>9} {'tri/naive':>9}" \
           f" {'mem tri':>10} {'mem naive':>10} {'mem ratio':>9}"
    print(head + "\n" + "-" * len(head))
    for case in result["cases"]:
        for mode, r in case["modes"].items():
            ratios = [r["triton_over_floor_time"], r["triton_over_naive_time"], r["naive_over_triton_memory"]]
            rs = ["-" if x is None else f"{x:.2f}" for x in ratios]
            print(f"{case['n']:>6} {mode:<14} {_fmt(r['triton']['seconds'], 's'):>10} "
                  f"{_fmt(r['naive']['seconds'], 's'):>10} {_fmt(r['floor']['seconds'], 's'):>10} {rs[0]:>9} "
                  f"{rs[1]:>9} {_fmt(r['triton']['peak_bytes'], 'b'):>10} {_fmt(r['naive']['peak_bytes'], 'b'):>10}"
                  f" {rs[2]:>9}")


def _interpret(out_path: Path) -> None:
    """CPU smoke test: a tiny shape through the interpreter, checked against the float64 reference."""
    t0 = time.perf_counter()
    parity = _parity_vs_reference("cpu", 33, 64, 300, (torch.float32, torch.bfloat16))
    result = {"mode": "interpret", "blocks": ARGS.blocks, "parity_vs_float64_reference": parity,
              "seconds": time.perf_counter() - t0}
    _write(out_path, result)
    print(json.dumps(result, indent=1))
    worst = max(max(p["fwd_max_abs"], p["dh_rel"], p["dw_rel"]) for p in parity.values())
    if worst > 2e-2:
        sys.exit(f"interpreter smoke test FAILED: worst error {worst:.3g} > 2e-2")


def _write(path: Path, result: dict) -> None:
    write_own(path, result, OWNER)
    print(f"wrote {path}")


PEER_MODES = ("fwd", "fwd_bwd_dh_dw")


def _peer_parity(result, out_path, n, d, v, device):
    runnable = [p for p in peers.PEERS if p.missing() is None]
    for vocab in (v, v - 1):
        for regime in peers.REGIMES:
            case = peers.parity_case(runnable, n, d, vocab, regime, torch.bfloat16, device)
            result["parity"].append(case)
            print(f"parity V={vocab} {regime}: " + ", ".join(f"{k} {r['verdict']}" for k, r in case["results"].items()),
                  flush=True)
            _write(out_path, result)


def _peer_report(out_path, result):
    text = "\n\n".join([peers.kernels_markdown(result["peers"]), peers.parity_markdown(result["parity"])]
                        + ([peers.timing_markdown(result)] if result.get("cases") else []))
    md = out_path.with_suffix(".md")
    write_own(md, text, OWNER)
    print(f"\n{text}\nwrote {md}")


def _peers_gpu(out_path: Path, device: str) -> None:
    d, v = ARGS.d, ARGS.v
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "python": platform.python_version(), "d": d, "v": v, "dtype": "bfloat16", "parity_n": ARGS.parity_n,
              "regimes_std_mean": peers.REGIMES, "verdict_ok_wrong": {"fwd_nats": [peers.FWD_OK, peers.FWD_WRONG],
                                                                      "grad_rel": [peers.GRAD_OK, peers.GRAD_WRONG]},
              "peers": peers.describe(), "parity": [], "cases": []}
    print(peers.kernels_markdown(result["peers"]), flush=True)
    _peer_parity(result, out_path, ARGS.parity_n, d, v, device)
    timed = [p for p in peers.PEERS if p.timed and p.missing() is None]
    for n in ARGS.ns:
        for vocab in (v, v - 1):
            result["cases"].append(_peer_timing(timed, n, d, vocab, device))
            _write(out_path, result)  # a later shape may run out of time: keep what is measured
    _peer_report(out_path, result)


def _peer_timing(timed, n, d, v, device) -> dict:
    """Every timed kernel's forward and forward+backward time and memory at (n, d, v), then the bare matmuls."""
    h, w = peers.lm_head(n, d, v, torch.bfloat16, device, *peers.REGIMES[peers.TIMED_REGIME], seed=0)
    targets = peers.sample_targets(h, w, seed=0)
    w_dv = w.contiguous() if any(p.contiguous_dv for p in timed) else w
    g = torch.Generator(device=device).manual_seed(3)
    g_lp, g_ent = torch.randn(n, generator=g, device=device), torch.randn(n, generator=g, device=device)
    case = {"n": n, "v": v, "modes": {}}
    for mode in PEER_MODES:
        row = case["modes"][mode] = {}
        for p in timed:
            ww = w_dv if p.contiguous_dv else w
            try:
                if p.timed_call is not None:
                    call, m = p.timed_call(mode, h, ww, targets, g_lp, g_ent)
                    t, _ = _measure(call)
                else:
                    t, m = _measure(lambda: _run_mode(p.fn, h, ww, targets, g_lp, g_ent, mode))
            except Exception as e:  # a peer that fails is reported, and the others still run
                t, m = f"error: {type(e).__name__}: {str(e)[:200]}", "-"
            row[p.name] = {"seconds": t, "peak_bytes": m}
            print(f"N={n} V={v} {mode} {p.name}: {_fmt(t, 's') if isinstance(t, float) else t}, "
                  f"{_fmt(m, 'b') if isinstance(m, int) else m}", flush=True)
        dz = None if mode == "fwd" else torch.randn(n, v, device=device, dtype=torch.bfloat16)
        t, m = _measure(lambda: _floor(h, w, dz, mode))
        row[peers.FLOOR] = {"seconds": t, "peak_bytes": m}
        print(f"N={n} V={v} {mode} floor: {_fmt(t, 's')}", flush=True)
    return case


def _peers_interpret(out_path: Path) -> None:
    """CPU: every installed peer that runs in the interpreter, parity only, at tiny shapes (D a multiple of 128)."""
    result = {"mode": "interpret", "parity_n": 33, "peers": peers.describe(), "parity": []}
    _peer_parity(result, out_path, 33, 128, 384, "cpu")
    _peer_report(out_path, result)
    bad = [c["regime"] for c in result["parity"] if c["results"]["spatial-jax"]["verdict"] != "ok"]
    if bad:
        sys.exit(f"peers interpreter smoke test FAILED: spatial-jax not ok in {bad}")


def main() -> None:
    if ARGS.peers and ARGS.interpret:
        _peers_interpret(ARGS.out)
    elif ARGS.interpret:
        _interpret(ARGS.out)
    elif not torch.cuda.is_available():
        print("triton_entropy benchmark: no CUDA device here; nothing timed. "
              "Run it on an NVIDIA GPU, or pass --interpret for a CPU smoke test.")
    elif ARGS.peers:
        _peers_gpu(ARGS.out, "cuda")
    else:
        _gpu(ARGS.out, "cuda")


if __name__ == "__main__":
    main()
