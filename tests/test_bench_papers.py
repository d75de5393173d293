"""benchmarks/papers/papers.py's bookkeeping for --paper prosr (the runs themselves are a benchmark, not a test): the
figures read from an evaluation (accuracy where the prior is wrong, the prior's answer given), the paired tables and
claims over seeds; and every paper's argument errors, each one line before any run starts."""

import json
import math
import sys
from pathlib import Path

import pytest

from spatial_jax import config as C
from spatial_jax.data.pipeline import open_source
from spatial_jax.data.sample import LETTERS
from spatial_jax.data.synthetic import names_prior, prior_is_wrong
from spatial_jax.rl.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "papers"))

import paper_prosr  # noqa: E402
import papers  # noqa: E402

JOB = ROOT / "configs" / "prosr_prior_cpu.toml"


def test_job_is_the_main_job_in_prosr_format_with_a_prior_and_no_annotator_bias():
    cfg, main = C.load(TrainConfig, JOB), C.load(TrainConfig, ROOT / "configs" / "tiny_cpu.toml")
    world = cfg.data.synthetic
    assert (cfg.method, cfg.policy.checkpoint, world.width, world.grid) == ("prosr", "checkpoints/tiny_base", 64, 2)
    assert world.prior_colors and world.prior_answer == "left" and 0.5 < world.prior_rate < 1
    assert world.mirror_colors == () and world.question_types == ("relative_position",)
    assert 0 < world.hard_rate < 1  # the prior can pay only where the image is hard to read (Table 2)
    assert (cfg.rl.group_size, cfg.rl.prompts_per_step, cfg.sft.batch_size) == (
        main.rl.group_size, main.rl.prompts_per_step, main.sft.batch_size)
    paper_prosr.check(cfg)
    # the arms differ only in the reward's process terms
    vanilla = C.load(TrainConfig, JOB, paper_prosr.ARMS[paper_prosr.VANILLA][1]).rewards.prosr
    assert (vanilla.lambda_cf, vanilla.lambda_drift, vanilla.lambda_fmt) == (0.0, 0.0, cfg.rewards.prosr.lambda_fmt)
    assert (cfg.rewards.prosr.lambda_cf, cfg.rewards.prosr.lambda_drift) == (0.1, 0.1)


def test_figures_read_accuracy_where_the_prior_is_wrong_and_the_prior_given(tmp_path):
    cfg = C.load(TrainConfig, JOB, ["data.eval=synthetic:heldout:60"])
    samples = open_source(cfg.data.eval, cfg.data.synthetic)
    world = cfg.data.synthetic
    named = [s for s in samples if names_prior(world, s)]
    assert named and any(prior_is_wrong(world, s) for s in named)
    # a policy that answers every question with the prior's answer: right exactly where the prior is right
    left = LETTERS[samples[0].options.index("left")]
    rows = [{"id": s.id, "completion": f"The red square is left.\n</think>\n{left}",
             "correct": float(s.answer == left)} for s in samples]
    (tmp_path / "eval_sft.json").write_text(json.dumps({"rows": rows}))
    summary = {"accuracy": {"mean": 0.3}, "process": {"A_blank": 0.4, "SAR": 0.9, "NTS": 0.8, "LRR@0.1": 0.0}}
    f = paper_prosr.figures(cfg, tmp_path, "sft", summary)
    assert f[paper_prosr.WRONG] == 0.0 and f[paper_prosr.PRIOR] == 1.0
    assert f[paper_prosr.FALSE_PRIOR] == 1.0 and f[paper_prosr.HARD_FALSE_PRIOR] == 1.0
    assert f[paper_prosr.TRUE] == sum(not prior_is_wrong(world, s) for s in named) / len(named)
    hard_all = [s for s in samples if s.meta["hard"]]
    assert f[paper_prosr.HARD_ACC] == sum(s.answer == left for s in hard_all) / len(hard_all)
    hard_named = [s for s in named if s.meta["hard"]]
    assert f[paper_prosr.HARD_TRUE] == sum(not prior_is_wrong(world, s) for s in hard_named) / len(hard_named)
    assert (f["accuracy"], f["A_blank"], f["SAR"], f["LRR@0.1"]) == (0.3, 0.4, 0.9, 0.0)
    assert len(f["correct"]) == 60
    # the prior's answer on the hard images alone: a policy that gives it only there
    hard = [s for s in named if s.meta["hard"]]
    assert hard and len(hard) < len(named)
    other = LETTERS[samples[0].options.index("right")]
    guess = [{"id": s.id, "completion": f"x\n</think>\n{left if s.meta['hard'] else other}", "correct": 0.0}
             for s in samples]
    (tmp_path / "hard").mkdir()
    (tmp_path / "hard" / "eval_rl.json").write_text(json.dumps({"rows": guess}))
    f = paper_prosr.figures(cfg, tmp_path / "hard", "rl", summary)
    assert f[paper_prosr.HARD_PRIOR] == 1.0 and f[paper_prosr.PRIOR] == len(hard) / len(named)
    # a wrong answer that is the prior's, on the questions the prior gets wrong: here only the hard ones
    misled = [s for s in named if prior_is_wrong(world, s)]
    assert f[paper_prosr.HARD_FALSE_PRIOR] == 1.0
    assert f[paper_prosr.FALSE_PRIOR] == sum(s.meta["hard"] for s in misled) / len(misled) < 1.0
    assert f[paper_prosr.HARD_ACC] == 0.0
    # unparsed answers count as not giving the prior's; a missing evaluation file measures nothing
    rows = [dict(r, completion="no answer") for r in rows]
    (tmp_path / "eval_sft.json").write_text(json.dumps({"rows": rows}))
    assert paper_prosr.figures(cfg, tmp_path, "sft", summary)[paper_prosr.PRIOR] == 0.0
    empty = paper_prosr.figures(cfg, tmp_path, "rl", {"accuracy": {"mean": None}})
    assert empty[paper_prosr.WRONG] is None and empty["A_blank"] is None


def _figures(acc, wrong, prior, a_blank, sar, nts, lrr, correct=None):
    return {"accuracy": acc, paper_prosr.WRONG: wrong, paper_prosr.PRIOR: prior, "A_blank": a_blank, "SAR": sar,
            "NTS": nts, "LRR@0.1": lrr, "correct": correct or {}, paper_prosr.TRUE: 0.25, paper_prosr.HARD_TRUE: 0.3,
            paper_prosr.HARD_PRIOR: None, paper_prosr.HARD_ACC: None, paper_prosr.FALSE_PRIOR: None,
            paper_prosr.HARD_FALSE_PRIOR: None}


def _seeds():
    """Vanilla grows reliance on the prior in every seed (A_blank +0.2 +- 0.01); ProSR keeps the start's."""
    per_seed = []
    for k in range(3):
        e = 0.01 * (k - 1)
        per_seed.append({
            "SFT start": _figures(0.6, 0.5, 0.4, 0.2, 0.5, 0.6, 0.1, {"a": 0.0, "b": 1.0}),
            paper_prosr.VANILLA: _figures(0.62, 0.3 + e, 0.7, 0.4 + e, 0.8, 0.7 + e, 0.1, {"a": 1.0, "b": 0.0}),
            paper_prosr.PROSR: _figures(0.7 + e, 0.6, 0.35, 0.2, 0.5 + e, 0.6, None, {"a": 1.0, "b": 1.0}),
        })
    return per_seed


def test_tables_pair_each_arm_with_its_start_and_give_the_claims_verdicts():
    text = paper_prosr.tables(_seeds(), [0, 1, 2], "Config X.")
    lines = text.splitlines()
    assert lines[0].startswith("Seeds 0, 1, 2: mean ± standard error over seeds") and "Config X." in lines[0]
    assert lines[0].endswith("gives the prior's answer to 0.250 ± 0.000 of the prior-colour questions (0.300 ± 0.000 "
                             "of those with a hard image).")
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ")}
    assert set(paper_prosr.COLUMNS) <= set(rows)
    se = 0.01 / math.sqrt(3)
    assert rows["A_blank"] == (f"| A_blank | 0.200 ± 0.000 | 0.400 ± {se:.3f} | 0.200 ± {se:.3f} | "
                               f"0.200 ± 0.000 | 0.000 ± 0.000 | -0.200 ± {se:.3f} |")
    assert rows["LRR@0.1"].endswith("| n/a | n/a | n/a |")  # ProSR's LRR not measured: said, not a NaN
    assert rows["Table 2: vanilla GRPO raises A_blank over the SFT start"].endswith("| holds |")
    assert rows["Table 4: ProSR's A_blank below vanilla's"] == (
        f"| Table 4: ProSR's A_blank below vanilla's | 0.200 ± {se:.3f} | holds |")
    assert rows["Table 4: ProSR's LRR@0.1 below vanilla's"].endswith("| n/a | n/a |")
    assert rows["Table 4: ProSR more accurate than vanilla"].endswith("| holds |")
    assert rows["beyond: ProSR more accurate where the prior is wrong"].split(" | ")[1].startswith("0.300")
    assert lines[-1] == ("| 2 | 0.600 / 0.500 / 0.200 | 0.620 / 0.310 / 0.410, +1 / -1 | "
                         "0.710 / 0.600 / 0.200, +1 / -0 |")


@pytest.mark.parametrize("paper, argv, message", [
    ("prosr", ["--seeds", "0", "0"], "--seeds must be distinct"),
    ("prosr", ["--results", "no/such/RESULTS.md"], "--results no/such/RESULTS.md: no such file"),
    ("prosr", ["--config", str(ROOT / "configs" / "tiny_cpu.toml")], 'needs method = "prosr"'),
    ("prosr", ["data.synthetic.prior_colors=[]"], "needs a world with a language prior"),
    ("prosr", ["rewards.prosr.lambda_nope=1"], "lambda_nope"),
    ("prosr", ["data.synthetic.prior_rate=2"], "prior_rate must lie in [0, 1]"),
    ("spatialthinker", ["--config", str(ROOT / "configs" / "tiny_cpu.toml")], 'needs method = "spatialthinker"'),
    ("spatialthinker", ["rewards.spatialthinker.w_count=0.5"], "rewards.spatialthinker must be left as specified"),
    ("spatialthinker", ["rewards.spatialthinker.spatial_requires_correct=false"], "must be left as specified"),
    ("spatialthinker", ["rewards.spatialthinker.w_nope=1"], "w_nope"),
    ("spatialthinker", ["rewards.spatialthinker.w_format=-1"], "w_format"),
    ("allospatial", ["--config", str(ROOT / "configs" / "tiny_cpu.toml")], 'needs method = "allospatial"'),
    ("allospatial", ["data.synthetic.mirror_rate=0.0"], "needs a biased annotator"),
    ("allospatial", ["data.sft_targets=tools"], "sft_targets"),
])
def test_argument_errors_are_one_line_before_any_run(paper, argv, message, tmp_path, capsys):
    assert papers.main(["--paper", paper, "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("papers.py: configuration error:") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()  # nothing written


def test_unknown_paper_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        papers.main(["--paper", "nope"])
    assert e.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
    assert papers.parse(["--paper", "prosr"]).config == paper_prosr.CONFIG
