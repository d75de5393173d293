"""benchmarks/papers/learning.py's bookkeeping (the runs themselves take an hour and are a benchmark, not a test): the
Table 3 figures read from an evaluation summary, means and standard errors over seeds, the per-seed direction of each
ablation against SpatialCORE, the quartile and per-seed tables, and the table replaced in place between its markers in
RESULTS.md."""

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "papers"))

import learning  # noqa: E402


def _summary(acc, iou=0.5, h=0.1, rho=-0.2, quartiles=(0.8, 0.7, 0.6, 0.5)):
    return {"accuracy": {"mean": acc}, "mean_matched_iou": {"mean": iou}, "mean_H": {"mean": h},
            "boxes": {"rho_H_iou": rho, "iou_by_H_quartile": [{"mean": q} for q in quartiles]}}


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
    assert learning.direction(per_seed, name).endswith(": holds")
    assert learning.direction(per_seed, next(iter(learning.VARIANTS))) == ""
    noisy = _seeds([0.50, 0.40, 0.45], [0.45, 0.44, 0.43])
    assert learning.direction(noisy, name).endswith(": direction only")  # ahead on average, not by 2 s.e.
    worse = _seeds([0.40, 0.41, 0.42], [0.50, 0.52, 0.51])
    assert learning.direction(worse, name).endswith("does not hold")


def test_table_has_every_row_and_replaces_its_section(tmp_path):
    text = learning.table(_seeds([0.5, 0.52], [0.4, 0.42]), [0, 1], "Config X.")
    lines = text.splitlines()
    assert lines[0].startswith("Seeds 0, 1: mean ± standard error over seeds. Config X.")
    main_rows = lines[4 : lines.index("", 4)]
    assert [line.split(" | ")[0] for line in main_rows] == ["| SFT start", *(f"| {n}" for n in learning.VARIANTS)]
    assert "Matched IoU by box-uncertainty quartile" in text and "| 1 | " in lines[-1]  # quartiles, then per seed
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nbefore\n", encoding="utf-8")
    learning.write_results(results, "first")
    learning.write_results(results, "second")
    body = results.read_text(encoding="utf-8")
    assert body.count(learning.BEGIN) == 1 and "second" in body and "first" not in body and "before" in body


def test_quartiles_count_the_seeds_in_which_iou_falls():
    assert learning.falls([0.8, 0.7, 0.6, 0.5]) == (True, True)
    assert learning.falls([0.81, 0.86, 0.87, 0.71]) == (True, False)  # Q1 > Q4, not at every step
    assert learning.falls([0.5, 0.6, 0.6, 0.7]) == (False, False)
    assert learning.falls([None, None, None, None]) == (False, False)  # no boxes: not a fall
    shapes = [(0.8, 0.7, 0.6, 0.5), (0.81, 0.86, 0.87, 0.71), (0.5, 0.6, 0.6, 0.7)]
    per_seed = [{"SFT start": learning.figures(_summary(0.3, quartiles=q))} for q in shapes]
    lines = learning.quartile_table(per_seed)
    means = [learning.over_seeds([q[k] for q in shapes]) for k in range(4)]
    assert lines[-1] == "| SFT start | " + " | ".join(means) + " | 2 of 3 | 1 of 3 |"


def test_per_seed_table_counts_questions_turned_right_and_wrong():
    before = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0}
    after = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0, "e": 1.0}  # e: not scored before, not counted
    assert learning.turned(before, after) == "+2 / -1"
    rows = {"SFT start": learning.figures(_summary(0.5, iou=0.7), [{"id": k, "correct": v} for k, v in before.items()])}
    for name in learning.VARIANTS:
        rows[name] = learning.figures(_summary(0.75, iou=None), [{"id": k, "correct": v} for k, v in after.items()])
    lines = learning.per_seed_table([rows], [7])
    assert lines[2].split(" | ")[2:] == [*learning.VARIANTS][:-1] + [f"{[*learning.VARIANTS][-1]} |"]
    assert lines[-1] == "| 7 | 0.500 / 0.700 | " + " | ".join(["0.750 / n/a, +2 / -1"] * len(learning.VARIANTS)) + " |"


def test_figures_read_the_rows_train_wrote(tmp_path):
    (tmp_path / "eval_rl.json").write_text(
        '{"summary": {}, "rows": [{"id": "q1", "correct": 1.0}, {"id": "q2", "correct": 0.0}, {"id": "q3"}]}')
    got = learning.evaluated(tmp_path, "rl", _summary(0.5))
    assert got["correct"] == {"q1": 1.0, "q2": 0.0} and got["quartiles"] == [0.8, 0.7, 0.6, 0.5]
    assert learning.evaluated(tmp_path, "sft", _summary(0.5))["correct"] == {}  # not written: no rows, no crash


@pytest.mark.parametrize("argv, status, message", [
    (["rl.steps=-1"], 2, "learning.py: configuration error: rl.steps must lie in [0, 2147483647], got -1"),
    (["--seeds", "0", "-1"], 2, "learning.py: configuration error: --seeds must be distinct integers in [0, 2**31), "
                                "got [0, -1]"),
    (["--config", "nope.toml"], 2, "learning.py: configuration error: config file nope.toml does not exist"),
    (["--results", "/nonexistent/RESULTS.md"], 2,
     "learning.py: configuration error: --results /nonexistent/RESULTS.md: no such file"),
    (["--out", "/dev/null/x"], 1, "learning.py: [Errno 20] Not a directory: '/dev/null/x'"),
])
def test_argument_errors_are_one_line_before_any_run(argv, status, message, monkeypatch, capsys):
    monkeypatch.setattr(learning, "run_seed", lambda *a: pytest.fail("a run started"))
    assert learning.main(argv) == status
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
