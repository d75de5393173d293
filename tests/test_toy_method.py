"""A fifth method is one plug-in: a toy method written as its own package outside the tree registers itself with
one `register` call and trains 2 RL steps, with nothing else in the project naming it (issue 56)."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest

import spatial_jax.methods
from spatial_jax import config as C
from spatial_jax.rl.config import TrainConfig

# the whole method: its reward config, a pure reward function, its prompt format and its registration
TOY = '''
"""Toy: reward 1 for a completion whose last character is the gold letter, and a dense share of letters."""

import dataclasses

from spatial_jax.data.prompts import PromptFormat
from spatial_jax.methods import Method, register
from spatial_jax.rewards.advantages import AdvantageConfig


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    letter_weight: float = 0.5
    advantage: AdvantageConfig = AdvantageConfig()


def score_batch(rollouts, cfg=ToyConfig()):
    out = []
    for r in rollouts:
        text = r.completion.strip()
        right = float(bool(text) and text[-1] == str(r.answer))
        letters = sum(c.isalpha() for c in text) / len(text) if text else 0.0
        out.append({"reward": right + cfg.letter_weight * letters, "right": right, "letters": letters})
    return out


register(Method(
    name="toy",
    config_cls=ToyConfig,
    score_batch=score_batch,
    reference="toy_method:score_batch",
    prompt=PromptFormat("Answer with the letter of the right option, last.", thinking=False, reference_key="toy"),
    accuracy_key="right",
    well_formed=lambda c: True,
    final_answer=lambda text: text.strip()[-1:] or None,
))
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    folder = tmp_path / "plugins" / "toy_method"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    try:
        yield importlib.import_module("toy_method")
    finally:
        spatial_jax.methods.METHODS.pop("toy", None)
        sys.modules.pop("toy_method", None)


@pytest.mark.slow
def test_a_toy_fifth_method_registers_through_its_own_folder_and_trains_two_steps(tmp_path, toy):
    from spatial_jax.rl.train import train

    assert spatial_jax.methods.get_method("toy").score_batch is toy.score_batch
    run = tmp_path / "run"
    cfg = C.load(TrainConfig, None, [
        f"run_dir={run}", "method=toy", "rewards.toy.letter_weight=0.25", "sft.steps=0", "rl.steps=2",
        "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=12", "eval.after_rl=false",
        "data.train=synthetic:train:16", "data.eval=synthetic:heldout:4", "tensorboard=false", "progress=false",
        "data.bucket_lengths=[256,512]"])
    assert cfg.reward_config() == toy.ToyConfig(letter_weight=0.25)  # its own `rewards.toy` table, typed
    results = train(cfg)
    rows = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and results["method"] == "toy"
    for r in rows:  # the step's figures are the toy's own components, its accuracy its `right`
        assert {"reward/right", "reward/letters"} <= set(r) and r["accuracy"] == r["reward/right"]
        assert r["reward_mean"] == pytest.approx(r["reward/right"] + 0.25 * r["reward/letters"], abs=1e-6)
    assert json.loads((run / "config.json").read_text())["rewards"]["toy"] == {
        "letter_weight": 0.25, "advantage": C.to_dict(toy.ToyConfig().advantage)}


def test_an_unregistered_method_is_refused_by_name_with_the_registered_ones(tmp_path):
    with pytest.raises(C.ConfigError) as e:
        C.load(TrainConfig, None, [f"run_dir={tmp_path}", "method=toy"])
    assert "toy" in str(e.value) and "spatialcore" in str(e.value)
