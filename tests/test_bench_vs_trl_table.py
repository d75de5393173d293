"""benchmarks/papers/vs_trl.py's table, pinned in full where trl is not installed (the driver's own test skips there):
each column the median (min-max) of the timed pairs, the last column the median of the per-pair ratios (not the ratio
of the medians), the first step's excess over the median, the mean completion lengths and peak RSS, the load line
and the package versions."""

import importlib.metadata
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "papers"))

import vs_trl  # noqa: E402

# what importlib.metadata says on a host with the bench extra but without accelerate
VERSIONS = {"jax": "0.10.2", "jaxlib": "0.10.2", "torch": "2.13.0+cpu", "transformers": "5.25.0", "trl": "1.16.0"}


def _version(name):
    if name not in VERSIONS:
        raise importlib.metadata.PackageNotFoundError(name)
    return VERSIONS[name]


@pytest.fixture
def host(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", _version)
    monkeypatch.setattr(vs_trl.os, "cpu_count", lambda: 2)


def _step(sampling, update, length, rss):
    """One worker's answer to a step, as both workers send it."""
    return {"sampling": sampling, "update": update, "length": length, "rss_mb": rss}


# a warm-up pair (spatial-jax compiling: 11.75 s), then three timed pairs
RUNS = {"spatial-jax": [_step(9.5, 2.25, 192.0, 1480.0), _step(1.0, 0.75, 120.0, 1600.0),
                        _step(1.25, 0.85, 124.0, 1620.0), _step(0.5, 1.0, 119.0, 1654.27)],
        "trl": [_step(1.5, 1.5, 40.0, 1200.0), _step(1.5, 1.25, 118.0, 1300.0), _step(1.0, 1.5, 126.0, 1350.0),
                _step(0.75, 1.5, 125.0, 1367.14)]}
READY = {"spatial-jax": {"ready": True, "signature": [], "rss_mb": 384.05},
         "trl": {"ready": True, "signature": [], "rss_mb": 722.23}}
COMMAND = "python benchmarks/papers/vs_trl.py --pairs 4 --load 1.5"


def test_table_pinned(host):
    """Steps: spatial-jax 1.75, 2.10, 1.50 s, TRL 2.75, 2.50, 2.25 s: per-pair ratios 1.57, 1.19, 1.50, whose median
    1.50 is not the ratio of the medians (2.50 / 1.75 = 1.43). Lengths and RSS leave the warm-up out and take the
    last answer, in GB of 1024 MB (each just over a rounding edge that 1,025 would not reach); the second pair started
    on a busy host."""
    text = vs_trl.table(RUNS, READY, [(1.1, True), (1.62, False), (1.38, True)], 1.5, COMMAND, "AMD EPYC")
    assert text == (
        "`python benchmarks/papers/vs_trl.py --pairs 4 --load 1.5`; AMD EPYC, 2 cores; jax 0.10.2, jaxlib 0.10.2, "
        "torch 2.13.0+cpu, transformers 5.25.0, trl 1.16.0, accelerate (not installed). 3 timed pairs after one "
        "warm-up pair; load average (1 min) at each pair's start: 1.10, 1.62, 1.38 (2 of 3 below 1.5; the others ran "
        "on a busy host: a quiet-host measurement is still owed). Mean completion length: spatial-jax 121, TRL 123 "
        "tokens.\n"
        "\n"
        "| | spatial-jax | TRL | TRL / spatial-jax |\n"
        "|---|---|---|---|\n"
        "| step | 1.75 s (1.50-2.10) | 2.50 s (2.25-2.75) | 1.50x (1.19-1.57) |\n"
        "| sampling | 1.00 s (0.50-1.25) | 1.00 s (0.75-1.50) | 1.50x (0.80-1.50) |\n"
        "| update | 0.85 s (0.75-1.00) | 1.50 s (1.25-1.50) | 1.67x (1.50-1.76) |\n"
        "| first step over the median (compile) | +10.0 s | +0.5 s | |\n"
        "| peak RSS | 1.62 GB (0.38 before the first step) | 1.34 GB (0.71 before) | |")


def test_table_on_a_quiet_host_owes_nothing(host):
    """Every pair below the threshold: the load line ends with the count alone."""
    text = vs_trl.table(RUNS, READY, [(1.1, True), (1.32, True), (1.38, True)], 1.5, COMMAND, "AMD EPYC")
    assert text.splitlines()[0].endswith(
        "load average (1 min) at each pair's start: 1.10, 1.32, 1.38 (3 of 3 below 1.5). Mean completion length: "
        "spatial-jax 121, TRL 123 tokens.")


def test_spread_and_versions(host):
    assert vs_trl.spread([0.97, 1.13, 0.67, 1.05]) == "1.01 s (0.67-1.13)"
    assert vs_trl.versions() == ("jax 0.10.2, jaxlib 0.10.2, torch 2.13.0+cpu, transformers 5.25.0, trl 1.16.0, "
                                 "accelerate (not installed)")
