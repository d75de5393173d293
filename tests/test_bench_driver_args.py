"""Issue 44, findings 1, 8, 9 and 13: the benchmark drivers (papers, learning, uncertain, rollout_gap) share one
argument check (benchmarks/papers/driver_args.py, over the commands' guards in spatial_jax/cli/outputs.py and
script_guard.py), made before anything is written: --results never names the config (or any non-Markdown file),
counts are bounded and fit on the disk, seeds are distinct, and an override of a setting the driver owns is
refused."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "papers"))

import learning  # noqa: E402
import paper_spatialthinker  # noqa: E402
import papers  # noqa: E402
import rollout_gap  # noqa: E402
import uncertain  # noqa: E402

from spatial_jax.cli import main  # noqa: E402

HUGE = "99999999999999"


@pytest.fixture
def no_runs(monkeypatch):
    for module in (papers, learning, uncertain, rollout_gap):
        monkeypatch.setattr(module, "run_seed", lambda *a: pytest.fail("a run started"))
    monkeypatch.setattr(uncertain, "write_data", lambda *a: pytest.fail("data written"))


def _refused(driver, argv, capsys, needle):
    assert driver.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "configuration error" in err, err


def test_results_naming_the_config_or_a_non_markdown_file_is_refused_and_kept(tmp_path, no_runs, capsys):
    config = tmp_path / "st.toml"
    shutil.copy(ROOT / paper_spatialthinker.CONFIG, config)
    shutil.copy(ROOT / "configs" / "tiny_cpu.toml", tmp_path)  # the base it names, beside it
    before = config.read_bytes()
    out = ["--out", str(tmp_path / "out"), "--seeds", "0"]
    _refused(papers, ["--paper", "spatialthinker", "--config", str(config), "--results", str(config), *out], capsys,
             "would overwrite its input")
    other = tmp_path / "other.toml"
    other.write_text("x = 1\n")
    _refused(papers, ["--paper", "spatialthinker", "--config", str(config), "--results", str(other), *out], capsys,
             "is not a Markdown file")
    _refused(learning, ["--config", str(config), "--results", str(config), *out], capsys, "would overwrite its input")
    _refused(uncertain, ["--config", str(config), "--results", str(config), *out], capsys, "would overwrite its input")
    assert config.read_bytes() == before and other.read_text() == "x = 1\n" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("driver, argv, needle", [
    (papers, ["--paper", "prosr", "run_dir=/x"], "run_dir= is set by the driver"),
    (papers, ["--paper", "prosr", "policy.checkpoint=/x"], "policy.checkpoint= is set by the driver"),
    (learning, ["seed=3"], "seed= is set by the driver"),
    (rollout_gap, ["run_dir=/x"], "run_dir= is set by the driver"),
    (rollout_gap, ["--seeds", "0", "0"], "--seeds must be distinct"),
    (uncertain, ["data.train=/x.jsonl"], "data.train= is set by the driver"),
    (uncertain, ["--seeds", "0", "0"], "--seeds must be distinct"),
    (uncertain, ["--train-rows", "-5"], "--train-rows must lie in [1, 1000000000], got -5"),
    (uncertain, ["--eval-rows", "0"], "--eval-rows must lie in [1, 1000000000], got 0"),
    (uncertain, ["--train-rows", HUGE], f"--train-rows must lie in [1, 1000000000], got {HUGE}"),
    (uncertain, ["--train-rows", "1000000000"], "GiB free"),  # within the bound, beyond the disk
    (uncertain, ["--seeds", str(2**31)], "--seeds must be distinct integers in [0, 2**31)"),
    (papers, ["--paper", "prosr", "--out", ""], "--out is empty"),
])
def test_driver_arguments_are_refused_before_anything_is_written(driver, argv, needle, tmp_path, no_runs, capsys):
    argv = ["--out", str(tmp_path / "out"), *argv]
    _refused(driver, argv, capsys, needle)
    assert not (tmp_path / "out").exists()


def test_gen_data_refuses_a_count_the_disk_cannot_hold(tmp_path, capsys):
    assert main(["gen-data", "--out", str(tmp_path / "d"), "--num-train", HUGE, "--num-eval", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spatial-jax gen-data: configuration error: --out") and "GiB free" in err
    assert not (tmp_path / "d").exists()
