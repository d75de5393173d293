"""The documentation site's generated references hold every config key and every command's --help, and the results
pages every section of benchmarks/RESULTS.md; checked from the generators, without building the site (CI's
`mkdocs build --strict` builds it)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from spatial_jax.config import to_dict
from spatial_jax.rl.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def docs_gen():
    spec = importlib.util.spec_from_file_location("docs_gen", ROOT / "tools" / "docs_gen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _leaf_keys(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += _leaf_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]
    return out


def test_config_reference_lists_every_key(docs_gen):
    page = docs_gen.config_reference()
    keys = _leaf_keys(to_dict(TrainConfig()))
    assert len(keys) > 150  # the walk reached the nested tables (rewards per method included)
    assert sorted(docs_gen.config_keys()) == sorted(keys)
    missing = [k for k in keys if f"| `{k}` |" not in page]
    assert not missing, f"config keys absent from the generated reference: {missing}"


def test_cli_reference_holds_every_help(docs_gen):
    import argparse

    from spatial_jax.cli import COMMANDS, build_parser

    page = docs_gen.cli_reference()
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert sorted(sub.choices) == sorted(COMMANDS)
    for name, p in sub.choices.items():
        assert f"## `spatial-jax {name}`" in page
        options = [o for a in p._actions for o in a.option_strings]
        missing = [o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", page)]
        assert not missing, f"spatial-jax {name}: options absent from the CLI reference: {missing}"
    # the hand-written table names every command too
    commands_page = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    assert not [n for n in COMMANDS if f"`spatial-jax {n}" not in commands_page]


def test_results_pages_hold_every_section_once(docs_gen):
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    pages = docs_gen.results_pages(text)
    joined = "\n".join(pages.values())
    for heading in re.findall(r"(?m)^## .*$", text):
        assert joined.count(heading + "\n") == 1, heading
    added = text + "\n## A measurement no topic names\n\nfigures\n"
    assert "## A measurement no topic names" in docs_gen.results_pages(added)["results/other.md"]


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    assert not [p for p in pages if p not in nav]


def test_readme_commands_are_the_ones_ci_runs():
    """README's first two commands (install + main job; tests) are .ci/run's, step for step (CI adds `-q` to pip)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").replace("pip install -q ", "pip install ")
    install, tests = re.findall(r"```bash\n(.*?)\n```", readme, re.S)[:2]
    steps = [s.strip() for s in (install + " && " + tests).split("&&")]
    assert steps[:3] == ["python3 -m venv .venv", ". .venv/bin/activate", 'pip install -e ".[test]"']
    assert not [s for s in steps if f"\n{s}\n" not in f"\n{ci}\n"]
    assert len(readme.splitlines()) <= 160
