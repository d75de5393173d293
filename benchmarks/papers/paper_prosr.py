"""ProSR's Tables 2 and 4 in miniature, for benchmarks/papers/papers.py --paper prosr: vanilla GRPO (answer + format)
grows reliance on the question's language prior, and ProSR's process penalties (the blank-image counterfactual and late
drift, SPEC 3) reverse it.

The world (configs/prosr_prior_cpu.toml) has a prior that text alone can exploit: in the training split a question
naming a prior colour has the prior's answer at data.synthetic.prior_rate; the held-out split is balanced. Figures per
evaluation: held-out accuracy; accuracy on the held-out questions the prior gets wrong (a prior-colour question whose
true answer is not the prior's); how often the policy gives the prior's answer to a prior-colour question (the truth's
share is that of the balanced split, about 1/4), and to those of them it gets wrong (a wrong answer that is the prior's,
the reliance itself: a rise of the former can be right answers); each also on the questions whose image is hard to
read (data.synthetic.hard_rate), where the prior can pay; and ProSR's diagnostics A_blank, SAR, NTS, LRR@0.1 from the
evaluation's sampled (image, blank) pairs.
"""

from __future__ import annotations

from pathlib import Path

import learning
import paper_tables
import uncertain
from paper_tables import mean_of

from spatial_jax import config as C
from spatial_jax.data.pipeline import open_source
from spatial_jax.data.sample import LETTERS
from spatial_jax.data.synthetic import names_prior, prior_is_wrong
from spatial_jax.rewards.parse_think import parse_think
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.report import correct_by_id

CONFIG = "configs/prosr_prior_cpu.toml"
VANILLA, PROSR = "vanilla GRPO (answer + format)", "ProSR (as specified)"
# arm name -> (run directory name, reward overrides): vanilla keeps R_acc + 0.2 R_fmt of eq. 11 and drops its
# process terms (lambda_cf = lambda_drift = 0); both arms roll out the same blank images, so the budget is the same
STARTS = paper_tables.ONE_START
ARMS = {VANILLA: ("vanilla", ["rewards.prosr.lambda_cf=0.0", "rewards.prosr.lambda_drift=0.0"], paper_tables.START),
        PROSR: ("prosr", [], paper_tables.START)}
WRONG, PRIOR = "accuracy where the prior is wrong", "prior's answer to prior-colour questions"
FALSE_PRIOR = "prior's answer where the prior is wrong"
# the same on the questions whose image is hard to read (data.synthetic.hard_rate), where the prior can pay
HARD_ACC, HARD_PRIOR = "accuracy, hard images", "prior's answer to prior-colour questions, hard images"
HARD_FALSE_PRIOR = "prior's answer where the prior is wrong, hard images"
DIAGNOSTICS = ("A_blank", "SAR", "NTS", "LRR@0.1")  # ProSR's, from the evaluation's sampled (image, blank) pairs
COLUMNS = ("accuracy", HARD_ACC, WRONG, PRIOR, HARD_PRIOR, FALSE_PRIOR, HARD_FALSE_PRIOR, *DIAGNOSTICS)
TRUE = "prior's answer true"  # on the same questions: PRIOR for a policy that always answers right
HARD_TRUE = "prior's answer true, hard images"
BEGIN, END = "<!-- papers.py prosr: begin -->", "<!-- papers.py prosr: end -->"
# (claim, column, run whose figure should be higher, run it is compared with)
CLAIMS = (
    ("Table 2: vanilla GRPO raises A_blank over the SFT start", "A_blank", VANILLA, "SFT start"),
    ("Table 2: vanilla GRPO raises SAR", "SAR", VANILLA, "SFT start"),
    ("Table 2: vanilla GRPO raises NTS", "NTS", VANILLA, "SFT start"),
    ("Table 2: vanilla GRPO gives the prior's answer more often", PRIOR, VANILLA, "SFT start"),
    ("Table 2: ... where the image is hard to read", HARD_PRIOR, VANILLA, "SFT start"),
    ("Table 4: ProSR's A_blank below vanilla's", "A_blank", VANILLA, PROSR),
    ("Table 4: ProSR's SAR below vanilla's", "SAR", VANILLA, PROSR),
    ("Table 4: ProSR's NTS below vanilla's", "NTS", VANILLA, PROSR),
    ("Table 4: ProSR's LRR@0.1 below vanilla's", "LRR@0.1", VANILLA, PROSR),
    ("Table 4: ProSR more accurate than vanilla", "accuracy", PROSR, VANILLA),
    ("beyond: ProSR more accurate where the prior is wrong", WRONG, PROSR, VANILLA),
)


def check(cfg: TrainConfig) -> None:
    """The job must be ProSR's, on a world whose prior the tables can measure."""
    if cfg.method != "prosr":
        raise C.ConfigError(f"--paper prosr needs method = \"prosr\", got {cfg.method!r}")
    if not cfg.data.synthetic.prior_colors:
        raise C.ConfigError("--paper prosr needs a world with a language prior (data.synthetic.prior_colors)")


def held_out(cfg: TrainConfig) -> tuple[dict[str, tuple[bool, str, bool]], set[str]]:
    """One pass over the held-out split: {id: (the prior gets it wrong, the letter of the prior's answer, its image is
    hard to read)} for each question naming a prior colour, and the ids of every question whose image is hard."""
    world = cfg.data.synthetic
    prior, hard = {}, set()
    for s in open_source(cfg.data.eval, world, check_images=False):
        if s.meta.get("hard", False):
            hard.add(s.id)
        if names_prior(world, s):
            prior[s.id] = (prior_is_wrong(world, s), LETTERS[s.options.index(world.prior_answer)], s.id in hard)
    return prior, hard


def figures(cfg: TrainConfig, run_dir: Path, stage: str, summary: dict) -> dict:
    """One evaluation's figures (COLUMNS; None where nothing was measured) and its correctness by question id."""
    prior, hard = held_out(cfg)
    rows = learning.eval_rows(run_dir, stage) or []
    correct = correct_by_id(rows)
    answered = {r["id"]: parse_think(r["completion"]).answer for r in rows}
    process = summary.get("process") or {}

    def over_prior(gives: bool, only_hard: bool, only_wrong: bool = False) -> float | None:
        """Over the answered prior-colour questions (those with a hard image, those the prior gets wrong): the share
        answered with the prior's answer (`gives`), else the share whose truth is the prior's answer."""
        return mean_of([float(answered[i] == letter if gives else not wrong)
                        for i, (wrong, letter, h) in prior.items()
                        if i in answered and (h or not only_hard) and (wrong or not only_wrong)])

    return {"accuracy": summary["accuracy"]["mean"], HARD_ACC: mean_of([correct[i] for i in correct if i in hard]),
            WRONG: mean_of([correct[i] for i, (wrong, _, _) in prior.items() if wrong and i in correct]),
            PRIOR: over_prior(True, False), HARD_PRIOR: over_prior(True, True),
            FALSE_PRIOR: over_prior(True, False, True), HARD_FALSE_PRIOR: over_prior(True, True, True),
            **{k: process.get(k) for k in DIAGNOSTICS}, "correct": correct,
            TRUE: over_prior(False, False), HARD_TRUE: over_prior(False, True)}


def tables(per_seed: list[dict], seeds: list[int], note: str) -> str:
    return "\n".join([*main_table(per_seed, seeds, note), "", *paper_tables.claims_table(per_seed, CLAIMS), "",
                      *paper_tables.per_seed_table(per_seed, seeds, (VANILLA, PROSR), ("accuracy", WRONG, "A_blank"),
                                                 "accuracy / accuracy where the prior is wrong / A_blank")])


def main_table(per_seed: list[dict], seeds: list[int], note: str) -> list[str]:
    """Each figure at the SFT start and after each arm, and the paired changes, mean ± standard error over seeds
    (verdicts are the claims table's: whether a rise is good depends on the figure)."""
    true, hard = (learning.over_seeds([s["SFT start"][k] for s in per_seed]) for k in (TRUE, HARD_TRUE))
    lines = [f"Seeds {', '.join(map(str, seeds))}: mean ± standard error over seeds; each change is paired seed by "
             f"seed (both arms start from the seed's SFT start). {note} A policy that always answers right gives "
             f"the prior's answer to {true} of the prior-colour questions ({hard} of those with a hard image).", "",
             "| figure | SFT start | vanilla | vanilla - start | ProSR | ProSR - start | ProSR - vanilla |",
             "|---|---|---|---|---|---|---|"]
    for column in COLUMNS:
        cells = [learning.over_seeds([s[run][column] for s in per_seed]) for run in ("SFT start", VANILLA)]
        cells.append(learning.over_seeds(uncertain.paired(per_seed, VANILLA, "SFT start", column)))
        cells.append(learning.over_seeds([s[PROSR][column] for s in per_seed]))
        cells += [learning.over_seeds(uncertain.paired(per_seed, PROSR, b, column)) for b in ("SFT start", VANILLA)]
        lines.append(f"| {column} | " + " | ".join(cells) + " |")
    return lines
