"""benchmarks/learning.py's bookkeeping (the runs themselves take an hour and are a benchmark, not a test): the
Table 3 figures read from an evaluation summary, means and standard errors over seeds, the per-seed direction of each
ablation against SpatialCORE, and the table replaced in place between its markers in RESULTS.md."""

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks"))

import learning  # noqa: E402


def _summary(acc, iou=0.5, h=0.1, rho=-0.2):
    return {"accuracy": {"mean": acc}, "mean_matched_iou": {"mean": iou}, "mean_H": {"mean": h},
            "boxes": {"rho_H_iou": rho}}


def _seeds(full, ablated):
    """Per-seed rows: SpatialCORE's accuracy `full[s]`, every ablation's `ablated[s]`."""
    rows = []
    for f, a in zip(full, ablated):
        row = {"SFT start": learning.figures(_summary(0.3))}
        for i, name in enumerate(learning.VARIANTS):
            row[name] = learning.figures(_summary(f if i == 0 else a, rho=None if i == 4 else -0.2))
        rows.append(row)
    return rows


def test_over_seeds_is_mean_and_standard_error():
    assert learning.over_seeds([0.4, 0.5, 0.6]) == f"0.500 ± {0.1 / math.sqrt(3):.3f}"
    assert learning.over_seeds([0.4]) == "0.400"
    assert learning.over_seeds([None, None]) == "n/a"  # nothing measured (e.g. no boxes): said, not a NaN


def test_direction_says_whether_each_ablation_loses_accuracy():
    per_seed = _seeds([0.50, 0.52, 0.51], [0.40, 0.41, 0.42])
    name = "gamma = 1 (no answer gate)"
    assert learning.direction(per_seed, name).endswith("holds (> 2 s.e.)")
    assert learning.direction(per_seed, next(iter(learning.VARIANTS))) == ""
    noisy = _seeds([0.50, 0.40, 0.45], [0.45, 0.44, 0.43])
    assert learning.direction(noisy, name).endswith(": holds")  # ahead on average, not by 2 standard errors
    worse = _seeds([0.40, 0.41, 0.42], [0.50, 0.52, 0.51])
    assert learning.direction(worse, name).endswith("does not hold")


def test_table_has_every_row_and_replaces_its_section(tmp_path):
    text = learning.table(_seeds([0.5, 0.52], [0.4, 0.42]), [0, 1], "Config X.")
    lines = text.splitlines()
    assert lines[0].startswith("Seeds 0, 1: mean ± standard error over seeds. Config X.")
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| SFT start", *(f"| {n}" for n in learning.VARIANTS)]
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nbefore\n", encoding="utf-8")
    learning.write_results(results, "first")
    learning.write_results(results, "second")
    body = results.read_text(encoding="utf-8")
    assert body.count(learning.BEGIN) == 1 and "second" in body and "first" not in body and "before" in body


def test_a_missing_results_file_fails_before_any_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        learning.main(["--results", str(tmp_path / "nope.md"), "rl.steps=0"])
    assert exit_.value.code == 2 and "no such file" in capsys.readouterr().err
