"""The benchmark machinery against plain evaluation on the same questions: `spatial-jax to-cvbench` writes the
synthetic world's held-out questions as a CV-Bench copy, and `spatial-jax eval --benchmark cvbench --layout method`
(loader, Sample, generation, final-answer span, Cambrian's extraction, scoring) must score every question as
`spatial-jax eval` does, the tiny policy's completions included."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from spatial_jax.cli import main
from spatial_jax.cli.job_config import load_job
from spatial_jax.data import prompts
from spatial_jax.data.pipeline import open_source
from spatial_jax.data.synthetic import SyntheticConfig, SyntheticSource
from spatial_jax.methods import METHODS
from spatial_jax.suites import BenchmarkError, load, to_sample
from spatial_jax.suites.to_cvbench import FILE, write

ROOT = Path(__file__).resolve().parents[1]
CONFIG, BASE = str(ROOT / "configs" / "tiny_cpu.toml"), str(ROOT / "checkpoints" / "tiny_base")
HELDOUT = "synthetic:heldout:32"


def _heldout(spec: str = HELDOUT):
    return list(open_source(spec, load_job(CONFIG, []).data.synthetic))


def test_a_converted_copy_loads_back_as_the_same_questions(tmp_path):
    samples = _heldout()
    assert main(["to-cvbench", "--config", CONFIG, "--data", HELDOUT, "--out", str(tmp_path / "cv")]) == 0
    records = load("cvbench", tmp_path / "cv")
    assert len(records) == len(samples)
    rows = [json.loads(line) for line in (tmp_path / "cv" / FILE).read_text().splitlines()]
    for sample, record, row in zip(samples, records, rows):
        assert row["sample_id"] == sample.id and record.id == str(row["idx"])
        assert (record.question, record.options, record.answer) == (sample.question, sample.options, sample.answer)
        assert (record.category, record.extra["task"]) == ("COCO", "Relation")
        again = to_sample(record)  # the method's own layout: no benchmark text in the prompt
        assert np.array_equal(again.load_images()[0], sample.image)  # PNG keeps the pixels
        # the pipeline reads a benchmark image's size from the image (SpatialThinker's prompt states it)
        again = dataclasses.replace(again, image_size=(sample.image.shape[1], sample.image.shape[0]))
        for name, method in METHODS.items():
            assert prompts.build_messages(again, method.prompt) == prompts.build_messages(sample, method.prompt), name


def test_a_question_without_a_cvbench_task_is_refused_naming_it(tmp_path):
    size = SyntheticSource(SyntheticConfig(question_types=("size",)), "heldout", 2)  # the main job's world has none
    with pytest.raises(BenchmarkError, match=r"heldout-000000.*category 'size' has no CV-Bench task"):
        write(size, tmp_path / "cv")
    sample = _heldout("synthetic:heldout:1")[0]
    numeric = dataclasses.replace(sample, options=(), answer=3.0, answer_type="number")
    many = dataclasses.replace(sample, options=tuple("abcdefg"), answer="G")
    for bad, message in ((numeric, "only single-image multiple-choice"), (many, "7 options, CV-Bench's answers")):
        with pytest.raises(BenchmarkError, match=f"sample 'heldout-000000': {message}"):
            write([bad], tmp_path / message[:4])
    ok = _heldout("synthetic:heldout:2")
    write(ok, tmp_path / "cv2")
    with pytest.raises(BenchmarkError, match="exists; write the copy to a new folder"):
        write(ok, tmp_path / "cv2")


def test_the_method_layout_goes_with_generation_only(tmp_path, capsys):
    write(_heldout("synthetic:heldout:2"), tmp_path / "cv")
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps({"0": "B", "1": "A"}))
    assert main(["eval", "--benchmark", "cvbench", "--data", str(tmp_path / "cv"), "--predictions", str(preds),
                 "--layout", "method"]) == 2
    assert "--layout chooses how the policy is prompted" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spatialcore", "prosr"])
def test_benchmark_eval_of_a_converted_copy_scores_each_question_as_plain_eval(method, tmp_path):
    """Greedy, on 32 held-out questions. SpatialCORE: the shipped tiny base, the main job's start, whose completions
    are in SpatialCORE's format (most right, some wrong). ProSR: the base after the job's SFT stage with ProSR's own
    targets (reasoning, then one letter after `</think>`), so its answers are parsed too."""
    copy, plain, bench = tmp_path / "cv", tmp_path / "plain.json", tmp_path / "bench.json"
    assert main(["to-cvbench", "--config", CONFIG, "--data", HELDOUT, "--out", str(copy)]) == 0
    overrides = [f"run_dir={tmp_path / 'run'}", f"method={method}", f"policy.checkpoint={BASE}",
                 "eval.diagnostics=greedy", f"data.eval={HELDOUT}"]
    initial = ["--initial"]
    if method == "prosr":
        assert main(["sft", "--config", CONFIG, *overrides]) == 0
        initial = []
    assert main(["eval", "--config", CONFIG, *initial, "--data", HELDOUT, f"--output={plain}", *overrides]) == 0
    assert main(["eval", "--config", CONFIG, *initial, "--benchmark", "cvbench", "--layout", "method", "--data",
                 str(copy), f"--output={bench}", "--no-progress", *overrides]) == 0
    sample_of = {str(row["idx"]): row["sample_id"] for row in map(json.loads, (copy / FILE).read_text().splitlines())}
    evaluated = json.loads(plain.read_text())
    expected = {row["id"]: row for row in evaluated["rows"]}
    report = json.loads(bench.read_text())["benchmarks"]["cvbench"]
    scored = {sample_of[row["id"]]: row for row in report["rows"]}
    assert sorted(scored) == sorted(expected) and len(scored) == 32
    for sid, row in scored.items():
        assert row["response"] == expected[sid]["completion"], sid  # the same prompt, the same greedy completion
        assert row["score"] == expected[sid]["correct"], (sid, row["final_answer"], row["prediction"])
    accuracy = evaluated["summary"]["accuracy"]["mean"]
    assert report["table"]["overall"]["mean"] == pytest.approx(accuracy, abs=1e-12)
    assert 0 < accuracy < 1 and report["table"]["unparsed"] == 0
