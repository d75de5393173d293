"""Every float of the reward, loss, optimiser, sampling and model configs refuses NaN and infinities, and every
rule speaks the one idiom of spatial_jax/config.py: `<field> must ..., got <value>` (dotted key via from_dict).

Before: `alpha=inf` built a SpatialCOREConfig whose rewards were NaN, `min(...) >= 0` let NaN through, and
`rl.optim.lr=inf` compiled and crashed only at the first checkpoint.
"""

import dataclasses
import math
import re
import typing

import pytest

from spatial_jax import config as C
from spatial_jax.models.config import LoRAConfig, ModelConfig, TextConfig, VisionConfig
from spatial_jax.rewards.advantages import AdvantageConfig
from spatial_jax.rewards.allospatial import AlloSpatialConfig
from spatial_jax.rewards.prosr import ProSRConfig
from spatial_jax.rewards.spatialcore import SpatialCOREConfig
from spatial_jax.rewards.spatialthinker import SpatialThinkerConfig
from spatial_jax.rl.losses import LossConfig
from spatial_jax.rl.optim import OptimConfig
from spatial_jax.rollout.config import SamplingConfig

CONFIGS = (SpatialCOREConfig, ProSRConfig, SpatialThinkerConfig, AlloSpatialConfig, AdvantageConfig, LossConfig,
           OptimConfig, SamplingConfig, LoRAConfig, TextConfig, VisionConfig)
BAD = (math.inf, -math.inf, math.nan)


def _float_fields(cls):
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if tp is float or (typing.get_origin(tp) in (typing.Union, __import__("types").UnionType)
                           and float in typing.get_args(tp)):
            out.append(f.name)
    return out


FLOAT_FIELDS = [(cls, name) for cls in CONFIGS for name in _float_fields(cls)]


def test_every_config_has_float_fields_listed():
    assert {cls for cls, _ in FLOAT_FIELDS} == set(CONFIGS)
    assert len(FLOAT_FIELDS) > 60


@pytest.mark.parametrize("bad", BAD, ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("cls,name", FLOAT_FIELDS, ids=[f"{c.__name__}.{n}" for c, n in FLOAT_FIELDS])
def test_non_finite_float_is_refused_naming_the_field(cls, name, bad):
    with pytest.raises(ValueError, match=rf"\b{name} must .*, got {re.escape(repr(bad))}"):
        cls(**{name: bad})


@pytest.mark.parametrize("bad", ["inf", "nan", "-inf"])
@pytest.mark.parametrize("cls,name", FLOAT_FIELDS, ids=[f"{c.__name__}.{n}" for c, n in FLOAT_FIELDS])
def test_non_finite_override_is_a_config_error_naming_the_key(cls, name, bad):
    with pytest.raises(C.ConfigError, match=rf"\b{name}\b"):
        C.apply_overrides(cls(), [f"{name}={bad}"])


def test_mra_thresholds_refuse_nan():
    with pytest.raises(ValueError, match=r"mra_thresholds must .*, got"):
        AlloSpatialConfig(mra_thresholds=(0.5, math.nan))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rewards.spatialcore.alpha=-1"], "rewards.spatialcore.alpha must be > 0, got -1.0"),
        (["rewards.spatialcore.repeat_box_penalty=-0.1"],
         "rewards.spatialcore.repeat_box_penalty must be >= 0, got -0.1"),
        (["rewards.spatialcore.format_floor=0.5"], "rewards.spatialcore.format_floor must lie in [-1.0, 0.0], got 0.5"),
        (["rewards.prosr.lambda_cf=-1"], "rewards.prosr.lambda_cf must be >= 0, got -1.0"),
        (["rewards.prosr.late_start=0.2"], "rewards.prosr.late_start must lie in [0.3, 1.0], got 0.2"),
        (["rewards.spatialcore.advantage.eps=0"], "rewards.spatialcore.advantage.eps must be > 0, got 0.0"),
        (["rewards.spatialcore.advantage.std=unit"],
         "rewards.spatialcore.advantage.std: 'unit' is not one of ['population', 'sample', 'none']"),
        (["rewards.spatialthinker.ciou_eps=0"], "rewards.spatialthinker.ciou_eps must be > 0, got 0.0"),
        (["rewards.allospatial.accuracy_gate=2"], "rewards.allospatial.accuracy_gate must lie in [0.0, 1.0], got 2.0"),
        (["rl.optim.lr=-1"], "rl.optim.lr must be > 0, got -1.0"),
        (["rl.optim.lr=1e-4", "rl.optim.min_lr=1"], "rl.optim.min_lr must lie in [0.0, 0.0001], got 1.0"),
        (["rl.loss.clip_high=-1"], "rl.loss.clip_high must be >= 0, got -1.0"),
        (["rl.loss.dual_clip=0.5"], "rl.loss.dual_clip must be > 1.0, got 0.5"),
        (["rl.sampling.top_p=0"], "rl.sampling.top_p must lie in (0.0, 1.0], got 0.0"),
        (["policy.lora.dropout=1"], "policy.lora.dropout must lie in [0.0, 1.0), got 1.0"),
    ],
)
def test_rule_messages_name_the_dotted_key(overrides, message):
    from spatial_jax.rl.config import TrainConfig

    with pytest.raises(C.ConfigError) as err:
        C.load(TrainConfig, None, overrides)
    assert message in str(err.value)


def test_model_config_rules_use_the_idiom():
    with pytest.raises(C.FieldError, match=r"vocab_size must be >= 1, got 0"):
        TextConfig(vocab_size=0)
    with pytest.raises(C.FieldError, match=r"image_token_id must .*outside the vocabulary.*, got 70"):
        ModelConfig.tiny(vocab_size=64, image_token_id=70)
    with pytest.raises(C.FieldError, match=r"attention_chunk must be >= 0, got -1"):
        ModelConfig(attention_chunk=-1)
    with pytest.raises(C.FieldError, match=r"rank must be >= 0, got -1"):
        LoRAConfig(rank=-1)
    with pytest.raises(C.ConfigError, match=r"lora.alpha must be > 0, got 0.0"):
        C.apply_overrides(ModelConfig.tiny(), ["lora.alpha=0"])
