"""`spatial-jax --help` and `--version`: what the tool does, every command with its line, the versions; neither
imports jax."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

from spatial_jax import __version__
from spatial_jax.cli import COMMANDS, main


def _run(*args: str) -> subprocess.CompletedProcess:
    code = (
        "import sys\nfrom spatial_jax.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    status = e.code\n"
        "print('JAX_IMPORTED' if 'jax' in sys.modules else 'NO_JAX', file=sys.stderr)\nsys.exit(status)\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_help_says_what_the_tool_does_and_lists_every_command_with_its_line():
    p = _run("--help")
    assert p.returncode == 0, p.stderr
    assert "reinforcement learning" in p.stdout and "where the model" in p.stdout
    assert "thin module" not in p.stdout  # the package's internal docstring is for the code's readers
    for name, (_, help_) in COMMANDS.items():
        line = next(ln for ln in p.stdout.splitlines() if ln.split()[:1] == [name])
        assert line.split(None, 1)[1].strip() == help_
    assert "NO_JAX" in p.stderr


def test_version_prints_the_package_and_jax_versions_without_importing_jax():
    p = _run("--version")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"spatial-jax {__version__} (jax {version('jax')})"
    assert "NO_JAX" in p.stderr


def test_a_command_still_gets_its_own_parser(capsys):
    with pytest.raises(SystemExit) as e:
        main(["score", "--help"])
    assert e.value.code == 0
    assert "--method" in capsys.readouterr().out


def test_an_unknown_command_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as e:
        main(["trian"])
    assert e.value.code == 2
    assert "invalid choice: 'trian'" in capsys.readouterr().err
