"""Evaluation's analyses: per-box H/IoU quartiles and rho, ProSR's process diagnostics, the paired RL-SFT gain,
the summary lines and the curves figure with the quartile bars."""

import json

import numpy as np
import pytest

from spatial_jax.eval.evaluate import box_analyses, process_diagnostics
from spatial_jax.eval.prosr_diagnostics import diagnose
from spatial_jax.rewards.prosr import ProSRConfig
from spatial_jax.rl import report
from spatial_jax.testing import rollouts as synthetic


def _boxes(h, iou):
    return [{"H": a, "matched": b is not None, "iou": b} for a, b in zip(h, iou)]


def test_box_analyses_quartiles_and_rho_use_matched_boxes_with_h():
    h = np.linspace(0.0, 1.0, 40)
    iou = 1.0 - h  # confident boxes localise best: rho = -1, IoU falls quartile by quartile
    rows = [_boxes(h[:20], iou[:20]), _boxes(h[20:], iou[20:]),
            [{"H": None, "matched": True, "iou": 0.9}, {"H": 0.2, "matched": False, "iou": None}]]
    out = box_analyses(rows)
    assert (out["n_boxes"], out["n_with_H"], out["n_matched"]) == (42, 41, 41)
    q = out["iou_by_H_quartile"]
    assert [e["n"] for e in q] == [10, 10, 10, 10]
    assert [e["mean"] for e in q] == sorted((e["mean"] for e in q), reverse=True)
    assert q[0]["mean"] == pytest.approx(float(np.mean(iou[:10])))
    assert out["rho_H_iou"] == pytest.approx(-1.0)
    assert box_analyses([_boxes(h, iou[::-1])])["rho_H_iou"] == pytest.approx(1.0)
    empty = box_analyses([[], []])
    assert empty["rho_H_iou"] is None and all(e["n"] == 0 for e in empty["iou_by_H_quartile"])
    json.dumps(empty)  # no NaN reaches the JSON


def test_process_diagnostics_are_prosr_diagnose_without_the_id_table():
    ros = synthetic.rollouts(40, seed=3, with_blank=True)
    cfg = ProSRConfig(min_span_tokens=1)
    summary, groups = process_diagnostics(ros, cfg)
    full = diagnose(ros, cfg)
    assert {"rollouts": "greedy", **{k: v for k, v in full.items() if k != "group_of"}} == summary
    assert groups == full["group_of"]
    assert {"A_blank", "SAR", "NTS", "LRR@0.1"} <= set(summary) and summary["n"] == 40
    assert process_diagnostics(ros, object(), "sampled")[0] == {
        "rollouts": "sampled", **{k: v for k, v in diagnose(ros).items() if k != "group_of"}}


def _eval_file(path, correct):
    rows = [{"id": f"q{i}", "correct": c} for i, c in enumerate(correct)]
    path.write_text(json.dumps({"key": {}, "summary": {}, "rows": rows}))


def test_compare_stages_pairs_questions(tmp_path):
    both = {"after_sft": {"n": 5}, "after_rl": {"n": 5}}
    assert report.compare_stages(tmp_path, both) == {}
    _eval_file(tmp_path / "eval_sft.json", [0, 1, 0, 1, 0])
    _eval_file(tmp_path / "eval_rl.json", [1, 1, 1, 0, 0])
    assert report.compare_stages(tmp_path, {"after_rl": {"n": 5}}) == {}  # a stage this job did not evaluate
    g = report.compare_stages(tmp_path, both)["accuracy_gain_paired"]
    d = np.array([1, 0, 1, -1, 0], float)
    assert g["n"] == 5 and g["mean"] == pytest.approx(d.mean()) and g["sem"] == pytest.approx(d.std(ddof=1) / 5**0.5)


def test_summary_and_figure_show_the_analyses(tmp_path, capsys):
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward_mean": 0.1 * s, "accuracy": 0.5, "loss": 1.0}) + "\n"
                for s in range(1, 8)))
    est = {"mean": 0.5, "sem": 0.01, "n": 100}
    stage = {"accuracy": est, "mean_H": est, "boxes": box_analyses([_boxes(np.linspace(0, 1, 12),
                                                                            np.linspace(1, 0, 12))])}
    results = {"run_dir": str(tmp_path), "method": "m", "after_sft": stage, "after_rl": stage,
               "accuracy_gain_paired": {"mean": 0.04, "sem": 0.01, "n": 512}}
    png = report.plot(tmp_path, results)
    assert png == str(tmp_path / "curves.png") and (tmp_path / "curves.png").stat().st_size > 10_000
    report.print_summary(results)
    out = capsys.readouterr().out
    assert "matched IoU by H quartile" in out and "rho(H, IoU) -1.000" in out
    assert "accuracy after RL - after SFT (paired): 0.040 ± 0.010 (n=512)" in out
    assert report.plot(tmp_path / "nothing", {}) is None


def test_prosr_diagnostics_read_pairs_sampled_at_temperature_1_or_the_greedy_ones(monkeypatch):
    """ProSR eq. 2 samples r and its blank pair from the policy: evaluation draws them at temperature 1 in a pass of
    their own (seeds from the run's seed and the batch), and its accuracy stays the greedy rollouts'; "greedy" (the
    named option) reads the greedy pairs."""
    from types import SimpleNamespace

    import spatial_jax.eval.evaluate as ev
    from spatial_jax.methods import get_method
    from spatial_jax.records import BlankRollout, Rollout

    calls = []

    def collect(model, batch, tok, method, reward_cfg, sampling, group_size, seed, *, blank_seed=0, **_):
        calls.append((sampling.temperature, seed, blank_seed))
        # greedy: the blank answers as the image does (SAR 1); sampled: it does not (SAR 0)
        blank = "B" if sampling.temperature == 0 else "A"
        ros = [Rollout(id=f"{r.id}/0/0", completion="ab</think>B", answer="B", options=("A. x", "B. y"),
                       blank=BlankRollout(f"ab</think>{blank}")) for r in batch.records]
        return SimpleNamespace(rollouts=ros, scores=method.score_batch(ros, reward_cfg))

    monkeypatch.setattr(ev, "collect", collect)
    batches = [SimpleNamespace(records=[SimpleNamespace(id=f"q{i}", category="c") for i in range(k, k + 2)])
               for k in (0, 2)]
    tok = SimpleNamespace(im_end_id=1, pad_id=0)
    prosr = get_method("prosr")
    summary, rows = ev.evaluate(None, tok, batches, prosr, prosr.config(), 8, seed=7)
    assert [c[0] for c in calls] == [0.0, 1.0, 0.0, 1.0] and calls[1::2] == [(1.0, 7, 8), (1.0, 9, 10)]
    process = summary["process"]
    assert process["rollouts"] == "sampled (temperature 1)" and process["n"] == 4 and process["SAR"] == 0.0
    assert summary["accuracy"]["mean"] == 1.0 and process["accuracy"] == 1.0
    calls.clear()
    summary, _ = ev.evaluate(None, tok, batches, prosr, prosr.config(), 8, diagnostics="greedy")
    assert [c[0] for c in calls] == [0.0, 0.0] and summary["process"]["SAR"] == 1.0
    assert summary["process"]["rollouts"] == "greedy"
    with pytest.raises(ValueError, match="diagnostics must be one of"):
        ev.evaluate(None, tok, batches, prosr, prosr.config(), 8, diagnostics="beam")
