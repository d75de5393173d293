"""benchmarks/papers/vs_trl.py's bookkeeping (the comparison itself is a benchmark, not a test): the prompt check that
must hold before anything is timed, the table's medians, ratios and first-step column, and its argument errors, each
one line before any worker starts."""

import importlib.util
import sys
from pathlib import Path

import pytest

# found, not imported: importing trl takes seconds, and the bookkeeping does not need it
pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed (.[bench])")

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "papers"))

import vs_trl  # noqa: E402


def _run(sampling, update, length=100.0, rss=1024.0):
    return {"sampling": sampling, "update": update, "length": length, "rss_mb": rss}


def test_prompt_check_table_and_argument_errors(tmp_path, capsys):
    same = [{"ids": [1, 2, 3], "pixels": "ab", "grid": [[1, 4, 4]]},
            {"ids": [4, 5], "pixels": "cd", "grid": [[1, 4, 4]]}]
    vs_trl.check_same_prompts(same, [dict(s) for s in same])
    for key, value in (("ids", [1, 2, 4]), ("pixels", "ac"), ("grid", [[1, 2, 8]])):
        other = [dict(same[0], **{key: value}), same[1]]
        with pytest.raises(RuntimeError, match=f"prompt 0: the sides' {key} differ"):
            vs_trl.check_same_prompts(same, other)
    with pytest.raises(RuntimeError, match="2 prompts, TRL 1"):
        vs_trl.check_same_prompts(same, same[:1])

    # a warm-up pair, then three: spatial-jax's steps 2, 3, 4 s; TRL's 3, 3, 2 s (ratios 1.5, 1.0, 0.5)
    runs = {"spatial-jax": [_run(10.0, 5.0), _run(1.0, 1.0), _run(1.0, 2.0), _run(2.0, 2.0, rss=2048.0)],
            "trl": [_run(4.0, 1.0, 120.0), _run(2.0, 1.0, 120.0), _run(1.0, 2.0, 120.0), _run(1.0, 1.0, 120.0)]}
    ready = {"spatial-jax": {"rss_mb": 512.0}, "trl": {"rss_mb": 256.0}}
    text = vs_trl.table(runs, ready, [(0.5, True), (2.0, False), (1.0, True)], 1.5, "cmd", "cpu")
    assert "| step | 3.00 s (2.00-4.00) | 3.00 s (2.00-3.00) | 1.00x (0.50-1.50) |" in text
    assert "| sampling | 1.00 s (1.00-2.00) | 1.00 s (1.00-2.00) | 1.00x (0.50-2.00) |" in text
    assert "| first step over the median (compile) | +12.0 s | +2.0 s | |" in text
    assert "| peak RSS | 2.00 GB (0.50 before the first step) | 1.00 GB (0.25 before) | |" in text
    assert "2 of 3 below 1.5; the others ran on a busy host: a quiet-host measurement is still owed" in text
    assert "spatial-jax 100, TRL 120 tokens" in text

    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    for argv, message in ((["--pairs", "1"], "--pairs must lie in [2, 1000]"),
                          (["--results", str(notes)], "is not a Markdown file"),
                          (["rl.steps=3"], "rl.steps= is set by the driver"),
                          (["rl.loss.kl_coef=0.01"], "without KL")):
        assert vs_trl.main(["--out", str(tmp_path / "out"), *argv]) == 2
        assert message in capsys.readouterr().err
