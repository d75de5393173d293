"""Issue 44: every benchmark script that writes a file shares the output guard (spatial_jax/cli/script_guard.py) and
bounds its sizes, and refuses before any heavy work: an output file it did not write, an output folder someone else
filled, an output that is one of its inputs, a count beyond its bounds."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spatial_jax.cli.script_guard import check_own_output, claim_folder, write_own
from spatial_jax.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
FOLDER = {"rewards": "kernels", "entropy_kernels": "kernels", "step_gpu": "training", "moe": "training",
          "format_breaks": "papers", "sampler": "training", "export": "training", "async_rollouts": "training",
          "data_streaming": "training", "rollout_gap": "papers", "triton_entropy": "gpu"}
sys.path += [str(BENCH / folder) for folder in sorted(set(FOLDER.values()))]  # each script's siblings import
HUGE = "99999999999999"
FOREIGN = '{"someone": "else"}\n'


def _script(name: str):
    """benchmarks/<folder>/<name>.py as a module of its own name (bench_<name>: `sampler` and `export` are common
    names); the environment it sets on import (async_rollouts' eight host devices) is put back."""
    saved = dict(os.environ)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / FOLDER[name] / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.environ.clear()
    os.environ.update(saved)
    return module


# script, its heavy steps (each must not start), argv with {out} (a file, or a folder for the folder outputs)
SCRIPTS = {
    "rewards": (["bench_method"], ["--out", "{out}"]),
    "entropy_kernels": (["machine", "functions"], ["--out", "{out}"]),
    "step_gpu": (["build_policy", "run_rl", "run_decode"], ["rl", "--model", "tiny", "--out", "{out}"]),
    "moe": (["layer_for"], ["--out", "{out}"]),
    "format_breaks": (["measure"], ["{run}", "--config", "{config}", "--out", "{out}"]),
    "sampler": (["skewed"], ["--skewed-only"]),
    "export": (["measure"], []),
    "async_rollouts": (["run_arm"], ["--out", "{folder}"]),
    "data_streaming": (["write_copies"], ["--sizes", "10", "--out", "{folder}"]),
    "rollout_gap": (["run_seed"], ["--seeds", "0", "--out", "{folder}", "--config", "{config}"]),
}
# a count beyond its bounds, per script
TOO_BIG = {"rewards": ["--n", HUGE], "entropy_kernels": ["--n", HUGE], "step_gpu": ["--completion", HUGE],
           "moe": ["--experts", "100000"], "format_breaks": ["--prompts", HUGE], "sampler": ["--batch", HUGE],
           "export": ["--layers", HUGE], "async_rollouts": ["--steps", HUGE], "data_streaming": ["--sizes", HUGE],
           "rollout_gap": ["--seeds", HUGE]}


def _run(name, argv, tmp_path, monkeypatch, capsys):
    """The script's exit status and stderr, its heavy steps made to fail the test if they start."""
    module = _script(name)
    for step in SCRIPTS[name][0]:
        monkeypatch.setattr(module, step, lambda *a, **k: pytest.fail(f"{name}: a heavy step started"))
    if name in ("sampler", "export"):  # their output is fixed: benchmarks/out/<name>.json
        monkeypatch.setattr(module, "OUT", tmp_path / "out.json")
    try:
        status = module.main(argv)
    except SystemExit as e:  # argparse's error(): usage, then the message
        status = e.code
    return status, capsys.readouterr().err


def _argv(name, tmp_path, extra=()):
    config = tmp_path / "job.toml"
    config.write_text((ROOT / "configs" / "tiny_cpu.toml").read_text())
    (tmp_path / "run").mkdir(exist_ok=True)
    fill = {"{out}": str(tmp_path / "out.json"), "{folder}": str(tmp_path / "folder"), "{config}": str(config),
            "{run}": str(tmp_path / "run")}
    return [fill.get(a, a) for a in SCRIPTS[name][1]] + list(extra)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_an_output_the_script_did_not_write_is_refused_and_kept(name, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "theirs.txt").write_text("keep")
    (tmp_path / "out.json").write_text(FOREIGN)
    status, err = _run(name, _argv(name, tmp_path), tmp_path, monkeypatch, capsys)
    assert status == 2, err
    assert "was not written by" in err or "did not write" in err, err
    assert (tmp_path / "out.json").read_text() == FOREIGN and (folder / "theirs.txt").read_text() == "keep"
    assert sorted(p.name for p in folder.iterdir()) == ["theirs.txt"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_count_beyond_its_bounds_is_refused_before_any_work(name, tmp_path, monkeypatch, capsys):
    status, err = _run(name, _argv(name, tmp_path, TOO_BIG[name]), tmp_path, monkeypatch, capsys)
    assert status == 2, err
    assert "must lie in" in err or "distinct integers in [0, 2**31)" in err, err
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "folder").exists()


@pytest.mark.parametrize("name, argv, needle", [
    ("format_breaks", ["{run}", "--config", "{config}", "--out", "{config}"], "would overwrite its input"),
    ("format_breaks", ["{run}", "--config", "{config}", "--out", "{run}/config.toml"], "would overwrite its input"),
    ("rollout_gap", ["--out", "{folder}", "--config", "{config}", "--results", "{config}"],
     "would overwrite its input"),
    ("rollout_gap", ["--out", "{folder}", "--config", "{config}", "--results", "{out}"], "is not a Markdown file"),
    ("entropy_kernels", ["--out", ""], "is a folder: name the file to write"),  # Path("") is "."
])
def test_an_output_naming_an_input_is_refused(name, argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(SCRIPTS, name, (SCRIPTS[name][0], argv))
    given = _argv(name, tmp_path)
    (tmp_path / "run" / "config.toml").write_text("x = 1\n")
    (tmp_path / "out.json").write_text(FOREIGN)
    before = (tmp_path / "job.toml").read_text()
    status, err = _run(name, [a.replace("{run}", str(tmp_path / "run")) for a in given], tmp_path, monkeypatch,
                       capsys)
    assert status == 2 and needle in err, err
    assert (tmp_path / "job.toml").read_text() == before and (tmp_path / "run" / "config.toml").read_text() == "x = 1\n"


def test_triton_entropy_refuses_before_importing_torch(tmp_path):
    """Its arguments are read at import (the interpreter's switch must precede triton's import): the refusal comes
    there, for the JSON and for the Markdown beside it (--peers)."""
    theirs = tmp_path / "peers.md"
    theirs.write_text("# theirs\n")
    for argv, needle in [(["--ns", HUGE], "--ns must lie in"),
                         (["--peers", "--out", str(tmp_path / "peers.json")], "was not written by")]:
        res = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'triton_entropy.py'; "
                              f"sys.path.insert(0, {str(BENCH / 'gpu')!r}); import triton_entropy", *argv],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert res.returncode == 2 and needle in res.stderr, res.stderr[-2000:]
    assert theirs.read_text() == "# theirs\n" and not (tmp_path / "peers.json").exists()


def test_a_script_replaces_only_its_own_earlier_output(tmp_path):
    out = tmp_path / "r.json"
    write_own(out, {"rows": [1]}, "mine.py")
    assert json.loads(out.read_text()) == {"written_by": "mine.py", "rows": [1]}
    write_own(out, {"rows": [2]}, "mine.py")  # a rerun replaces its own
    assert json.loads(out.read_text())["rows"] == [2]
    with pytest.raises(ConfigError, match="was not written by other.py"):
        check_own_output(out, "--out", "other.py")
    md = tmp_path / "t.md"
    write_own(md, "| a |", "mine.py")
    assert md.read_text() == "<!-- written_by mine.py -->\n| a |\n"
    check_own_output(md, "--out", "mine.py")
    md.write_text("| a |\n")  # the same table without the mark: someone else's now
    with pytest.raises(ConfigError, match="was not written by mine.py"):
        write_own(md, "| b |", "mine.py")
    assert md.read_text() == "| a |\n" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "t.md"]
    with pytest.raises(ConfigError, match="is a folder"):
        check_own_output(tmp_path, "--out", "mine.py")


def test_a_script_folder_is_new_empty_or_its_own(tmp_path):
    own = claim_folder(tmp_path / "a" / "b", "--out", "mine.py")
    (own / "run").mkdir()
    assert claim_folder(own, "--out", "mine.py") == own  # a rerun goes on in its own folder
    with pytest.raises(ConfigError, match="holds files that other.py did not write"):
        claim_folder(own, "--out", "other.py")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "x").write_text("x")
    with pytest.raises(ConfigError, match="holds files that mine.py did not write"):
        claim_folder(tmp_path / "theirs", "--out", "mine.py")
    with pytest.raises(ConfigError, match="--out is empty"):
        claim_folder("", "--out", "mine.py")
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == ["x"]
