"""The persistent compilation cache (spatial_jax/compile_cache.py, issue 57 item 2): where it lives, that a second
process loads what the first compiled (and plan says so), that two processes may share it, and that a folder that
cannot be written leaves it off without failing the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from spatial_jax import compile_cache

ROOT = Path(__file__).resolve().parents[1]

# one program measured as plan measures it; a fresh process each time, so nothing comes from jit's own memory
SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
from spatial_jax import compile_cache
from spatial_jax.rl.plan.measure import _measure
path = compile_cache.enable()
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # the test's program compiles in milliseconds
mesh = jax.make_mesh((1,), ("data",))
program = _measure(mesh, "f", "a sum", jax.jit(lambda x: jnp.sin(x).sum() * float(sys.argv[1])),
                   (jax.ShapeDtypeStruct((64, 64), jnp.float32),))
print(json.dumps({"path": str(path), "cache": program.cache, "counts": compile_cache.counts()}))
"""


def _run(cache, scale=2.0, **extra):
    env = {**os.environ, compile_cache.ENV: str(cache), **extra}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(scale)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def test_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.location() == tmp_path / "spatial-jax" / "xla"
    monkeypatch.setenv(compile_cache.ENV, "~/elsewhere")
    assert compile_cache.location() == Path.home() / "elsewhere"
    monkeypatch.setenv(compile_cache.ENV, "")
    assert compile_cache.location() is None


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    first, _ = _run(tmp_path / "xla")
    assert first["path"] == str(tmp_path / "xla") and first["cache"] == "miss" and first["counts"] == [0, 1]
    second, err = _run(tmp_path / "xla")
    assert second["cache"] == "hit" and second["counts"] == [1, 1]
    assert "plan: f loaded from the compilation cache" in err
    other, _ = _run(tmp_path / "xla", scale=3.0)  # another program: its own entry, compiled
    assert other["cache"] == "miss"
    # bounded, so JAX locks the folder around each read and write: two processes may share it
    assert (tmp_path / "xla" / ".lockfile").exists()


def test_an_unwritable_folder_leaves_the_cache_off(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    result, err = _run(blocked / "xla")
    assert result["path"] == "None" and result["cache"] == "off" and result["counts"] == [0, 0]
    assert f"compilation cache off, {blocked / 'xla'} cannot be written" in err


def test_an_empty_setting_turns_it_off():
    result, err = _run("")
    assert result["cache"] == "off" and "compilation cache" not in err


def test_jaxs_own_setting_is_left_as_it_is(tmp_path):
    result, _ = _run(tmp_path / "ours", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "theirs"))
    assert result["path"] == str(tmp_path / "theirs") and result["cache"] == "miss"
    assert not (tmp_path / "ours").exists()
