"""benchmarks/papers/papers.py's bookkeeping for --paper allospatial (the runs themselves are a benchmark, not a test):
the job's world and lengths, the two pipelines and three arms differing only in what they say, the figures read from an
evaluation's rows, the paired tables against each arm's own start, and the argument errors."""

import dataclasses
import json
import math
import sys
from pathlib import Path

from spatial_jax import config as C
from spatial_jax.data import prompts
from spatial_jax.data.pipeline import open_source, prompt_text
from spatial_jax.data.tokenizer import SpatialTokenizer
from spatial_jax.data.tool_turns import ToolTurn, sft_target, tool_turn_ids
from spatial_jax.rl.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "papers"))

import paper_allospatial as allo  # noqa: E402
import papers  # noqa: E402

JOB = ROOT / "configs" / "allospatial_cpu.toml"


def test_job_is_the_main_world_with_its_annotator_and_the_arms_differ_only_in_what_they_name():
    cfg, main = C.load(TrainConfig, JOB), C.load(TrainConfig, ROOT / "configs" / "tiny_cpu.toml")
    assert cfg.method == "allospatial" and cfg.policy.checkpoint == main.policy.checkpoint
    assert cfg.data.synthetic == main.data.synthetic and cfg.data.synthetic.mirror_colors == ("green",)
    assert (cfg.rl.group_size, cfg.sft.batch_size) == (main.rl.group_size, main.sft.batch_size)
    assert cfg.rl.max_tool_turns > 0 and cfg.rl.loss.kind == "gspo" and cfg.data.sft_targets == "method"
    # two optimiser updates per batch (not two accumulated calls), so that the second is off-policy and the two
    # losses can differ
    assert cfg.rl.prompts_per_step * cfg.rl.group_size == 2 * cfg.rl.mini_batch and cfg.rl.micro_batch == 0
    allo.check(cfg)
    harness = C.load(TrainConfig, JOB, allo.STARTS[allo.HARNESS_START][1])
    qa = C.load(TrainConfig, JOB, allo.STARTS[allo.QA_START][1])
    assert harness == cfg
    assert qa == dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, sft_targets="reference"),
                                     rl=dataclasses.replace(cfg.rl, max_tool_turns=0))
    gspo, grpo, qa_rl = (C.load(TrainConfig, JOB, allo.ARMS[a][1]) for a in (allo.GSPO, allo.GRPO, allo.QA))
    assert gspo == cfg
    assert grpo == dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, loss=dataclasses.replace(
        cfg.rl.loss, kind="grpo")))
    answer_only = dataclasses.replace(cfg.rewards.allospatial, w_structure=0.0, w_accuracy=1.0, w_tool=0.0,
                                      w_length=0.0, accuracy_gate=0.0)
    assert qa_rl == dataclasses.replace(qa, rewards=dataclasses.replace(cfg.rewards, allospatial=answer_only))
    assert {start for *_, start in allo.ARMS.values()} == set(allo.STARTS)
    # neither start draws on the seed, so papers.py trains each once; ProSR's sampled diagnostics do
    assert papers.seed_free(harness) and papers.seed_free(qa)
    assert not papers.seed_free(C.load(TrainConfig, ROOT / "configs" / "prosr_prior_cpu.toml"))


def test_prompts_targets_and_tool_turns_fit_the_jobs_lengths():
    """From the tokenizer: prompts fit the first bucket, each start's SFT sequence the last, a harness target's model
    turns the per-round max_new_tokens, and its tool turns max_tool_tokens."""
    cfg = C.load(TrainConfig, JOB)
    tok = SpatialTokenizer.load(ROOT / cfg.policy.checkpoint)
    image_tokens = cfg.data.synthetic.grid ** 2
    for split in ("train", "heldout"):
        for s in list(open_source(f"synthetic:{split}:30", cfg.data.synthetic, check_images=False)):
            prompt = len(tok.encode(prompt_text(s, prompts.HARNESS, tok, image_tokens)))
            assert prompt <= cfg.data.bucket_lengths[0]
            qa = len(tok.encode(s.reference[prompts.HARNESS.reference_key])) + 1
            assert prompt + qa <= cfg.data.bucket_lengths[1] and qa <= cfg.rl.sampling.max_new_tokens
            parts = sft_target(s, prompts.HARNESS.reference_key)
            total = prompt + 1
            for part in parts:
                if isinstance(part, ToolTurn):
                    n = 9 if part.picture is not None else 0  # a 96 px picture: 9 merged patches
                    turn = len(tool_turn_ids(tok, part.output, None, image_tokens=n))
                    assert turn <= cfg.rl.max_tool_tokens
                    total += turn
                else:
                    model = len(tok.encode(part))
                    assert model + 1 <= min(cfg.rl.sampling.max_new_tokens, cfg.eval.max_new_tokens)
                    total += model
            assert total <= cfg.data.bucket_lengths[-1]


def _call(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


MAP = _call("world2mind", {"categories": ["red square"], "knowledge_type": "landmark", "output_format": "rectangle",
                           "scene_type": "indoor"})
VIEW = _call("view_image", {"visualization_type": "landmark_vis"})


def test_figures_split_accuracy_by_the_annotator_and_count_the_calls(tmp_path):
    cfg = C.load(TrainConfig, JOB, ["data.eval=synthetic:heldout:40"])
    samples = list(open_source(cfg.data.eval, cfg.data.synthetic, check_images=False))
    about = [allo.annotator_mirrors(cfg.data.synthetic, s) for s in samples]
    assert any(about) and not all(about)
    assert all(("green" in s.question) == a for s, a in zip(samples, about))  # "where is the green square ..."
    answered = "<tool_response>\nMap_Metadata: ...\n</tool_response>"
    refused = "<tool_response>\nError: unknown category\n</tool_response>"
    completions = [
        f"Step1: Visual Clues\nStep2.1: World Map\n{MAP}{answered}Step3.1: View Image\n{VIEW}{answered}"
        "Step4: Cross-Validation\nStep5: Final Answer\n<Answer>A</Answer>",  # 2 valid calls, map answered
        f"Step1: Visual Clues\nStep2.1: World Map\n{MAP}{refused}Step4: Cross-Validation\nStep5: Final Answer\n"
        "<Answer>A</Answer>",  # 1 valid call, the tool refused it
        "Step1: Visual Clues\nStep2.1: World Map\n<tool_call>{\"name\": \"world2mind\"}</tool_call>"
        f"{refused}Step5: Final Answer\n<Answer>B</Answer>",  # 1 call missing its arguments
        "Step1: Visual Clues\nStep5: Final Answer\n<Answer>C</Answer>",  # no call
    ]
    rows = []
    for k, s in enumerate(samples):
        right = float(k % 3 == 0)
        rows.append({"id": s.id, "completion": completions[k % 4], "correct": right, "accuracy_ungated": right,
                     "structure": (1.0, 0.9, 0.6, 1.0)[k % 4]})
    (tmp_path / "eval_rl.json").write_text(json.dumps({"rows": rows}))
    f = allo.figures(cfg, tmp_path, "rl", {"accuracy": {"mean": 0.25}})
    mean = lambda xs: sum(xs) / len(xs)
    assert f["accuracy"] == 0.25 and len(f["correct"]) == 40
    assert f[allo.MIRRORED] == mean([r["accuracy_ungated"] for r, a in zip(rows, about) if a])
    assert f[allo.OTHERS] == mean([r["accuracy_ungated"] for r, a in zip(rows, about) if not a])
    assert f[allo.CALLS] == (2 + 1 + 1 + 0) / 4 and f[allo.VALID] == 3 / 4
    assert f[allo.USED] == mean([r["accuracy_ungated"] for k, r in enumerate(rows) if k % 4 == 0])
    assert f[allo.FORMED] == 0.75
    # no call at all: the valid share and the map's use are not measured; no evaluation file, nothing
    (tmp_path / "eval_rl.json").write_text(json.dumps({"rows": [dict(r, completion=completions[3]) for r in rows]}))
    f = allo.figures(cfg, tmp_path, "rl", {"accuracy": {"mean": 0.25}})
    assert f[allo.CALLS] == 0.0 and f[allo.VALID] is None and f[allo.USED] is None
    empty = allo.figures(cfg, tmp_path, "sft", {"accuracy": {"mean": None}})
    assert all(empty[c] is None for c in allo.COLUMNS) and empty["correct"] == {}


def _figures(acc, mirrored, calls, correct):
    return {"accuracy": acc, allo.MIRRORED: mirrored, allo.OTHERS: acc, allo.CALLS: calls, allo.VALID: 1.0,
            allo.USED: None if calls == 0 else 0.9, allo.FORMED: 1.0, "correct": correct}


def _seeds():
    """Harness RL beats QA-only RL in every seed by 0.2 +- 0.01 and fixes the annotator's questions; GSPO and GRPO
    are level."""
    per_seed = []
    for k in range(3):
        e = 0.01 * (k - 1)
        per_seed.append({
            allo.HARNESS_START: _figures(0.6, 0.3, 2.0, {"a": 0.0, "b": 1.0}),
            allo.QA_START: _figures(0.6, 0.3, 0.0, {"a": 1.0, "b": 0.0}),
            allo.GSPO: _figures(0.8 + e, 0.9, 2.0, {"a": 1.0, "b": 1.0}),
            allo.GRPO: _figures((0.79, 0.81, 0.8)[k], 0.9, 2.0, {"a": 1.0, "b": 0.0}),
            allo.QA: _figures(0.6, 0.3, 0.0, {"a": 0.0, "b": 0.0}),
        })
    return per_seed


def test_tables_pair_each_arm_with_its_own_start_and_give_the_claims_verdicts():
    lines = allo.tables(_seeds(), [0, 1, 2], "Config X.").splitlines()
    assert lines[0].startswith("Seeds 0, 1, 2: mean ± standard error over seeds") and "Config X." in lines[0]
    assert lines[2] == ("| figure | harness start | QA start | GSPO | GRPO | QA-only | GSPO - harness start | "
                        "GRPO - harness start | QA-only - QA start | GSPO - QA-only | GSPO - GRPO |")
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ")}
    assert set(allo.COLUMNS) <= set(rows)
    se = 0.01 / math.sqrt(3)
    assert rows["accuracy"] == (f"| accuracy | 0.600 ± 0.000 | 0.600 ± 0.000 | 0.800 ± {se:.3f} | 0.800 ± {se:.3f} "
                                f"| 0.600 ± 0.000 | 0.200 ± {se:.3f} | 0.200 ± {se:.3f} | 0.000 ± 0.000 | "
                                f"0.200 ± {se:.3f} | 0.000 ± {se:.3f} |")
    assert rows[allo.USED].endswith("| n/a | n/a | 0.000 ± 0.000 |")
    verdicts = {claim: rows[claim].rsplit(" | ", 1)[1][:-2] for claim, *_ in allo.CLAIMS}
    assert list(verdicts.values()) == ["holds", "holds", "does not hold", "holds", "does not hold"]
    # each arm's questions turned right / wrong against its own start
    assert lines[-1] == ("| 2 | 0.600 / 0.300 / 2.000 | 0.600 / 0.300 / 0.000 | 0.810 / 0.900 / 2.000, +1 / -0 | "
                         "0.800 / 0.900 / 2.000, +1 / -1 | 0.600 / 0.300 / 0.000, +0 / -1 |")
