"""Configs that inherit (`base = "other.toml"`): the recipes resolve exactly as they did before they were rewritten
to state only their differences, and the loader's rules (relative paths, table-by-table merge, chains, cycles,
missing bases) hold.

tests/recipes_resolved.json is every configs/*.toml resolved into TrainConfig (`to_dict(load(TrainConfig, path))`,
JSON, sorted keys) at commit 3a4e273, the last one before any recipe named a base. A recipe changed on purpose
changes its entry in the same commit, so that the diff shows what the change does to the resolved job."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from spatial_jax.config import MAX_BASES, ConfigError, config_files, flatten, load, load_toml, to_dict
from spatial_jax.rl.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
PINNED = json.loads((Path(__file__).parent / "recipes_resolved.json").read_text())


def test_every_recipe_is_pinned():
    assert sorted(PINNED) == sorted(p.name for p in CONFIGS.glob("*.toml"))


@pytest.mark.parametrize("name", sorted(PINNED))
def test_each_recipe_resolves_as_before_the_rewrite(name):
    got = json.loads(json.dumps(to_dict(load(TrainConfig, CONFIGS / name)), sort_keys=True))
    want, have = flatten(PINNED[name]), flatten(got)
    assert {k: (want.get(k), have.get(k)) for k in set(want) | set(have) if want.get(k) != have.get(k)} == {}


def test_recipes_state_only_their_differences():
    """No setting a recipe writes equals what its base already gives it, and the families share their bases."""
    bases = {}
    for path in sorted(CONFIGS.glob("*.toml")):
        own = tomllib.loads(path.read_text())
        if "base" not in own:
            continue
        bases[path.name] = own.pop("base")
        inherited = flatten(load_toml(path.parent / bases[path.name]))
        same = {k: v for k, v in flatten(own).items() if k in inherited and inherited[k] == v}
        assert same == {}, path.name
    assert bases == {
        "allospatial_4b.toml": "base/paper.toml", "allospatial_cpu.toml": "tiny_cpu.toml",
        "pretrain_uncertain.toml": "pretrain_tiny.toml", "prosr_8b.toml": "base/paper.toml",
        "prosr_prior_cpu.toml": "tiny_cpu.toml", "spatialcore_4b.toml": "spatialcore_8b.toml",
        "spatialcore_8b.toml": "base/paper.toml", "spatialthinker_30b.toml": "spatialthinker_3b.toml",
        "spatialthinker_3b.toml": "base/paper.toml", "spatialthinker_7b.toml": "spatialthinker_3b.toml",
        "spatialthinker_cpu.toml": "tiny_cpu.toml", "uncertain_cpu.toml": "tiny_cpu.toml",
    }


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_base_chain_merges_table_by_table_and_replaces_lists(tmp_path, monkeypatch):
    _write(tmp_path, "shared/root.toml", 'run_dir = "runs/root"\nseed = 3\n[rl]\nsteps = 7\ngroup_size = 4\n'
                                         '[data]\nbucket_lengths = [64, 128, 256]\n')
    _write(tmp_path, "shared/mid.toml", 'base = "root.toml"\n[rl]\nsteps = 9\n')
    child = _write(tmp_path, "jobs/child.toml",
                   'base = "../shared/mid.toml"\nseed = 5\n[data]\nbucket_lengths = [512]\n')
    monkeypatch.chdir(tmp_path / "shared")  # a base is found beside the file that names it, not from the cwd
    assert load_toml(child) == {"run_dir": "runs/root", "seed": 5, "rl": {"steps": 9, "group_size": 4},
                                "data": {"bucket_lengths": [512]}}
    cfg = load(TrainConfig, child, ["rl.steps=2"])  # key=value still has the last word
    assert (cfg.seed, cfg.run_dir, cfg.rl.steps, cfg.rl.group_size, cfg.data.bucket_lengths) == (
        5, "runs/root", 2, 4, (512,))


def test_a_recipe_copied_with_its_base_resolves_as_the_original(tmp_path):
    for path in [CONFIGS / "spatialthinker_30b.toml", CONFIGS / "spatialthinker_3b.toml", CONFIGS / "base/paper.toml"]:
        _write(tmp_path, str(path.relative_to(CONFIGS)), path.read_text())
    assert to_dict(load(TrainConfig, tmp_path / "spatialthinker_30b.toml")) == to_dict(
        load(TrainConfig, CONFIGS / "spatialthinker_30b.toml"))


@pytest.mark.parametrize("text, words", [
    ('base = "gone.toml"\n', ["child.toml", "'gone.toml'", "does not exist"]),
    ('base = "child.toml"\n', ["child.toml", "a cycle"]),
    ('base = ""\n', ["child.toml", "base must be the path of a TOML file"]),
    ("base = 3\n", ["child.toml", "base must be the path of a TOML file, got 3"]),
    ('base = ["a.toml"]\n', ["child.toml", "got ['a.toml']"]),
    ('base = "."\n', ["is a directory"]),
])
def test_a_bad_base_is_one_config_error_naming_the_file(tmp_path, text, words):
    child = _write(tmp_path, "child.toml", text)
    with pytest.raises(ConfigError) as e:
        load(TrainConfig, child)
    for w in words:
        assert w in str(e.value)


def test_a_cycle_through_two_files_and_a_chain_too_deep_are_refused(tmp_path):
    _write(tmp_path, "a.toml", 'base = "b.toml"\n')
    _write(tmp_path, "b.toml", 'base = "./a.toml"\n')
    with pytest.raises(ConfigError, match=r"b.toml: base './a.toml' leads back to .*a.toml \(a cycle\)"):
        load_toml(tmp_path / "a.toml")
    _write(tmp_path, f"c{MAX_BASES + 1}.toml", "seed = 1\n")
    for i in range(MAX_BASES + 1):
        _write(tmp_path, f"c{i}.toml", f'base = "c{i + 1}.toml"\n')
    assert load_toml(tmp_path / "c1.toml") == {"seed": 1}  # MAX_BASES bases followed: allowed
    with pytest.raises(ConfigError, match=f"c{MAX_BASES}.toml: more than {MAX_BASES} bases deep"):
        load_toml(tmp_path / "c0.toml")


def test_a_bad_key_in_a_base_is_refused_by_name(tmp_path):
    _write(tmp_path, "base.toml", "[rl]\nstepz = 3\n")
    child = _write(tmp_path, "child.toml", 'base = "base.toml"\n[rl]\nsteps = 2\n')
    with pytest.raises(ConfigError, match="rl.stepz"):
        load(TrainConfig, child)


def test_config_files_lists_the_file_and_its_bases_in_order():
    assert config_files(CONFIGS / "spatialthinker_30b.toml") == [
        CONFIGS / "spatialthinker_30b.toml", CONFIGS / "spatialthinker_3b.toml", CONFIGS / "base/paper.toml"]
    assert config_files(CONFIGS / "tiny_cpu.toml") == [CONFIGS / "tiny_cpu.toml"]


@pytest.mark.parametrize("argv", [
    ["plan", "--config", "{child}", "--json", "{base}"],
    ["to-cvbench", "--config", "{child}", "--data", "synthetic:heldout:4", "--out", "{base}"],
    ["pretrain", "--config", "{child}", "--out", "{base}"],
    ["eval", "--config", "{child}", "--initial", "--data", "synthetic:heldout:4", "--output", "{base}"],
])
def test_no_command_writes_over_a_base_its_config_names(tmp_path, argv, capsys):
    from spatial_jax.cli import main

    base = _write(tmp_path, "base.toml", "seed = 1\n")
    child = _write(tmp_path, "child.toml", 'base = "base.toml"\n')
    before = base.read_bytes()
    status = main([a.format(child=child, base=base) for a in argv])
    assert status == 2
    assert "base.toml" in capsys.readouterr().err
    assert base.read_bytes() == before
