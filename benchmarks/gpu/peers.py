"""The fused LM-head kernels users already run, beside this project's, for `benchmarks/gpu/triton_entropy.py --peers`.

Every adapter has one signature,

    fn(h [N, D], w [D, V], targets [N] int64) -> (log p(target) [N] float32, entropy [N] float32 or None),

differentiable in h and w. w is this project's layout; the peers take the head as nn.Linear stores it, [V, D], and
get w.t(): no copy when w is itself the transposed view of such a head, which is how the benchmark builds it.

  spatial-jax        spatial_jax/kernels/logprob_entropy/triton_kernel.py: log p and entropy; with
                     entropy=False ("spatial-jax, log p only") log p alone, timed beside the cross-entropy-only peers.
  spatial-jax JAX    spatial_jax.kernels (impl="xla": chunked online log-sum-exp, custom VJP) under jax.jit on the
                     same device, given the torch tensors through DLPack (no copy; w as a contiguous [D, V] array);
                     forward + backward is one program, jax.grad of g_lp . lp + g_H . H. Its memory is XLA's
                     buffer assignment (temporaries + outputs), since torch's allocator does not see JAX's.
  cut-cross-entropy  Apple's CCE, linear_cross_entropy(e [N, D], c [V, D], targets, reduction="none"): per-token
                     cross-entropy, so log p = -loss; no entropy. Default options as users run them: its backward
                     skips vocabulary blocks whose gradient is below filter_eps ("high": bf16 eps / 32).
  liger-kernel       Liger's LigerFusedLinearCrossEntropyFunction (liger_fused_linear_cross_entropy), weight [V, D],
                     reduction="none": per-token cross-entropy, log p = -loss; no entropy. Logits are materialised
                     in bf16, a chunk of rows at a time, and recomputed in backward when reduction="none".
  verl               verl.utils.kernel.linear_cross_entropy(hidden, weight [V, D], labels, temperature, "none") ->
                     (logprobs, entropy); contiguous CUDA tensors, D % 128 == 0.
  verl 0.7.0         the same kernel as released before verl PR 5349 (first in 0.7.1) masked the vocabulary tail's
                     zero padding out of the log-sum-exp (verl issues 2656, 2899); parity only.

verl's package __init__ files import ray, tensordict, transformers and hydra, none of which its kernel uses: the
adapters register verl and verl.utils as bare packages over their folders, so that only verl/utils/kernel,
verl/utils/device.py and verl/plugin/platform (torch and packaging alone) run. verl 0.7.0's kernel files are read
from its wheel in .whl/parity-only/ (benchmarks/gpu/fetch_peer_wheels.sh) and imported under another package name,
beside the current verl, whose device helpers serve both.

Parity (parity_case): every adapter against the float64 reference
(spatial_jax/kernels/logprob_entropy/reference_torch.py) on the same bf16 inputs, forward and backward; log p and
entropy by max abs error over rows, dh and dw by ||g - ref|| / ||ref||, with the reference's gradient of the same
objective (g_lp . log p, plus g_H . H for the kernels that return entropy).
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import math
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from spatial_jax.kernels.logprob_entropy.reference_torch import logprob_entropy
from spatial_jax.kernels.logprob_entropy.triton_kernel import linear_logprob_entropy_triton

ROOT = Path(__file__).resolve().parents[2]
OLD_VERL_WHEEL = ROOT / ".whl" / "parity-only" / "verl-0.7.0-py3-none-any.whl"

BOTH = "log p + entropy"
LP_ONLY = "log p only (cross-entropy)"

# Logit regimes of a trained head, as (std, mean) of h @ w. Mean -16 leaves the softmax as it is but puts most of
# the vocabulary far below 0 and the top tokens near it: there a zero-padded column (exp(0) each) swamps the true
# sum of exp, the case of verl issues 2656 and 2899, and bf16 rounding of the logits is coarser.
REGIMES = {"std 4": (4.0, 0.0), "std 4, mean -16": (4.0, -16.0)}
TIMED_REGIME = "std 4"  # the logits the timing runs on

# Verdict thresholds. Forward in nats (max abs over rows); gradients relative, norm-wise. Above OK but within
# WRONG is "imprecise": logits rounded to bf16 (spacing 1/16 to 1/8 at |logit| 8 to 32) land there, float32 logits
# far below; beyond WRONG, or non-finite, is "WRONG".
FWD_OK, FWD_WRONG = 1e-2, 0.5
GRAD_OK, GRAD_WRONG = 2e-2, 0.2


def ours(h, w, targets):
    return linear_logprob_entropy_triton(h, w, targets)


def reference(h, w, targets):
    """Float64, materialised logits: the yardstick, through the same interface."""
    return logprob_entropy(h, w, targets)


def ours_lp_only(h, w, targets):
    return linear_logprob_entropy_triton(h, w, targets, entropy=False)


@functools.cache
def _jax_programs():
    """(forward, forward + backward) of the JAX kernel, jitted once."""
    import jax
    import jax.numpy as jnp

    from spatial_jax.kernels import linear_logprob_entropy as jax_kernel

    def forward(h, w, targets):
        return jax_kernel(h, w, targets, impl="xla")

    def objective(h, w, targets, g_lp, g_ent):
        lp, ent = forward(h, w, targets)
        return jnp.sum(g_lp * lp + g_ent * ent)

    return jax.jit(forward), jax.jit(jax.grad(objective, argnums=(0, 1)))


def _to_jax(*tensors):
    import jax

    return [jax.dlpack.from_dlpack(t.detach().contiguous()) for t in tensors]


def jax_inputs(h, w, targets, g_lp, g_ent):
    """The JAX kernel's arguments as JAX arrays over the same device memory (targets as int32, JAX's default)."""
    return _to_jax(h, w, targets.to(torch.int32), g_lp.float(), g_ent.float())


def jax_forward_backward(h, w, targets, g_lp, g_ent):
    """forward_backward's result for the JAX kernel, as torch tensors."""
    hj, wj, tj, glj, gej = jax_inputs(h, w, targets, g_lp, g_ent)
    forward, grads = _jax_programs()
    return tuple(torch.from_dlpack(x) for x in (*forward(hj, wj, tj), *grads(hj, wj, tj, glj, gej)))


def jax_timed(mode, h, w, targets, g_lp, g_ent):
    """(a call of the JAX kernel in `mode` that waits for its result, bytes it holds above its inputs)."""
    import jax

    args = jax_inputs(h, w, targets, g_lp, g_ent)
    forward, grads = _jax_programs()
    fn, args = (forward, args[:3]) if mode == "fwd" else (grads, args)
    mem = fn.lower(*args).compile().memory_analysis()
    return (lambda: jax.block_until_ready(fn(*args))), int(mem.temp_size_in_bytes + mem.output_size_in_bytes
                                                           - mem.alias_size_in_bytes)


def cce(h, w, targets):
    from cut_cross_entropy import linear_cross_entropy

    return -linear_cross_entropy(h, w.t(), targets, reduction="none"), None


def liger(h, w, targets):
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return -liger_fused_linear_cross_entropy(h, w.t(), targets, reduction="none"), None


def verl(h, w, targets):
    return _verl_kernel().linear_cross_entropy(h, w.t().contiguous(), targets, 1.0, "none")


def verl_070(h, w, targets):
    return _old_verl_kernel().linear_cross_entropy(h, w.t().contiguous(), targets, 1.0, "none")


def _verl_root() -> Path | None:
    spec = importlib.util.find_spec("verl")  # finds the package without running its __init__
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def _bare_package(name: str, folder: Path) -> None:
    if name not in sys.modules:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
        sys.modules[name] = importlib.util.module_from_spec(spec)


def load_verl_kernel(root: Path):
    """verl.utils.kernel.linear_cross_entropy from the verl package folder `root`, its __init__ files not run."""
    _bare_package("verl", root)
    _bare_package("verl.utils", root / "utils")
    return importlib.import_module("verl.utils.kernel.linear_cross_entropy")


def load_wheel_kernel(wheel: Path, name: str, root: Path):
    """verl/utils/kernel of `wheel` imported as package `name`; its `from verl.utils.device import ...` is served by
    the verl at `root`. The files go to a temporary folder because Triton reads a kernel's source from its file."""
    load_verl_kernel(root)
    folder = Path(tempfile.gettempdir()) / name
    folder.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        for member in z.namelist():
            if member.startswith("verl/utils/kernel/") and member.endswith(".py"):
                (folder / Path(member).name).write_bytes(z.read(member))
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return importlib.import_module(f"{name}.linear_cross_entropy")


@functools.cache
def _verl_kernel():
    return load_verl_kernel(_verl_root())


@functools.cache
def _old_verl_kernel():
    return load_wheel_kernel(OLD_VERL_WHEEL, "_verl_0_7_0_kernel", _verl_root())


def _installed(module: str, dist: str) -> Callable[[], str | None]:
    return lambda: None if importlib.util.find_spec(module) else f"not installed (pip package {dist})"


def _old_verl_missing() -> str | None:
    if not OLD_VERL_WHEEL.exists():
        return f"not installed ({OLD_VERL_WHEEL.relative_to(ROOT)} missing: bash benchmarks/gpu/fetch_peer_wheels.sh)"
    return _installed("verl", "verl")()


@dataclass(frozen=True)
class Peer:
    name: str
    fn: Callable
    computes: str
    missing: Callable[[], str | None] = lambda: None  # why it cannot run here, or None
    dist: str | None = None  # pip distribution, for its version
    timed: bool = True
    contiguous_dv: bool = False  # given w as a contiguous [D, V] tensor rather than a [V, D] head's view
    release: str | None = None  # version known without package metadata
    # a kernel outside torch autograd (the JAX one): its own forward_backward, and its own timed call and memory
    forward_backward: Callable | None = None
    timed_call: Callable | None = None

    def version(self) -> str:
        if self.release or self.dist is None:
            return self.release or "this checkout"
        try:
            return importlib.metadata.version(self.dist)
        except importlib.metadata.PackageNotFoundError:
            return "-"


PEERS = (
    Peer("spatial-jax", ours, BOTH),
    # RESULTS.md's layout: w [D, V] contiguous; the row above gets an nn.Linear head's transposed view like the peers
    Peer("spatial-jax, w [D,V] contiguous", ours, BOTH, contiguous_dv=True),
    Peer("spatial-jax, log p only", ours_lp_only, LP_ONLY),
    Peer("spatial-jax JAX (xla)", None, BOTH, _installed("jax", "jax"), "jax", contiguous_dv=True,
         forward_backward=jax_forward_backward, timed_call=jax_timed),
    Peer("cut-cross-entropy", cce, LP_ONLY, _installed("cut_cross_entropy", "cut-cross-entropy"), "cut-cross-entropy"),
    Peer("liger-kernel", liger, LP_ONLY, _installed("liger_kernel", "liger-kernel"), "liger-kernel"),
    Peer("verl", verl, BOTH, _installed("verl", "verl"), "verl"),
    Peer("verl 0.7.0", verl_070, BOTH, _old_verl_missing, timed=False, release="0.7.0, kernel files of its wheel"),
)


def describe(peers=PEERS) -> list[dict]:
    return [{"name": p.name, "computes": p.computes, "version": p.version(), "status": p.missing() or "ok",
             "timed": p.timed} for p in peers]


def lm_head(n, d, v, dtype, device, logit_std, logit_mean, seed):
    """h [N, D] and w [D, V] = head.t(), the transposed view of a head stored [V, D] as nn.Linear holds it, with
    logits h @ w of mean logit_mean and std about logit_std: feature 0 of h is the constant 1 against a head column
    of logit_mean (a bias folded in); the other D - 1 features are N(0, 1) against weights N(0, std^2 / (D - 1))."""
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(n, d, generator=g, device=device)
    h[:, 0] = 1.0
    head = torch.randn(v, d, generator=g, device=device) * (logit_std / math.sqrt(d - 1))
    head[:, 0] = logit_mean
    return h.to(dtype), head.to(dtype).t()


def sample_targets(h, w, seed, rows=1024):
    """Tokens drawn from softmax(h @ w), as a rollout samples them; float32 logits, `rows` rows at a time."""
    g = torch.Generator(device=h.device).manual_seed(seed)
    out = torch.empty(h.shape[0], dtype=torch.long, device=h.device)
    for i in range(0, h.shape[0], rows):
        probs = torch.softmax((h[i:i + rows] @ w).float(), dim=-1)
        out[i:i + rows] = torch.multinomial(probs, 1, generator=g).squeeze(1)
    return out


def forward_backward(fn, h, w, targets, g_lp, g_ent):
    """(lp, entropy or None, dh, dw) of fn, the backward seeded with g_lp (and g_ent where fn returns entropy)."""
    hh, ww = h.detach().requires_grad_(), w.detach().requires_grad_()
    lp, ent = fn(hh, ww, targets)
    outs, cots = ((lp, ent), (g_lp, g_ent)) if ent is not None else ((lp,), (g_lp,))
    dh, dw = torch.autograd.grad(outs, (hh, ww), [c.to(o.dtype) for o, c in zip(outs, cots)])
    return lp.detach(), None if ent is None else ent.detach(), dh, dw


def _reference(h, w, targets, g_lp, g_ent):
    """Float64 values and two sets of gradients: of g_lp . lp + g_H . H, and of g_lp . lp alone."""
    hh, ww = h.double().requires_grad_(), w.double().requires_grad_()
    lp, ent = reference(hh, ww, targets)
    full = torch.autograd.grad((lp, ent), (hh, ww), (g_lp.double(), g_ent.double()), retain_graph=True)
    return lp.detach(), ent.detach(), full, torch.autograd.grad(lp, (hh, ww), g_lp.double())


def _max_abs(x, ref):
    return (x.double() - ref).abs().max().item()


def _rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def verdict(errors: dict) -> str:
    fwd = [errors[k] for k in ("lp_max_abs", "ent_max_abs") if errors.get(k) is not None]
    grad = [errors[k] for k in ("dh_rel", "dw_rel")]
    if not all(math.isfinite(x) for x in fwd + grad):
        return "WRONG (non-finite)"
    if max(fwd) > FWD_WRONG or max(grad) > GRAD_WRONG:
        return "WRONG"
    return "imprecise" if max(fwd) > FWD_OK or max(grad) > GRAD_OK else "ok"


def parity(peers, h, w, targets, g_lp, g_ent) -> dict[str, dict]:
    """Each peer's errors against the float64 reference on these inputs, and its verdict (or its error)."""
    r_lp, r_ent, r_full, r_lp_only = _reference(h, w, targets, g_lp, g_ent)
    w_dv = w.contiguous() if any(p.contiguous_dv for p in peers) else w
    out = {}
    for p in peers:
        try:
            ww = w_dv if p.contiguous_dv else w
            if p.forward_backward is not None:
                lp, ent, dh, dw = p.forward_backward(h, ww, targets, g_lp, g_ent)
            else:
                lp, ent, dh, dw = forward_backward(p.fn, h, ww, targets, g_lp, g_ent)
            r_dh, r_dw = r_lp_only if ent is None else r_full
            errors = {"lp_max_abs": _max_abs(lp, r_lp), "ent_max_abs": None if ent is None else _max_abs(ent, r_ent),
                      "dh_rel": _rel(dh, r_dh), "dw_rel": _rel(dw, r_dw)}
            out[p.name] = {**errors, "verdict": verdict(errors)}
        except Exception as e:  # a peer that fails is reported, not fatal
            out[p.name] = {"verdict": f"error: {type(e).__name__}: {str(e)[:300]}"}
    return out


def parity_case(peers, n, d, v, regime, dtype, device, seed=1):
    """Inputs of one logit regime at (n, d, v) and every peer's parity on them. The first rows aim at the last
    vocabulary ids, the tile where padding bugs live; the others at tokens sampled from the model."""
    std, mean = REGIMES[regime]
    h, w = lm_head(n, d, v, dtype, device, std, mean, seed)
    targets = sample_targets(h, w, seed)
    tail = min(4, n)
    targets[:tail] = v - 1 - torch.arange(tail, device=device)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    g_lp, g_ent = torch.randn(n, generator=g, device=device), torch.randn(n, generator=g, device=device)
    with torch.no_grad():
        z = h.double() @ w.double()
        ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    case = {"n": n, "d": d, "v": v, "regime": regime, "logit_mean": z.mean().item(), "logit_std": z.std().item(),
            "logit_max_mean": z.max(-1).values.mean().item(), "entropy_mean": ent.mean().item()}
    del z, ent
    case["results"] = parity(peers, h, w, targets, g_lp, g_ent)
    return case


def _e(x):
    return "-" if x is None else f"{x:.1e}"


def parity_markdown(cases) -> str:
    lines = ["| kernel | computes | V | logits | log p max abs err | entropy max abs err | dh rel err | dw rel err "
             "| verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        logits = (f"{c['regime']}: mean {c['logit_mean']:.1f}, std {c['logit_std']:.1f}, row max "
                  f"{c['logit_max_mean']:.1f}, H {c['entropy_mean']:.2f} nats")
        for name, r in c["results"].items():
            computes = next((p.computes for p in PEERS if p.name == name), "-")
            lines.append(f"| {name} | {computes} | {c['v']:,} | {logits} | {_e(r.get('lp_max_abs'))} | "
                         f"{_e(r.get('ent_max_abs'))} | {_e(r.get('dh_rel'))} | {_e(r.get('dw_rel'))} | "
                         f"{r['verdict']} |")
    return "\n".join(lines)


def _cell(x, unit):
    if not isinstance(x, (int, float)):
        return str(x)
    if unit == "s":
        return f"{x * 1e3:.1f} ms"
    return f"{x / 2**30:.2f} GiB" if x >= 2**30 else f"{x / 2**20:.1f} MiB"


def _vs(x, base):
    ok = all(isinstance(a, (int, float)) for a in (x, base)) and base
    return f"{x / base:.2f}x" if ok else "-"


FLOOR = "matmul floor (cuBLAS)"


def timing_markdown(result) -> str:
    """Time and memory above inputs per (N, V, mode, kernel), against the first kernel (spatial-jax) and the bare
    matmuls, with each kernel's errors against the float64 reference from the parity case of the same V and logit
    regime (rows N = parity_n)."""
    computes = {p["name"]: p["computes"] for p in result["peers"]}
    errors = {(c["v"], name): r for c in result.get("parity", ()) if c["regime"] == TIMED_REGIME
              for name, r in c["results"].items()}
    lines = ["| N | V | mode | kernel | computes | time (median) | vs spatial-jax | vs floor | memory above inputs "
             "| vs spatial-jax | log p err | entropy err | dh, dw rel err | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case in result["cases"]:
        v = case.get("v", result["v"])
        for mode, row in case["modes"].items():
            base, floor = next(iter(row.values())), row.get(FLOOR, {})
            for name, r in row.items():
                e = errors.get((v, name), {})
                grads = "-" if "dh_rel" not in e else f"{_e(e['dh_rel'])}, {_e(e['dw_rel'])}"
                lines.append(f"| {case['n']:,} | {v:,} | {mode} | {name} | {computes.get(name, '-')} | "
                             f"{_cell(r['seconds'], 's')} | {_vs(r['seconds'], base['seconds'])} | "
                             f"{_vs(r['seconds'], floor.get('seconds'))} | {_cell(r['peak_bytes'], 'b')} | "
                             f"{_vs(r['peak_bytes'], base['peak_bytes'])} | {_e(e.get('lp_max_abs'))} | "
                             f"{_e(e.get('ent_max_abs'))} | {grads} | {e.get('verdict', '-')} |")
    return "\n".join(lines)


def kernels_markdown(described) -> str:
    lines = ["| kernel | version | computes | status |", "|---|---|---|---|"]
    lines += [f"| {p['name']} | {p['version']} | {p['computes']} | {p['status']}"
              f"{'' if p['timed'] else ' (parity only)'} |" for p in described]
    return "\n".join(lines)
