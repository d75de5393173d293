"""benchmarks/papers/rollout_gap.py: its argument errors, each one line before any run starts, and a smoke run (1 seed,
2 RL steps per arm, bfloat16, one-step-off rollouts) whose tables and run directories show the arms ran and differ
where they should."""

import sys
from pathlib import Path

import pytest

from spatial_jax.rl.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "papers"))

import rollout_gap  # noqa: E402

SMOKE = ["sft.steps=0", "rl.steps=2", "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=12",
         "data.train=synthetic:train:16", "eval.after_rl=false", "data.bucket_lengths=[256,512]",
         "rl.rollout_mode=one_step_off", "rl.optim.warmup_ratio=0.0",
         # the random policy earns no reward spread, so no advantage moves it: weight decay makes step 1 move the
         # weights, which the staleness half of the gap's split must then show
         "rl.optim.weight_decay=0.5"]


@pytest.mark.parametrize("args, message", [
    (["--seeds", "1", "1"], "--seeds must be distinct integers in [0, 2**31)"),
    (["--seeds", "-1"], "--seeds must be distinct integers in [0, 2**31)"),
    (["--results", "nowhere/RESULTS.md"], "--results nowhere/RESULTS.md: no such file"),
    (["rl.nope=1"], "unknown config key"),
    (["rl.steps=0"], "rl.steps=0: the arms differ only in their RL stage"),
    (["rl.correction.tis=token"], "rl.correction must stay off with old_logp='sampler'"),
])
def test_argument_errors_are_one_line_before_any_run(args, message, tmp_path, capsys):
    assert rollout_gap.main(["--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rollout_gap.py:") and message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_smoke_one_seed_two_steps(tmp_path, capsys):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n")
    out = tmp_path / "out"
    assert rollout_gap.main(["--config", str(ROOT / "configs" / "tiny_random.toml"), "--seeds", "0", "--out",
                             str(out), "--results", str(results), *SMOKE]) == 0
    text = results.read_text()
    assert rollout_gap.BEGIN in text and "| gap mean abs(d) |" in text and "trainer + TIS - sampler" in text
    assert "| first-call ratio max | " in text and "| old_logp forward s | n/a | n/a | " in text
    runs = {d: read_metrics(out / "seed0" / d / "rl" / "metrics.jsonl") for d, _ in rollout_gap.ARMS.values()}
    assert all(len(rows) == 2 for rows in runs.values())
    # bfloat16: the sampler's copy and the trainer differ; the trainer's pi_old puts the first call's ratio at 1
    assert all(r["gap/abs_max"] > 1e-4 for rows in runs.values() for r in rows)
    assert all(r["loss/ratio_max"] == 1.0 for d in ("trainer", "trainer_tis") for r in runs[d])
    assert any(r["loss/ratio_max"] > 1.0 for r in runs["sampler"])
    assert all("correction/tis_truncated_frac" in r and r["time/old_logp_s"] > 0 for r in runs["trainer_tis"])
    # one_step_off: step 2 trains on step 1's weights' rollouts; with the trainer's pi_old the gap splits
    for d in ("trainer", "trainer_tis"):
        late = runs[d][1]
        assert late["rollout/lag"] == 1 and late["gap/numeric/abs_max"] > 1e-4 and late["gap/staleness/abs_max"] > 0
    assert "gap/numeric/abs_max" not in runs["sampler"][1]
