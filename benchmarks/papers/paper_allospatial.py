"""AlloSpatial's Table 4 in miniature, for benchmarks/papers/papers.py --paper allospatial: RL over whole harness
trajectories that call the tools beats RL over question-answer pairs alone (VSI-Bench 53.5 against 46.2, MindCube
69.1 against 53.0), each after its own SFT stage on the same data; and, beside the paper, GSPO (its loss) against
GRPO with the harness.

The job (configs/allospatial_cpu.toml) is the README main world with its biased annotator: the SFT targets of
questions about the green square answer as if the scene were mirrored 70% of the time, in every format alike, while
the tools answer the truth. Two SFT starts, the same steps on the same questions:
- harness: the harness trajectory (methods/harness_targets.py): Step1, a world2mind call, a view_image call, Step4
  quoting the map, Step5 the annotator's answer; rollouts and evaluation run the tools (rl.max_tool_turns = 2).
- QA-only: each sample's own reference (Step1 reading the annotator's scene from the image, Step5 its answer), no
  tools in its rollouts or evaluation (rl.max_tool_turns = 0).
Arms, all with the job's steps, rollouts and optimiser:
- harness RL, GSPO (as specified, SPEC 5): the harness-gated trajectory reward.
- harness RL, GRPO: the same with the token-level loss (SPEC 6), same clips and aggregation.
- QA-only RL: from the QA-only start, GSPO, reward = the answer alone (w_accuracy = 1, the other weights 0, no
  structure gate: an `<Answer>` is all it asks).
Figures per evaluation, from its rows: held-out accuracy (the answer, ungated, so every run is read alike); accuracy
on the questions the annotator mirrors (naming a mirror colour) and on the others; tool calls per question; the
share of calls that are valid (the parser's schema check); the share of rollouts with a valid map call that the tool
answered whose answer is the map's (the map is true here, so: right); and the share with structure >= 0.85 (HGTR's
gate).
"""

from __future__ import annotations

from pathlib import Path

import learning
import paper_tables
import tool_use
from paper_tables import mean_of

from spatial_jax import config as C
from spatial_jax.data.pipeline import open_source
from spatial_jax.data.sample import Sample
from spatial_jax.data.synthetic import SyntheticConfig
from spatial_jax.rewards import parse_harness as ph
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.report import correct_by_id

CONFIG = "configs/allospatial_cpu.toml"
HARNESS_START, QA_START = "SFT start (harness)", "SFT start (QA-only)"
GSPO, GRPO, QA = "harness RL, GSPO", "harness RL, GRPO", "QA-only RL"
NO_TOOLS = ["rl.max_tool_turns=0"]
STARTS = {HARNESS_START: ("sft_harness", []), QA_START: ("sft_qa", ["data.sft_targets=reference", *NO_TOOLS])}
# the answer alone: every other term's weight 0 and no structure gate
ANSWER_ONLY = ["rewards.allospatial.w_structure=0.0", "rewards.allospatial.w_accuracy=1.0",
               "rewards.allospatial.w_tool=0.0", "rewards.allospatial.w_length=0.0",
               "rewards.allospatial.accuracy_gate=0.0"]
# arm name -> (run directory name, overrides, start)
ARMS = {GSPO: ("harness_gspo", ["rl.loss.kind=gspo"], HARNESS_START),
        GRPO: ("harness_grpo", ["rl.loss.kind=grpo"], HARNESS_START),
        QA: ("qa_only", ["rl.loss.kind=gspo", "data.sft_targets=reference", *NO_TOOLS, *ANSWER_ONLY], QA_START)}
START_OF = {arm: start for arm, (_, _, start) in ARMS.items()}
MIRRORED, OTHERS, CALLS, VALID, USED, FORMED = (
    "accuracy, annotator's questions", "accuracy, other questions", "tool calls per question", "valid call share",
    "answer agrees with the map", "structure >= 0.85")
COLUMNS = ("accuracy", MIRRORED, OTHERS, CALLS, VALID, USED, FORMED)
BEGIN, END = "<!-- papers.py allospatial: begin -->", "<!-- papers.py allospatial: end -->"
SHORT = {HARNESS_START: "harness start", QA_START: "QA start", GSPO: "GSPO", GRPO: "GRPO", QA: "QA-only"}
PAIRS = ((GSPO, HARNESS_START), (GRPO, HARNESS_START), (QA, QA_START), (GSPO, QA), (GSPO, GRPO))
# (claim, column, run whose figure should be higher, run it is compared with)
CLAIMS = (
    ("Table 4: harness RL (GSPO) more accurate than QA-only RL (53.5 vs 46.2 VSI-Bench)", "accuracy", GSPO, QA),
    ("Table 4: harness RL raises accuracy over its SFT start", "accuracy", GSPO, HARNESS_START),
    ("Table 4: QA-only RL raises accuracy over its SFT start (43.1 -> 46.2, slightly)", "accuracy", QA, QA_START),
    ("mechanism: harness RL more accurate than QA-only RL where the annotator erred", MIRRORED, GSPO, QA),
    ("SPEC 5's loss: GSPO more accurate than GRPO with the harness", "accuracy", GSPO, GRPO),
)


def check(cfg: TrainConfig) -> None:
    """The job must be AlloSpatial's on a world with a biased annotator, for the tools to know what its targets do
    not."""
    if cfg.method != "allospatial":
        raise C.ConfigError(f"--paper allospatial needs method = \"allospatial\", got {cfg.method!r}")
    world = cfg.data.synthetic
    if not world.mirror_colors or world.mirror_rate <= 0:
        raise C.ConfigError("--paper allospatial needs a biased annotator (data.synthetic.mirror_colors and "
                            "mirror_rate > 0): without it the tools know nothing the SFT targets do not")


def annotator_mirrors(world: SyntheticConfig, sample: Sample) -> bool:
    """Whether the sample's question names an object of a mirror colour (one the annotator may have mirrored)."""
    meta = sample.meta or {}
    relevant = set(meta.get("relevant") or ())
    return any(o["color"] in world.mirror_colors for o in meta.get("objects") or () if o["label"] in relevant)


def tool_figures(rows: list[dict]) -> dict[str, float | None]:
    """Calls per rollout, the valid share of the calls, and among rollouts with a valid map call that the tool
    answered (a response that is no error), the share answered right."""
    calls = valid = 0
    mapped = []
    for row in rows:
        text = row["completion"]
        parsed = ph.parse(text).tool_calls
        calls += len(parsed)
        valid += sum(c.valid for c in parsed)
        responses = [text[s:e] for s, e in ph.response_spans(text)]
        if any(c.valid and c.kind == "map" for c in parsed) and tool_use.answered_without_error(responses):
            mapped.append(float(row["accuracy_ungated"]))
    return {CALLS: calls / len(rows) if rows else None, VALID: valid / calls if calls else None,
            USED: mean_of(mapped)}


def figures(cfg: TrainConfig, run_dir: Path, stage: str, summary: dict) -> dict:
    """One evaluation's figures (COLUMNS; None where nothing was measured) and its correctness by question id."""
    samples = {s.id: s for s in open_source(cfg.data.eval, cfg.data.synthetic, check_images=False)}
    rows = learning.eval_rows(run_dir, stage) or []
    mirrored = [annotator_mirrors(cfg.data.synthetic, samples[r["id"]]) for r in rows]
    return {"accuracy": summary["accuracy"]["mean"],
            MIRRORED: mean_of([float(r["accuracy_ungated"]) for r, m in zip(rows, mirrored) if m]),
            OTHERS: mean_of([float(r["accuracy_ungated"]) for r, m in zip(rows, mirrored) if not m]),
            **tool_figures(rows), FORMED: mean_of([float(r["structure"] >= 0.85) for r in rows]),
            "correct": correct_by_id(rows)}


def tables(per_seed: list[dict], seeds: list[int], note: str) -> str:
    return "\n".join([*main_table(per_seed, seeds, note), "", *paper_tables.claims_table(per_seed, CLAIMS), "",
                      *paper_tables.per_seed_table(per_seed, seeds, tuple(ARMS), ("accuracy", MIRRORED, CALLS),
                                                 "accuracy / on the annotator's questions / tool calls per question",
                                                 START_OF)])


def main_table(per_seed: list[dict], seeds: list[int], note: str) -> list[str]:
    """Each figure at both SFT starts and after each arm, and the paired changes, mean ± standard error over seeds."""
    return [f"Seeds {', '.join(map(str, seeds))}: mean ± standard error over seeds; each change is paired seed by "
            f"seed. {note} The starts draw nothing from the seed (greedy evaluation), so each is trained once.", "",
            *paper_tables.figures_table(per_seed, COLUMNS, (*STARTS, *ARMS), PAIRS, SHORT)]
