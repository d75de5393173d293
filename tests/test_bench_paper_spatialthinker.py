"""benchmarks/papers/papers.py's bookkeeping for --paper spatialthinker (the runs themselves are a benchmark, not a
test): the job and its arms, the figures re-scored from an evaluation's rows by the reward's own functions, the paired
tables and claims over seeds, and the argument errors, each one line before any run starts."""

import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from spatial_jax import config as C
from spatial_jax.data import prompts
from spatial_jax.data.pipeline import open_source, prompt_text
from spatial_jax.data.tokenizer import SpatialTokenizer
from spatial_jax.rewards import parse_scene, spatialthinker
from spatial_jax.rl.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "papers"))

import paper_spatialthinker as st  # noqa: E402
import papers  # noqa: E402

JOB = ROOT / "configs" / "spatialthinker_cpu.toml"


def test_job_is_the_main_world_with_its_annotator_in_scene_graph_format_and_the_arms_differ_only_in_the_reward():
    cfg, main = C.load(TrainConfig, JOB), C.load(TrainConfig, ROOT / "configs" / "tiny_cpu.toml")
    world = cfg.data.synthetic
    assert (cfg.method, cfg.policy.checkpoint, world.width, world.grid) == ("spatialthinker", "checkpoints/tiny_base",
                                                                            64, 2)
    # the main world, its biased annotator included, with objects the question does not name
    assert dataclasses.replace(world, distractors=0) == main.data.synthetic and world.distractors == 2
    assert (cfg.rl.group_size, cfg.rl.prompts_per_step, cfg.sft.batch_size) == (
        main.rl.group_size, main.rl.prompts_per_step, main.sft.batch_size)
    assert cfg.rewards.spatialthinker == spatialthinker.SpatialThinkerConfig()
    st.check(cfg)
    for name, (_, extra, _) in st.ARMS.items():
        arm = C.load(TrainConfig, JOB, extra)
        assert arm.rewards.spatialthinker == st.REWARDS[name]
        # the command's overrides come first: an arm's reward is its own whatever they set of the arm's fields
        swapped = C.load(TrainConfig, JOB, [*st.ARMS[st.SPARSE][1], *extra]).rewards.spatialthinker
        assert swapped == st.REWARDS[name]
        assert dataclasses.replace(arm, rewards=cfg.rewards) == cfg
        st.check(arm)
    sparse, ungated = st.REWARDS[st.SPARSE], st.REWARDS[st.UNGATED]
    assert (sparse.w_format, sparse.w_count, sparse.w_accuracy, sparse.w_spatial) == (0.1, 0.0, 0.5, 0.0)
    assert (ungated.w_format, ungated.w_count, ungated.w_accuracy, ungated.w_spatial) == (0.1, 0.0, 0.5, 0.2)
    assert not ungated.spatial_requires_correct and sparse.spatial_requires_correct


def test_references_fit_the_buckets_and_leave_room_for_more_boxes():
    """The config's lengths, from the tokenizer: prompts fit the first bucket, SFT sequences the last, and a
    reference completion leaves max_new_tokens room for 3 more boxes."""
    cfg = C.load(TrainConfig, JOB)
    tok = SpatialTokenizer.load(ROOT / cfg.policy.checkpoint)
    grid = cfg.data.synthetic.grid
    for split in ("train", "heldout"):
        for s in list(open_source(f"synthetic:{split}:40", cfg.data.synthetic, check_images=False)):
            prompt = len(tok.encode(prompt_text(s, prompts.SCENE_GRAPH, tok, grid * grid)))
            completion = len(tok.encode(s.reference["spatialthinker"])) + 1  # and <|im_end|>
            extra = len(tok.encode(' {"id": "green_square.3", "bbox": [34, 34, 62, 62]},'))
            assert prompt <= cfg.data.bucket_lengths[0] and prompt + completion <= cfg.data.bucket_lengths[-1]
            assert completion + 3 * extra <= min(cfg.eval.max_new_tokens, cfg.rl.sampling.max_new_tokens)


def _with_boxes(completion: str, boxes: list[dict]) -> str:
    """The completion with `boxes` added to its scene graph's objects."""
    head, rest = completion.split("<scene>\n")
    scene, tail = rest.split("\n</scene>")
    graph = json.loads(scene)
    graph["objects"] += boxes
    return f"{head}<scene>\n{json.dumps(graph)}\n</scene>{tail}"


def test_figures_are_the_reward_functions_on_each_completion_and_count_its_boxes(tmp_path):
    # without the annotator's mirroring, so that every reference is the true scene graph
    cfg = C.load(TrainConfig, JOB, ["data.eval=synthetic:heldout:12", "data.synthetic.mirror_rate=0.0"])
    samples = list(open_source(cfg.data.eval, cfg.data.synthetic))
    extra = [{"id": "red_square.7", "bbox": [0, 0, 20, 20]}, {"id": "red_square.8", "bbox": [40, 40, 60, 60]}]
    wrong = "(A) above"
    rows = []
    for k, s in enumerate(samples):
        ref = s.reference["spatialthinker"]
        completion = [ref, _with_boxes(ref, extra), "<observe>no scene</observe>",
                      ref.replace(f"<answer>{s.answer_text}</answer>", f"<answer>{wrong}</answer>")][k % 4]
        rows.append({"id": s.id, "completion": completion, "correct": 0.0})
    (tmp_path / "eval_rl.json").write_text(json.dumps({"rows": rows}))
    f = st.figures(cfg, tmp_path, "rl", {"accuracy": {"mean": 0.4}})
    # the reward's own terms: S ungated (the wrong answers' boxes count too), C with the specified 0.7 / 0.3
    spatial, count, boxes = [], [], []
    for s, r in zip(samples, rows):
        p = parse_scene.parse(r["completion"])
        boxes.append(len(p.objects))
        if not p.format_ok:
            continue
        ref = spatialthinker.reference(s.to_rollout(r["completion"]))
        size = (float(s.image_size[0]), float(s.image_size[1]))
        spatial.append(spatialthinker.spatial_score(
            spatialthinker.normalise_boxes(np.array([o.bbox for o in p.objects]), size), [o.label for o in p.objects],
            spatialthinker.normalise_boxes(ref.boxes, size), ref.labels, spatialthinker.SpatialThinkerConfig()))
        count.append(spatialthinker.count_score(len(p.objects), len(ref.labels), len(p.relationships),
                                                ref.n_relations, spatialthinker.SpatialThinkerConfig()))
    assert f[st.SPATIAL] == pytest.approx(np.mean(spatial)) and f[st.COUNT] == pytest.approx(np.mean(count))
    # the references' exact boxes score 1 (up to CIoU's eps); 2 extra boxes on 2 references cost all of C's object
    # term
    assert np.allclose(spatial, 1.0, atol=1e-6) and sorted(set(np.round(count, 9))) == [0.3, 1.0]
    assert f[st.BOXES] == np.mean(boxes) == (3 * 2 + 3 * 4 + 3 * 0 + 3 * 2) / 12
    assert f[st.FORMED] == 0.75 and f[st.REF] == 2.0 and f["accuracy"] == 0.4 and len(f["correct"]) == 12
    # a missing evaluation file measures nothing
    empty = st.figures(cfg, tmp_path, "sft", {"accuracy": {"mean": None}})
    assert all(empty[c] is None for c in st.COLUMNS) and empty["correct"] == {}


def _figures(acc, spatial, count, boxes, formed, correct):
    return {"accuracy": acc, st.SPATIAL: spatial, st.COUNT: count, st.BOXES: boxes, st.FORMED: formed,
            st.REF: 2.0, "correct": correct}


def _seeds():
    """Dense beats sparse in every seed (+0.25 +- 0.01) and sparse falls below the start; dense localises better
    than sparse by less than 2 standard errors; the ungated arm writes 3 boxes more and collapses."""
    per_seed = []
    for k in range(3):
        e = 0.01 * (k - 1)
        per_seed.append({
            "SFT start": _figures(0.5, 0.6, 0.9, 2.0, 0.9, {"a": 0.0, "b": 1.0}),
            st.DENSE: _figures(0.7 + e, 0.8, 0.95, 2.0, 1.0, {"a": 1.0, "b": 1.0}),
            st.SPARSE: _figures(0.45, (0.81, 0.8, 0.76)[k], 0.9, 2.0, 1.0, {"a": 1.0, "b": 0.0}),
            st.UNGATED: _figures(0.3, 0.9, None, 5.0 + e, 0.0, {"a": 0.0, "b": 0.0}),
        })
    return per_seed


def test_tables_pair_each_arm_with_its_start_and_give_the_claims_verdicts():
    lines = st.tables(_seeds(), [0, 1, 2], "Config X.").splitlines()
    assert lines[0].startswith("Seeds 0, 1, 2: mean ± standard error over seeds") and "Config X." in lines[0]
    assert lines[0].endswith("a reference scene graph has 2.000 ± 0.000 boxes.")
    assert lines[2] == ("| figure | start | dense | sparse | ungated | dense - start | sparse - start | "
                        "ungated - start | dense - sparse | ungated - dense |")
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ")}
    assert set(st.COLUMNS) <= set(rows)
    se = 0.01 / math.sqrt(3)
    assert rows["accuracy"] == (f"| accuracy | 0.500 ± 0.000 | 0.700 ± {se:.3f} | 0.450 ± 0.000 | 0.300 ± 0.000 | "
                                f"0.200 ± {se:.3f} | -0.050 ± 0.000 | -0.200 ± 0.000 | 0.250 ± {se:.3f} | "
                                f"-0.400 ± {se:.3f} |")
    assert rows[st.COUNT].endswith("| n/a | 0.050 ± 0.000 | 0.000 ± 0.000 | n/a | 0.050 ± 0.000 | n/a |")
    verdicts = {claim: rows[claim].rsplit(" | ", 1)[1][:-2] for claim, *_ in st.CLAIMS}
    assert verdicts == {
        st.CLAIMS[0][0]: "holds", st.CLAIMS[1][0]: "does not hold",
        st.CLAIMS[2][0]: "holds", st.CLAIMS[3][0]: "direction only", st.CLAIMS[4][0]: "holds",
        st.CLAIMS[5][0]: "holds", st.CLAIMS[6][0]: "holds", st.CLAIMS[7][0]: "n/a"}
    assert lines[-1] == ("| 2 | 0.500 / 2.000 / 0.900 | 0.710 / 2.000 / 1.000, +1 / -0 | "
                         "0.450 / 2.000 / 1.000, +1 / -1 | 0.300 / 5.010 / 0.000, +0 / -1 |")


def test_registry_holds_every_paper_each_with_its_plug_in_interface():
    assert papers.PAPERS["spatialthinker"] is st
    assert papers.parse(["--paper", "spatialthinker"]).config == st.CONFIG == "configs/spatialthinker_cpu.toml"
    assert papers.parse(["--paper", "spatialthinker"]).out == "benchmarks/out/papers/spatialthinker"
    for module in papers.PAPERS.values():
        assert all(hasattr(module, a)
                   for a in ("CONFIG", "STARTS", "ARMS", "check", "figures", "tables", "BEGIN", "END"))
    assert len({m.BEGIN for m in papers.PAPERS.values()}) == len(papers.PAPERS)
