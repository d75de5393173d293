"""benchmarks/gpu/peers.py on CPU (Triton interpreter): the adapters' interface, parity against the float64 reference
and its verdicts, the tables, verl's load-by-path, and `triton_entropy.py --peers --interpret` end to end.

Peers run here only where they can: Liger's kernel runs in the interpreter (when liger-kernel is installed); CCE's
calls libdevice, which the interpreter lacks, and verl's asserts CUDA tensors, so only its loading is checked.
"""

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "gpu"))

import peers  # noqa: E402

OURS = peers.PEERS[0]
REFERENCE = peers.Peer("float64 reference", peers.reference, peers.BOTH)
SHAPE = dict(n=17, d=128, v=97)


def _case(kernels, regime="std 4", v=SHAPE["v"]):
    return peers.parity_case(kernels, SHAPE["n"], SHAPE["d"], v, regime, torch.bfloat16, "cpu")


def _zero_padded(h, w, targets, block=256):
    """A kernel with verl 0.7.0's fault: the vocabulary's zero padding to a multiple of `block` counts in the
    softmax (each padded logit is 0, as a masked load fills it)."""
    z = torch.nn.functional.pad((h.float() @ w.float()), (0, -w.shape[1] % block))
    logp = torch.log_softmax(z, -1)[:, :w.shape[1]]
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("regime", list(peers.REGIMES))
def test_ours_and_the_reference_through_one_interface(regime):
    for v in (SHAPE["v"], SHAPE["v"] - 1):
        case = _case([OURS, REFERENCE], regime, v)
        assert abs(case["logit_std"] - peers.REGIMES[regime][0]) < 0.5
        assert abs(case["logit_mean"] - peers.REGIMES[regime][1]) < 0.5
        ours, ref = case["results"]["spatial-jax"], case["results"]["float64 reference"]
        assert ours["verdict"] == "ok", ours
        assert ref["verdict"] == "ok" and ref["lp_max_abs"] == 0 and ref["ent_max_abs"] == 0, ref


def test_verdict_catches_zero_padding_in_the_softmax():
    faulty = peers.Peer("zero-padded", _zero_padded, peers.BOTH)
    exact = peers.Peer("unpadded", lambda h, w, t: _zero_padded(h, w, t, block=1), peers.BOTH)
    wrong = _case([faulty, exact], "std 4, mean -16")["results"]
    assert wrong["zero-padded"]["verdict"] == "WRONG" and wrong["zero-padded"]["lp_max_abs"] > 1, wrong
    assert wrong["unpadded"]["verdict"] == "ok", wrong


def test_cross_entropy_only_kernel_is_checked_against_the_lp_only_gradient():
    lp_only = peers.Peer("lp only", lambda h, w, t: (peers.reference(h, w, t)[0], None), peers.LP_ONLY)
    r = _case([lp_only])["results"]["lp only"]
    assert r["ent_max_abs"] is None and r["verdict"] == "ok", r


@pytest.mark.parametrize("errors, expected", [
    (dict(lp_max_abs=1e-4, ent_max_abs=1e-4, dh_rel=5e-3, dw_rel=5e-3), "ok"),
    (dict(lp_max_abs=6e-2, ent_max_abs=None, dh_rel=5e-3, dw_rel=5e-3), "imprecise"),
    (dict(lp_max_abs=1e-4, ent_max_abs=1e-4, dh_rel=5e-2, dw_rel=5e-3), "imprecise"),
    (dict(lp_max_abs=2.0, ent_max_abs=1e-4, dh_rel=5e-3, dw_rel=5e-3), "WRONG"),
    (dict(lp_max_abs=1e-4, ent_max_abs=1e-4, dh_rel=5e-3, dw_rel=0.5), "WRONG"),
    (dict(lp_max_abs=float("nan"), ent_max_abs=1e-4, dh_rel=5e-3, dw_rel=5e-3), "WRONG (non-finite)"),
])
def test_verdict_thresholds(errors, expected):
    assert peers.verdict(errors) == expected


def test_a_failing_kernel_is_reported_not_raised():
    def broken(h, w, t):
        raise RuntimeError("no such kernel")

    r = _case([peers.Peer("broken", broken, peers.BOTH)])["results"]["broken"]
    assert r["verdict"] == "error: RuntimeError: no such kernel"


def test_liger_in_the_interpreter():
    pytest.importorskip("liger_kernel")
    liger = next(p for p in peers.PEERS if p.name == "liger-kernel")
    for regime in peers.REGIMES:
        r = _case([liger], regime)["results"]["liger-kernel"]
        assert r["verdict"] in ("ok", "imprecise"), r  # bf16 logits: up to ~0.1 nats at |logit| ~ 20


def test_cce_in_the_interpreter():
    pytest.importorskip("cut_cross_entropy")
    cce = next(p for p in peers.PEERS if p.name == "cut-cross-entropy")
    r = _case([cce])["results"]["cut-cross-entropy"]
    if r["verdict"].startswith("error: InterpreterError"):
        pytest.skip(f"CCE's kernels call libdevice.log1p, which the Triton interpreter lacks: {r['verdict'][:120]}")
    assert r["verdict"] in ("ok", "imprecise"), r


@pytest.fixture
def restore_modules():
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_verl_kernel_loads_without_its_package_dependencies(tmp_path, restore_modules):
    """verl's kernel asserts CUDA tensors, so on CPU only its loading is checked: from the wheels that
    benchmarks/gpu/fetch_peer_wheels.sh leaves in the git-ignored .whl/ (absent in CI: skipped)."""
    wheels = sorted((ROOT / ".whl").glob("verl-*.whl"))
    if not wheels or not peers.OLD_VERL_WHEEL.exists():
        pytest.skip("no verl wheels in .whl/ (bash benchmarks/gpu/fetch_peer_wheels.sh)")
    if "verl" in sys.modules:
        pytest.skip("a verl package is already imported in this process")
    with zipfile.ZipFile(wheels[-1]) as z:  # verl/__init__.py too: it must not run (it imports ray, tensordict)
        z.extractall(tmp_path, [m for m in z.namelist() if m.startswith("verl/")])
    lce = peers.load_verl_kernel(tmp_path / "verl")
    old = peers.load_wheel_kernel(peers.OLD_VERL_WHEEL, "_verl_old_under_test", tmp_path / "verl")
    new_kernels = importlib.import_module("verl.utils.kernel.kernels")
    old_kernels = importlib.import_module("_verl_old_under_test.kernels")
    assert callable(lce.linear_cross_entropy) and callable(old.linear_cross_entropy)
    assert new_kernels.__file__.startswith(str(tmp_path)) and old_kernels is not new_kernels
    assert not {"verl.protocol", "ray", "tensordict"} & set(sys.modules)


def test_tables_render_every_kind_of_cell():
    ok = dict(lp_max_abs=1e-4, ent_max_abs=2e-4, dh_rel=3e-3, dw_rel=4e-3, verdict="ok")
    result = {"peers": peers.describe(), "v": 151936, "parity": [
        {"v": 151936, "regime": peers.TIMED_REGIME, "results": {"spatial-jax": ok}},
        {"v": 151936, "regime": "std 4, mean -16", "results": {"spatial-jax": dict(ok, lp_max_abs=9.0)}}],
        "cases": [{"n": 8192, "v": 151936, "modes": {"fwd": {
            "spatial-jax": {"seconds": 0.02, "peak_bytes": 2**20},
            "cut-cross-entropy": {"seconds": 0.03, "peak_bytes": 2**21},
            "liger-kernel": {"seconds": "OOM", "peak_bytes": "OOM"},
            "verl": {"seconds": "error: AssertionError: ", "peak_bytes": "-"},
            peers.FLOOR: {"seconds": 0.015, "peak_bytes": 2**30}}}}]}
    table = peers.timing_markdown(result)
    # errors come from the parity case of the timed V and regime, never the other regime's
    assert ("| 8,192 | 151,936 | fwd | spatial-jax | log p + entropy | 20.0 ms | 1.00x | 1.33x | 1.0 MiB | 1.00x | "
            "1.0e-04 | 2.0e-04 | 3.0e-03, 4.0e-03 | ok |") in table
    assert "| cut-cross-entropy | log p only (cross-entropy) | 30.0 ms | 1.50x | 2.00x | 2.0 MiB | 2.00x | - |" \
        in table
    assert f"| {peers.FLOOR} | - | 15.0 ms | 0.75x | 1.00x | 1.00 GiB |" in table
    assert "| OOM | - |" in table and "error: AssertionError" in table
    assert "| spatial-jax | this checkout | log p + entropy | ok |" in peers.kernels_markdown(result["peers"])


@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd_dh_dw"])
def test_jax_kernel_timed_call_and_memory(mode):
    h, w = peers.lm_head(9, 128, 70, torch.float32, "cpu", 4.0, 0.0, seed=3)
    targets = peers.sample_targets(h, w, seed=3)
    g_lp, g_ent = torch.randn(9), torch.randn(9)
    call, memory = peers.jax_timed(mode, h, w, targets, g_lp, g_ent)
    out = call()
    assert memory > 0
    assert [tuple(x.shape) for x in out] == ([(9,), (9,)] if mode == "fwd" else [(9, 128), (128, 70)])
    hh, ww = h.double().requires_grad_(), w.double().requires_grad_()
    r_lp, r_ent = peers.reference(hh, ww, targets)
    r_dh, r_dw = torch.autograd.grad((g_lp.double() * r_lp + g_ent.double() * r_ent).sum(), (hh, ww))
    expected = (r_lp, r_ent) if mode == "fwd" else (r_dh, r_dw)
    for x, ref in zip(out, expected):  # float32 inputs: the JAX kernel within 1e-4 of float64
        assert (torch.from_dlpack(x).double() - ref).abs().max() < 1e-4


def test_script_peers_interpret(tmp_path):
    out = tmp_path / "peers.json"
    script = ROOT / "benchmarks" / "gpu" / "triton_entropy.py"
    res = subprocess.run([sys.executable, str(script), "--peers", "--interpret", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    md = out.with_suffix(".md").read_text()
    assert "| spatial-jax | log p + entropy | 384 |" in md and "| spatial-jax | log p + entropy | 383 |" in md
