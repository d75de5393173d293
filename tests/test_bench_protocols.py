"""The papers' protocols: each one's weighting and averaging against hand-computed values (scored from the fixture
copies and the responses of tests/test_bench_scoring.py), and `spatial-jax eval --protocol spatialcore` on a tiny
checkpoint, whose responses are cached so a rerun generates nothing."""

from __future__ import annotations

import json

import pytest
from test_bench_loaders import write_copy
from test_bench_scoring import CASES

from spatial_jax.cli import main
from spatial_jax.config import ConfigError
from spatial_jax.suites.protocols import PROTOCOLS, get_protocol

# The fixtures' hand-scored per-category results (tests/test_bench_scoring.py) combined by each paper's rule:
# SpatialCORE weights categories by their official sizes: OmniSpatial Manipulation 74 x 1 + Motion_Analysis 346 x 0
# + Allocentric 376 x 0.5 over 74 + 346 + 376; SpatiaLab 3D Geometry 238 x 1 + Orientation 202 x 0.5 over 440.
# AlloSpatial: unweighted task-type means: VSI-Bench (1 + 0.8 + 0 + 1/3 + 0) / 5, MindCube settings
# (around 0 + rotation 1 + translation 1 + among 0.5) / 4, and their mean.
EXPECTED = {
    "spatialcore": {"omnispatial": 262 / 796, "spatialab": 339 / 440},
    "prosr": {"3dsrbench": 2 / 3, "mindcube-tiny": 0.5, "viewspatial": 2 / 3, "embspatial": 0.5, "sparbench": 0.82,
              "average": (2 / 3 + 0.5 + 2 / 3 + 0.5 + 0.82) / 5},
    "allospatial": {"vsibench-tiny": 2.1333333333 / 5, "mindcube-tiny": 0.625,
                    "average": (2.1333333333 / 5 + 0.625) / 2},
    "spatialthinker": {"cvbench": 0.875, "3dsrbench": 2 / 3, "average": (0.875 + 2 / 3) / 2},
}


def _copies(tmp_path, names):
    data, preds = tmp_path / "data", tmp_path / "preds"
    preds.mkdir()
    for name in names:
        write_copy(name, data / name)
        case = name.replace("-tiny", "") if name == "vsibench-tiny" else name
        (preds / f"{name}.json").write_text(json.dumps(CASES[case][0]))
    return data, preds


def test_every_protocol_has_expected_values():
    assert set(EXPECTED) == set(PROTOCOLS)
    allo = get_protocol("allospatial")
    assert (allo.temperature, allo.max_tool_turns, allo.max_new_tokens, allo.video_frames) == (1.0, 8, 8192, 7)
    assert get_protocol("spatialthinker").temperature == 0.0
    with pytest.raises(ConfigError, match="unknown protocol"):
        get_protocol("spatial")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_protocol_weighting_and_averaging(name, tmp_path, capsys):
    protocol = get_protocol(name)
    data, preds = _copies(tmp_path, protocol.benchmarks)
    out = tmp_path / f"{name}.json"
    assert main(["eval", "--protocol", name, "--data", str(data), "--predictions", str(preds),
                 f"--output={out}"]) == 0
    printed = capsys.readouterr().out
    assert f"### {name}" in printed and all(f"### {b}" in printed for b in protocol.benchmarks)
    summary = json.loads(out.read_text())["summary"]
    assert {k: v["mean"] for k, v in summary.items()} == pytest.approx(EXPECTED[name])
    assert all(v["sem"] is not None and v["sem"] >= 0 for v in summary.values())


def test_category_size_weighting_equals_sample_weighting_on_a_full_copy():
    """On a copy with every category at its official size, SpatialCORE's weighting is the plain accuracy."""
    from spatial_jax.eval.grounding import SPATIALAB_SIZES
    from spatial_jax.suites.protocols import benchmark_score
    from spatial_jax.suites.table import Cell, Table

    acc = {k: (i + 1) / 10 for i, k in enumerate(SPATIALAB_SIZES)}
    cats = {k: Cell(acc[k], 0.01, n) for k, n in SPATIALAB_SIZES.items()}
    plain = sum(acc[k] * n for k, n in SPATIALAB_SIZES.items()) / 1400
    table = Table("spatialab", "letter", cats, Cell(plain, 0.0, 1400), "")
    assert benchmark_score(get_protocol("spatialcore"), table).mean == pytest.approx(plain)


def test_protocol_argument_errors(tmp_path, capsys):
    assert main(["eval", "--protocol", "spatialcore", "--benchmark", "omnispatial", "--data", str(tmp_path)]) == 2
    assert "either --benchmark or --protocol" in capsys.readouterr().err
    assert main(["eval", "--protocol", "spatialcore"]) == 2
    assert "need --data" in capsys.readouterr().err
    assert main(["eval", "--protocol", "prosr", "--data", str(tmp_path), "--predictions", str(tmp_path)]) == 2
    assert "no 3dsrbench.json" in capsys.readouterr().err


TINY = ["sft.steps=0", "rl.steps=1", "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=12",
        "eval.after_rl=false", "data.train=synthetic:train:16", "data.eval=synthetic:heldout:4", "tensorboard=false",
        "progress=false", "data.bucket_lengths=[256,512]"]


def _tiny_checkpoint(run):
    """The tiny CPU job's random policy saved as its RL checkpoint at step 1, as the trainer saves one (a training
    step would only add compile time: evaluation reads the weights, whatever they learnt)."""
    from spatial_jax import config as C
    from spatial_jax.rl.checkpoint import Checkpointer
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.optim import make_optimizer
    from spatial_jax.rl.workspace import Workspace

    cfg = C.load(TrainConfig, None, [f"run_dir={run}", *TINY])
    ws = Workspace(cfg)
    opt_state = make_optimizer(ws.optim_config("rl")).init(ws.trainable)
    with Checkpointer(run / "rl", async_save=False) as ck:
        ck.save(1, ws.state(opt_state), {"step": 1, "data": {}, "config": C.to_dict(cfg)}, force=True)


@pytest.mark.slow
def test_spatialcore_protocol_on_a_tiny_checkpoint_prints_the_table_and_resumes(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    _tiny_checkpoint(run)
    data = tmp_path / "data"
    for name in ("omnispatial", "spatialab"):
        write_copy(name, data / name)
    args = ["eval", "--protocol", "spatialcore", "--data", str(data), "--no-progress", f"run_dir={run}", *TINY,
            "eval.max_new_tokens=6", "eval.batch_size=4"]
    capsys.readouterr()
    assert main(args) == 0
    printed = capsys.readouterr().out
    # a policy's final answers: OmniSpatial's direct extraction, SpatiaLab's numbered options (App. D.1)
    assert "### omnispatial (direct)" in printed and "### spatialab (number)" in printed
    assert "unparsed (no final answer, scored wrong)" in printed
    assert "accuracy weighted by the official category sizes" in printed
    report = json.loads((run / "eval_spatialcore.json").read_text())
    assert report["checkpoint"] == "rl" and report["decoding"]["temperature"] == 0.0
    assert report["benchmarks"]["omnispatial"]["table"]["overall"]["n"] == 4
    assert all("final_answer" in row for row in report["benchmarks"]["spatialab"]["rows"])
    assert (run / "eval_spatialcore.md").read_text().startswith("### omnispatial")
    cached = sorted((run / "eval_cache").glob("rl-1-*/*.jsonl"))
    assert [p.name for p in cached] == ["omnispatial.jsonl", "spatialab.jsonl"]

    # an interrupted run: one response lost from the cache is generated again, the rest read back
    lines = cached[0].read_text().splitlines()
    cached[0].write_text("\n".join(lines[:-1]) + "\n")
    import spatial_jax.suites.runner as runner

    calls = []
    real = runner.collect
    monkeypatch.setattr(runner, "collect", lambda *a, **k: calls.append(len(a[1].records)) or real(*a, **k))
    assert main(args) == 0
    assert calls == [1]
    again = json.loads((run / "eval_spatialcore.json").read_text())
    assert again["summary"] == report["summary"]


def test_an_allospatial_policy_decodes_as_its_paper_and_is_read_from_its_answer_tags(tmp_path, monkeypatch):
    """`--benchmark vsibench-tiny` on an AlloSpatial policy: temperature 1.0, up to 8 tool turns of 8,192 new tokens,
    7 frames (its paper's evaluation configuration), each answer read from the last <Answer> tag; a SpatialCORE policy
    on the same copy decodes greedily with the run's settings (its paper does not report VSI-Bench)."""
    import spatial_jax.suites.runner as runner

    data = write_copy("vsibench-tiny", tmp_path / "vsi")
    seen = {}

    def generate(records, cache, *, decoding, **_):
        seen["decoding"] = decoding
        # the gold in the answer tag, a wrong letter in the reasoning before it
        return {r.id: f"Step1: Visual Clues\nZ 0 <Answer>{r.answer if isinstance(r.answer, str) else f'{r.answer:g}'}"
                      "</Answer>" for r in records}, []

    monkeypatch.setattr(runner, "generate", generate)
    out = tmp_path / "allo.json"
    assert main(["eval", "--benchmark", "vsibench-tiny", "--data", str(data), "--initial", "--no-progress",
                 f"--output={out}", "method=allospatial", f"run_dir={tmp_path / 'run'}"]) == 0
    d = seen["decoding"]
    assert (d.temperature, d.max_tool_turns, d.max_new_tokens, d.video_frames) == (1.0, 8, 8192, 7)
    report = json.loads(out.read_text())
    assert report["decoding"]["temperature"] == 1.0
    scored = report["benchmarks"]["vsibench-tiny"]
    assert [r["score"] for r in scored["rows"]] == [1.0] * 6 and scored["table"]["unparsed"] == 0
    assert main(["eval", "--benchmark", "vsibench-tiny", "--data", str(data), "--initial", "--no-progress",
                 f"--output={out}", f"run_dir={tmp_path / 'run'}", "eval.max_new_tokens=6"]) == 0
    d = seen["decoding"]
    assert (d.temperature, d.max_new_tokens, d.video_frames) == (0.0, 6, 0)
