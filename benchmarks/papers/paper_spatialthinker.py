"""SpatialThinker's dense-vs-sparse result and its App. C.1 box over-generation in miniature, for
benchmarks/papers/papers.py --paper spatialthinker: dense rewards improve the start more than a sparse answer + format
reward (§1: +7.7 against +4.4), and without the count term and the correctness gate the spatial term pays for more
boxes, which the policy then writes (App. C.1: accuracy 74.9% -> 23.7% under the naive spatial reward).

The job (configs/spatialthinker_cpu.toml) is the README main world in SpatialThinker's scene-graph format (SPEC 1.2)
with its dense reward (SPEC 4). Arms, the same in all but rewards.spatialthinker:
- dense (as specified): R = 0.1 F + 0.2 C + 0.5 A + 0.2 S, S only when A = 1.
- sparse (answer + format): the paper's sparse baseline uses "only accuracy and format rewards" (App. B.5) without
  giving their weights; C and S are dropped (w_count = w_spatial = 0; the weights need not sum to 1) and F, A keep
  their dense weights, so the arm differs from the dense one by the removed terms alone. GRPO's advantages divide by
  the group's standard deviation, so renormalising the kept weights to 1/6, 5/6 would change nothing but eps's share.
- dense, no count term, ungated (App. C.1's naive spatial reward): w_count = 0 with its mass dropped, not moved to S
  (R = 0.1 F + 0.5 A + 0.2 S: the remaining terms keep their specified ratio, so the arm changes only what the claim
  names), and S for every well-formed answer (spatial_requires_correct = false).
Figures per evaluation, from its rows: held-out accuracy; the spatial score S and the count score C, re-scored by the
reward's own `score` with the specified weights but ungated, so that every arm and the start are measured by the
same yardstick on every well-formed completion (means over the well-formed ones); boxes per completion (the objects
of its scene graph that pass the parser's checks, over every completion, so that boxes in a completion cut at
max_new_tokens still count); and the share of completions that are well-formed (F = 1).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import learning
import paper_tables
from paper_tables import mean_of

from spatial_jax import config as C
from spatial_jax.data.pipeline import open_source
from spatial_jax.rewards import spatialthinker
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.report import correct_by_id

CONFIG = "configs/spatialthinker_cpu.toml"
DENSE, SPARSE, UNGATED = "dense (as specified)", "sparse (answer + format)", "dense, no count term, ungated"
SPECIFIED = spatialthinker.SpatialThinkerConfig()
REWARDS = {
    DENSE: SPECIFIED,
    SPARSE: dataclasses.replace(SPECIFIED, w_count=0.0, w_spatial=0.0),
    UNGATED: dataclasses.replace(SPECIFIED, w_count=0.0, spatial_requires_correct=False),
}


def _overrides(r: spatialthinker.SpatialThinkerConfig) -> list[str]:
    """Every field an arm varies, set explicitly: after the command's key=value overrides, so that each arm's reward
    is the one its name says (check refuses any other change of the reward)."""
    return [f"rewards.spatialthinker.w_count={r.w_count}", f"rewards.spatialthinker.w_spatial={r.w_spatial}",
            f"rewards.spatialthinker.spatial_requires_correct={str(r.spatial_requires_correct).lower()}"]


STARTS = paper_tables.ONE_START
# arm name -> (run directory name, reward overrides, start)
ARMS = {name: (directory, _overrides(REWARDS[name]), paper_tables.START)
        for name, directory in ((DENSE, "dense"), (SPARSE, "sparse"), (UNGATED, "no_count_ungated"))}
# the yardstick of the figures: the specified reward's terms, S on every well-formed completion
MEASURE = dataclasses.replace(SPECIFIED, spatial_requires_correct=False)
SPATIAL, COUNT, BOXES, FORMED = ("spatial score S", "count score C", "boxes per completion",
                                 "well-formed share")
COLUMNS = ("accuracy", SPATIAL, COUNT, BOXES, FORMED)
REF = "reference boxes per question"
BEGIN, END = "<!-- papers.py spatialthinker: begin -->", "<!-- papers.py spatialthinker: end -->"
SHORT = {"SFT start": "start", DENSE: "dense", SPARSE: "sparse", UNGATED: "ungated"}
# (claim, column, run whose figure should be higher, run it is compared with)
CLAIMS = (
    ("§1: dense RL raises held-out accuracy over the start (+7.7 in the paper)", "accuracy", DENSE, "SFT start"),
    ("§1: sparse RL raises held-out accuracy over the start (+4.4)", "accuracy", SPARSE, "SFT start"),
    ("§1: dense more accurate than sparse", "accuracy", DENSE, SPARSE),
    ("beyond: dense localises better than sparse (S)", SPATIAL, DENSE, SPARSE),
    ("App. C.1: without count term and gate, more boxes per completion than dense", BOXES, UNGATED, DENSE),
    ("App. C.1: without count term and gate, more boxes per completion than the start", BOXES, UNGATED,
     "SFT start"),
    ("App. C.1: without count term and gate, accuracy falls below dense's", "accuracy", DENSE, UNGATED),
    ("App. C.2: the count term keeps the count score above the ungated arm's", COUNT, DENSE, UNGATED),
)


def check(cfg: TrainConfig) -> None:
    """The job must be SpatialThinker's, its reward one of the arms' (so that "as specified" is true)."""
    if cfg.method != "spatialthinker":
        raise C.ConfigError(f"--paper spatialthinker needs method = \"spatialthinker\", got {cfg.method!r}")
    if cfg.rewards.spatialthinker not in REWARDS.values():
        raise C.ConfigError("--paper spatialthinker sets the reward per arm: rewards.spatialthinker must be left "
                            f"as specified (SPEC 4), got {cfg.rewards.spatialthinker}")


def figures(cfg: TrainConfig, run_dir: Path, stage: str, summary: dict) -> dict:
    """One evaluation's figures (COLUMNS; None where nothing was measured) and its correctness by question id."""
    samples = {s.id: s for s in open_source(cfg.data.eval, cfg.data.synthetic, check_images=False)}
    rows = learning.eval_rows(run_dir, stage) or []
    scores = [spatialthinker.score(samples[r["id"]].to_rollout(r["completion"]), MEASURE) for r in rows]
    formed = [s for s in scores if s["format"] == 1.0]
    return {"accuracy": summary["accuracy"]["mean"],
            SPATIAL: mean_of([s["spatial"] for s in formed]), COUNT: mean_of([s["count"] for s in formed]),
            BOXES: mean_of([s["pred_objects"] for s in scores]), FORMED: mean_of([s["format"] for s in scores]),
            REF: mean_of([s["ref_objects"] for s in scores]), "correct": correct_by_id(rows)}


def tables(per_seed: list[dict], seeds: list[int], note: str) -> str:
    return "\n".join([*main_table(per_seed, seeds, note), "", *paper_tables.claims_table(per_seed, CLAIMS), "",
                      *paper_tables.per_seed_table(per_seed, seeds, tuple(ARMS), ("accuracy", BOXES, FORMED),
                                                 "accuracy / boxes per completion / well-formed share")])


def main_table(per_seed: list[dict], seeds: list[int], note: str) -> list[str]:
    """Each figure at the SFT start and after each arm, and the paired changes, mean ± standard error over seeds
    (verdicts are the claims table's: whether a rise is good depends on the figure)."""
    ref = learning.over_seeds([s["SFT start"][REF] for s in per_seed])
    pairs = [(arm, "SFT start") for arm in ARMS] + [(DENSE, SPARSE), (UNGATED, DENSE)]
    return [f"Seeds {', '.join(map(str, seeds))}: mean ± standard error over seeds; each change is paired seed by "
            f"seed (every arm starts from the seed's SFT start). {note} S and C are the specified reward's terms, "
            f"S ungated, over the well-formed completions; a reference scene graph has {ref} boxes.", "",
            *paper_tables.figures_table(per_seed, COLUMNS, ("SFT start", *ARMS), pairs, SHORT)]
