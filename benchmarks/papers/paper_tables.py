"""The tables every paper of benchmarks/papers/papers.py prints beside its own: the claims with their verdicts, and the
figures seed by seed."""

from __future__ import annotations

import learning
import numpy as np
import uncertain

START = "SFT start"
# a paper whose arms share one SFT start: its name -> (run directory, overrides)
ONE_START = {START: ("sft_start", [])}


def mean_of(x: list[float]) -> float | None:
    """The mean, or None where nothing was measured (said as n/a in the tables, not a NaN)."""
    return float(np.mean(x)) if x else None


def figures_table(per_seed: list[dict], columns: tuple[str, ...], runs: tuple[str, ...],
                  pairs: list[tuple[str, str]] | tuple[tuple[str, str], ...], short: dict[str, str]) -> list[str]:
    """Header and one row per figure: its mean ± standard error over seeds at each run, then each pair's paired
    difference (a - b, seed by seed); short names the runs in the header."""
    lines = ["| figure | " + " | ".join(short[r] for r in runs) + " | " +
             " | ".join(f"{short[a]} - {short[b]}" for a, b in pairs) + " |",
             "|---|" + "---|" * (len(runs) + len(pairs))]
    for column in columns:
        cells = [learning.over_seeds([s[run][column] for s in per_seed]) for run in runs]
        cells += [learning.over_seeds(uncertain.paired(per_seed, a, b, column)) for a, b in pairs]
        lines.append(f"| {column} | " + " | ".join(cells) + " |")
    return lines


def claims_table(per_seed: list[dict], claims: tuple[tuple[str, str, str, str], ...]) -> list[str]:
    """claims: (claim, column, run whose figure should be higher, run it is compared with)."""
    lines = ["Claims, each as a paired difference oriented so that the claim says it is positive (holds = beyond 2 "
             "standard errors above 0).", "", "| claim | measured | verdict |", "|---|---|---|"]
    for claim, column, higher, lower in claims:
        d = uncertain.paired(per_seed, higher, lower, column)
        lines.append(f"| {claim} | {learning.over_seeds(d) if d else 'n/a'} | {learning.verdict(d)} |")
    return lines


def per_seed_table(per_seed: list[dict], seeds: list[int], arms: tuple[str, ...], columns: tuple[str, ...],
                   caption: str, start_of: dict[str, str] | None = None) -> list[str]:
    """Per seed and run: `columns` joined by " / ", and for each arm the held-out questions it turned right / wrong
    against its SFT start (start_of: arm -> start name; default START for every arm). caption names the columns."""
    start_of = start_of or dict.fromkeys(arms, START)
    starts = tuple(dict.fromkeys(start_of[a] for a in arms))
    lines = [f"Per seed: {caption}, and the held-out questions turned right / wrong against the SFT start (from the "
             "evaluation rows).", "", "| seed | " + " | ".join((*starts, *arms)) + " |",
             "|---|" + "---|" * (len(starts) + len(arms))]
    for seed, s in zip(seeds, per_seed):
        cells = []
        for run in (*starts, *arms):
            cell = " / ".join("n/a" if s[run][c] is None else f"{s[run][c]:.3f}" for c in columns)
            if run in start_of:
                cell += f", {learning.turned(s[start_of[run]]['correct'], s[run]['correct'])}"
            cells.append(cell)
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return lines
