"""A stage's checkpoints record the SHA-256 of the data file it trains on; resuming it on a file whose rows changed is
refused as a change of settings is, before anything is written. (The steps themselves are stubbed: what is tested is
what the trainer records and checks around them.)"""

from __future__ import annotations

import dataclasses

import pytest

from spatial_jax.cli import main
from spatial_jax.data.jsonl import read_jsonl, write_jsonl
from spatial_jax.data.pipeline import open_source
from spatial_jax.rl.learner import Learner


@pytest.fixture
def no_steps(monkeypatch):
    monkeypatch.setattr(Learner, "sft_step", lambda self, step, batch, tx, opt_state: ({"loss": 0.0}, opt_state))


def test_resuming_sft_on_changed_rows_is_refused(tmp_path, no_steps, capsys):
    data = tmp_path / "sft.jsonl"
    write_jsonl(list(open_source("synthetic:train:4")), data)
    run = tmp_path / "run"
    job = ["sft", f"run_dir={run}", f"data.sft_train={data}", "sft.batch_size=2", "sft.checkpoint_every=1",
           "sft.steps=2", "eval.after_sft=false", "export_hf=false", "progress=false", "tensorboard=false"]
    assert main(job) == 0
    assert main(job) == 0  # the same rows: the finished stage is taken up again
    rows = read_jsonl(data)
    write_jsonl([dataclasses.replace(rows[0], answer="B" if rows[0].answer != "B" else "A"), *rows[1:]], data)
    capsys.readouterr()
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    assert main(job) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spatial-jax sft: configuration error: {run / 'sft' / 'checkpoints' / '2'} was trained "
                          f"on other data: data.sft_train {data} has changed since") and err.count("\n") == 1, err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
