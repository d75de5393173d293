"""Typed configs: a partial table keeps the parent's defaults; dotted keys in every message."""

import dataclasses

import pytest

from spatial_jax.config import ConfigError, check_positive, load


@dataclasses.dataclass(frozen=True)
class Inner:
    a: float = 1.0
    b: float = 2.0

    def __post_init__(self):
        check_positive(self, "a", "b")


@dataclasses.dataclass(frozen=True)
class Outer:
    inner: Inner = Inner(a=5.0, b=6.0)


def test_a_partial_table_keeps_the_parents_default():
    assert load(Outer, None, ["inner.a=7"]).inner == Inner(a=7.0, b=6.0)


def test_partial_overrides_of_the_train_config_keep_its_section_defaults():
    from spatial_jax.rl.config import TrainConfig

    base = load(TrainConfig, None, [])
    cfg = load(TrainConfig, None, ["rl.loss.kind=gspo", "rl.sampling.top_p=0.9", "rl.optim.min_lr=1e-6"])
    assert cfg.rl.loss.kl_coef == base.rl.loss.kl_coef  # LossConfig's own default is 0.01; the RL stage's is 0
    assert cfg.rl.sampling.max_new_tokens == base.rl.sampling.max_new_tokens
    assert cfg.rl.optim.lr == base.rl.optim.lr


@pytest.mark.parametrize("override,needle", [
    ("inner.a=-1", "inner.a must be > 0, got -1.0"),
    ("inner.b=inf", "inner.b: expected a finite number"),
    ("inner.b=nan", "inner.b: expected a finite number"),
])
def test_messages_carry_the_dotted_key(override, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        load(Outer, None, [override])


@pytest.mark.parametrize("content,needle", [
    (None, "is a directory"),
    (b"seed = 1\nname = '\xff\xfe'\n", "not UTF-8"),
    (b"seed = [\n", "config file"),
])
def test_a_config_file_that_cannot_be_read_is_a_config_error(tmp_path, content, needle):
    path = tmp_path / "cfg.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=needle):
        load(Outer, path)
