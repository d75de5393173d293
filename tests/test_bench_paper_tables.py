"""benchmarks/papers/paper_tables.py, the tables every paper of papers.py prints, line for line on two hand-made seeds
(means, standard errors and turned questions worked by hand), and the verdict rule of benchmarks/papers/learning.py at
each of its edges: a claim reads "holds" only beyond 2 standard errors above 0."""

import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "papers"))

import learning  # noqa: E402
import paper_tables  # noqa: E402

S = paper_tables.START
SEEDS = [
    {S: {"accuracy": 0.5, "iou": None, "correct": {"q1": 0, "q2": 1, "q3": 0}},
     "A": {"accuracy": 0.75, "iou": 0.25, "correct": {"q1": 1, "q2": 1, "q3": 0}},
     "B": {"accuracy": 0.5, "iou": 0.5, "correct": {"q1": 1, "q2": 0, "q3": 0}}},
    {S: {"accuracy": 0.25, "iou": None, "correct": {"q1": 0, "q2": 0, "q3": 0}},
     "A": {"accuracy": 0.5, "iou": 0.375, "correct": {"q1": 1, "q2": 0, "q3": 1}},
     "B": {"accuracy": 0.5, "iou": 0.25, "correct": {"q1": 0, "q2": 0, "q3": 0}}},
]


def test_figures_table():
    lines = paper_tables.figures_table(SEEDS, ("accuracy", "iou"), (S, "A", "B"), [("A", S), ("B", "A")],
                                       {S: "start", "A": "a", "B": "b"})
    assert lines == [
        "| figure | start | a | b | a - start | b - a |",
        "|---|---|---|---|---|---|",
        "| accuracy | 0.375 ± 0.125 | 0.625 ± 0.125 | 0.500 ± 0.000 | 0.250 ± 0.000 | -0.125 ± 0.125 |",
        "| iou | n/a | 0.312 ± 0.062 | 0.375 ± 0.125 | n/a | 0.062 ± 0.187 |",
    ]


def test_claims_table():
    claims = (("A beats start", "accuracy", "A", S), ("B beats A on IoU", "iou", "B", "A"),
              ("A beats start on IoU", "iou", "A", S))
    assert paper_tables.claims_table(SEEDS, claims) == [
        "Claims, each as a paired difference oriented so that the claim says it is positive (holds = beyond 2 "
        "standard errors above 0).",
        "",
        "| claim | measured | verdict |",
        "|---|---|---|",
        "| A beats start | 0.250 ± 0.000 | holds |",
        "| B beats A on IoU | 0.062 ± 0.187 | direction only |",
        "| A beats start on IoU | n/a | n/a |",
    ]


def test_per_seed_tables():
    caption = "and the held-out questions turned right / wrong against the SFT start (from the evaluation rows)."
    assert paper_tables.per_seed_table(SEEDS, [1, 2], ("A", "B"), ("accuracy", "iou"), "accuracy / IoU") == [
        f"Per seed: accuracy / IoU, {caption}",
        "",
        "| seed | SFT start | A | B |",
        "|---|---|---|---|",
        "| 1 | 0.500 / n/a | 0.750 / 0.250, +1 / -0 | 0.500 / 0.500, +1 / -1 |",
        "| 2 | 0.250 / n/a | 0.500 / 0.375, +2 / -0 | 0.500 / 0.250, +0 / -0 |",
    ]
    # an arm with a start of its own: the start's column comes first, the arm counts against it
    assert paper_tables.per_seed_table(SEEDS, [1, 2], ("B",), ("iou",), "IoU", start_of={"B": "A"}) == [
        f"Per seed: IoU, {caption}", "", "| seed | A | B |", "|---|---|---|",
        "| 1 | 0.250 | 0.500, +0 / -1 |", "| 2 | 0.375 | 0.250, +0 / -2 |",
    ]
    assert paper_tables.mean_of([]) is None and paper_tables.mean_of([1, 2]) == 1.5


def test_over_seeds_of_one_seed_is_its_value_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no standard error of one value is computed (numpy would warn: ddof)
        assert learning.over_seeds([0.5, None]) == "0.500" and learning.over_seeds([None]) == "n/a"
        assert learning.over_seeds([0.25, 0.5]) == "0.375 ± 0.125"


@pytest.mark.parametrize("d, verdict", [
    ([], "n/a"),
    ([0.5], "direction only"),  # one seed: no standard error, so never "holds"
    ([-0.5], "does not hold"),
    ([1e-9], "direction only"),  # the tie threshold is strict
    ([5e-10, 4e-10], "does not hold"),  # a tie
    ([0.0, 0.0], "does not hold"),
    ([0.5, 0.5], "holds"),  # two equal gains: standard error 0
    ([1.0, 3.0], "direction only"),  # mean 2 = 2 standard errors exactly: not beyond
    ([1.0, 2.0], "holds"),  # mean 1.5 > 2 x 0.5
    ([0.2, 0.3, 0.1], "holds"),
    ([-1.0, 3.0], "direction only"),
])
def test_verdict_edges(d, verdict):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a single seed's standard error is not computed (no ddof warning)
        assert learning.verdict(d) == verdict
