"""tools/docs_gen.py's pages pinned in full on small inputs of the real shapes: a config of nested typed dataclasses
(documented, undocumented and key-less tables; literal, union, tuple and non-JSON defaults; a `|` in a default), a
parser with a nested subcommand and a description long enough to wrap at the fixed help width, and a RESULTS.md whose
sections land on each topic's page by the first pattern their heading matches; the mkdocs hook adds the pages."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from pathlib import Path
from typing import Literal

import pytest

import spatial_jax.cli
import spatial_jax.rl.config

ROOT = Path(__file__).resolve().parents[1]
# under the module name mutation testing gives tools/docs_gen.py, so its mutants are reached
_SPEC = importlib.util.spec_from_file_location("tools.docs_gen", ROOT / "tools" / "docs_gen.py")
docs_gen = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(docs_gen)


# --- the config reference -------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LossConfig:
    """kind: the policy-gradient objective; clip_low / clip_high: the ratio's clip range."""

    kind: Literal["grpo", "gspo"] = "grpo"
    clip_low: float = 0.2
    clip_high: float = 0.28


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """steps: optimiser steps of the RL stage.
        (an indented second line, as docstrings are written)"""

    steps: int = 200
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)


@dataclasses.dataclass(frozen=True)
class SpatialCoreRewards:
    """format_weight: the reward's weight on a well-formed answer."""

    format_weight: float = 0.1


class ProSRRewards(SpatialCoreRewards):  # a plug-in reusing another's table, undecorated: no docstring at all
    pass


@dataclasses.dataclass(frozen=True)
class RewardsConfig:
    """One table per registered method."""

    spatialcore: SpatialCoreRewards = dataclasses.field(default_factory=SpatialCoreRewards)
    prosr: ProSRRewards = dataclasses.field(default_factory=ProSRRewards)


@dataclasses.dataclass(frozen=True)
class JaxConfig:
    """compile_cache: the persistent compilation cache's folder ("" for none)."""

    compile_cache: str = ""


@dataclasses.dataclass(frozen=True)
class TrainConfig:  # undocumented: dataclasses invent a signature for its __doc__
    run_dir: str = "runs/tiny_random"
    seed: int = 0
    bucket_lengths: tuple[int, ...] = (512, 1024)
    checkpoint: str | None = None
    train: str = "mix:3*synthetic:train:400|1*synthetic:heldout:100"
    out: Path = Path("runs")
    rl: RLConfig = dataclasses.field(default_factory=RLConfig)
    rewards: RewardsConfig = dataclasses.field(default_factory=RewardsConfig)
    JAX: JaxConfig = dataclasses.field(default_factory=JaxConfig)  # a name ending in X: only the dot is cut off


TABLES = [
    ("", TrainConfig, [("run_dir", "str", '`"runs/tiny_random"`'), ("seed", "int", "`0`"),
                       ("bucket_lengths", "tuple[int, ...]", "`[512, 1024]`"), ("checkpoint", "str \\| None", "`null`"),
                       ("train", "str", '`"mix:3*synthetic:train:400\\|1*synthetic:heldout:100"`'),
                       ("out", "Path", "`PosixPath('runs')`")]),
    ("rl", RLConfig, [("rl.steps", "int", "`200`")]),
    ("rl.loss", LossConfig, [("rl.loss.kind", '"grpo" \\| "gspo"', '`"grpo"`'), ("rl.loss.clip_low", "float", "`0.2`"),
                             ("rl.loss.clip_high", "float", "`0.28`")]),
    ("rewards", RewardsConfig, []),
    ("rewards.spatialcore", SpatialCoreRewards, [("rewards.spatialcore.format_weight", "float", "`0.1`")]),
    ("rewards.prosr", ProSRRewards, [("rewards.prosr.format_weight", "float", "`0.1`")]),
    ("JAX", JaxConfig, [("JAX.compile_cache", "str", '`""`')]),
]

CONFIG_PAGE = f"""# Config reference

Every key of a job's config (`TrainConfig`, `spatial_jax/rl/config.py`), generated from the typed dataclasses when \
this site is built. Set a key in a TOML file's table (`[rl.loss]` then `kind = "gspo"`) or on the command line as \
`key=value` (`rl.loss.kind=gspo`); an unknown key, a wrong type or a value out of range is refused before anything \
compiles, naming the key. Each table's text is its dataclass's docstring.

## Top level

`{__name__}.TrainConfig`

| key | type | default |
|---|---|---|
| `run_dir` | str | `"runs/tiny_random"` |
| `seed` | int | `0` |
| `bucket_lengths` | tuple[int, ...] | `[512, 1024]` |
| `checkpoint` | str \\| None | `null` |
| `train` | str | `"mix:3*synthetic:train:400\\|1*synthetic:heldout:100"` |
| `out` | Path | `PosixPath('runs')` |

## `rl`

`{__name__}.RLConfig`

```text
steps: optimiser steps of the RL stage.
(an indented second line, as docstrings are written)
```

| key | type | default |
|---|---|---|
| `rl.steps` | int | `200` |

## `rl.loss`

`{__name__}.LossConfig`

```text
kind: the policy-gradient objective; clip_low / clip_high: the ratio's clip range.
```

| key | type | default |
|---|---|---|
| `rl.loss.kind` | "grpo" \\| "gspo" | `"grpo"` |
| `rl.loss.clip_low` | float | `0.2` |
| `rl.loss.clip_high` | float | `0.28` |

## `rewards`

`{__name__}.RewardsConfig`

```text
One table per registered method.
```

## `rewards.spatialcore`

`{__name__}.SpatialCoreRewards`

```text
format_weight: the reward's weight on a well-formed answer.
```

| key | type | default |
|---|---|---|
| `rewards.spatialcore.format_weight` | float | `0.1` |

## `rewards.prosr`

`{__name__}.ProSRRewards`

| key | type | default |
|---|---|---|
| `rewards.prosr.format_weight` | float | `0.1` |

## `JAX`

`{__name__}.JaxConfig`

```text
compile_cache: the persistent compilation cache's folder ("" for none).
```

| key | type | default |
|---|---|---|
| `JAX.compile_cache` | str | `""` |
"""


@pytest.fixture
def small_config(monkeypatch):
    monkeypatch.setattr(spatial_jax.rl.config, "TrainConfig", TrainConfig)


def test_config_tables_walk_nested_tables_in_field_order(small_config):
    assert docs_gen.config_tables() == TABLES
    assert docs_gen.config_keys() == ["run_dir", "seed", "bucket_lengths", "checkpoint", "train", "out", "rl.steps",
                                      "rl.loss.kind", "rl.loss.clip_low", "rl.loss.clip_high",
                                      "rewards.spatialcore.format_weight", "rewards.prosr.format_weight",
                                      "JAX.compile_cache"]


def test_config_reference_pinned(small_config):
    """A table's docstring in a text block (an invented signature, or none, is left out), a key-less table its
    heading alone."""
    assert docs_gen.config_reference() == CONFIG_PAGE


def test_the_real_config_documents_its_tables():
    tables = docs_gen.config_tables()
    assert [t[0] for t in tables[:3]] == ["", "policy", "policy.lora"]
    assert tables[0][1] is spatial_jax.rl.config.TrainConfig
    assert ("seed", "int", "`0`") in tables[0][2]


@pytest.mark.parametrize("value,text", [
    ((256, 512), "`[256, 512]`"), ("", '`""`'), (None, "`null`"), (True, "`true`"), (5e-4, "`0.0005`"),
    ("a|b", '`"a\\|b"`'), (Path("configs/tiny_cpu.toml"), "`PosixPath('configs/tiny_cpu.toml')`"),
    ({"spatialcore": 1.0}, '`{"spatialcore": 1.0}`')])
def test_fmt_default(value, text):
    assert docs_gen._fmt_default(value) == text


def test_fmt_type():
    from typing import Optional

    assert docs_gen._fmt_type(Literal["fail", "skip"]) == '"fail" \\| "skip"'
    assert docs_gen._fmt_type(Literal[0, 1]) == "0 \\| 1"
    assert docs_gen._fmt_type(float) == "float"
    assert docs_gen._fmt_type(Optional[int]) == "Optional[int]"  # noqa: UP045 (typing's spelling, as older code has)
    assert docs_gen._fmt_type(int | None) == "int \\| None"
    assert docs_gen._fmt_type(dict[str, float]) == "dict[str, float]"


# --- the CLI reference ----------------------------------------------------------------------------------------------

LONG = ("read every row and picture of a data source as training reads them; count them by kind and category and "
        "list the failing rows by file, row and field")


def _parser() -> argparse.ArgumentParser:
    """spatial-jax's shape: subcommands, one ("data") with subcommands of its own."""
    top = argparse.ArgumentParser(prog="spatial-jax", description="the top level (not a page of its own)")
    sub = top.add_subparsers(dest="command", required=True)
    score = sub.add_parser("score", help="score predictions", description="score predictions")
    score.add_argument("--predictions", metavar="PATH", help="a JSONL file of predictions")
    data = sub.add_parser("data", help="a dataset", description="a dataset as training reads it")
    actions = data.add_subparsers(dest="action", required=True)
    check = actions.add_parser("check", description=LONG)
    check.add_argument("spec")
    return top


HELPS = {
    "spatial-jax score": "usage: spatial-jax score [-h] [--predictions PATH]\n\nscore predictions\n\noptions:\n"
                         "  -h, --help          show this help message and exit\n"
                         "  --predictions PATH  a JSONL file of predictions\n",
    "spatial-jax data": "usage: spatial-jax data [-h] {check} ...\n\na dataset as training reads it\n\n"
                        "positional arguments:\n  {check}\n\noptions:\n  -h, --help  show this help message and exit\n",
    # wrapped at 100 columns less argparse's margin of 2, whatever the terminal
    "spatial-jax data check": "usage: spatial-jax data check [-h] spec\n\nread every row and picture of a data source "
                              "as training reads them; count them by kind and\ncategory and list the failing rows by "
                              "file, row and field\n\npositional arguments:\n  spec\n\noptions:\n"
                              "  -h, --help  show this help message and exit\n",
}


@pytest.fixture
def small_parser(monkeypatch):
    monkeypatch.setattr(spatial_jax.cli, "build_parser", _parser)


@pytest.mark.parametrize("columns", [None, "37"])
def test_cli_helps_at_a_fixed_width_and_columns_restored(small_parser, monkeypatch, columns):
    """The width is the page's, not the building terminal's; $COLUMNS is left as found, set or not."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    import os

    assert docs_gen.cli_helps() == HELPS
    assert os.environ.get("COLUMNS") == columns


def test_cli_reference_pinned(small_parser):
    assert docs_gen.cli_reference() == (
        "# CLI reference\n\nEvery command's `--help`, generated from the parser when this site is built. What each "
        "command is for: [Commands](../commands.md).\n\n"
        + "\n\n".join(f"## `{prog}`\n\n```text\n{text.rstrip()}\n```" for prog, text in HELPS.items()) + "\n")


def test_the_real_cli_has_every_nested_help():
    helps = docs_gen.cli_helps()
    assert helps["spatial-jax data show"].startswith("usage: spatial-jax data show [-h]")
    assert helps["spatial-jax data check"].startswith("usage: spatial-jax data check [-h]")


# --- the results pages ----------------------------------------------------------------------------------------------

PREAMBLE = "# Results\n\nEvery measurement of the project, newest last; each section names its command.\n\n"
# a heading per topic pattern's first and last alternative (headings as RESULTS.md writes them)
SECTIONS = {
    "papers": ["## SpatialCORE's Table 3 in miniature (`benchmarks/papers/learning.py`)\n\nrows\n\n### Seeds\n\nmore\n",
               "## Benchmark evaluation against plain evaluation after the main job (issue 31)\n\nrows\n"],
    "scaling": ["## `spatial-jax plan`: the recipes on their targets\n\nplans\n"],
    "kernels": ["## Fused log-prob / entropy kernels, JAX on CPU\n\ntimes\n", "## Rewards on a batch of 512\n\nus\n"],
    "rollouts": ["## Sampler (`benchmarks/training/sampler.py`)\n\ntokens/s\n",
                 "## The rollout-trainer gap in bfloat16 (issue 45)\n\ngap\n"],
    "data": ["## Streaming a published copy (issue 42)\n\nrows/s\n"],
    # the body names the Sampler and Table 3: only the heading decides the page
    "training": ["## The README main job (`spatial-jax train`)\n\nreward as in Table 3; the Sampler's batches\n",
                 "## One GRPO step against TRL 1.16's GRPOTrainer on the same work\n\n| table |\n"],
    "other": ["## A measurement no topic names\n\nx\n"],
}
INTRO = "Every measurement of the project, newest last; each section names its command."
TITLES = {"papers": "The papers' claims in miniature", "scaling": "Scaling: the recipes on their targets",
          "kernels": "Kernels, scorers and GPU runs", "rollouts": "Rollouts and sampling", "data": "Data",
          "training": "Training: the main job, its base, the update and the tools", "other": "Other measurements"}


def _page(topic: str, body: list[str]) -> str:
    return (f"# Results: {TITLES[topic]}\n\nSections of `benchmarks/RESULTS.md`, the project's one results file, as "
            f"written there. {INTRO}\n\n" + "\n\n".join(s.rstrip() for s in body) + "\n")


def _results_text() -> str:
    # interleaved, so that each page keeps the file's order and not the topics'
    order = ["training", "papers", "kernels", "rollouts", "other", "scaling", "data", "papers", "kernels", "rollouts",
             "training"]
    taken = {topic: iter(found) for topic, found in SECTIONS.items()}
    return PREAMBLE + "".join(next(taken[topic]) for topic in order)


def test_results_pages_pinned():
    pages = docs_gen.results_pages(_results_text())
    assert pages == {f"results/{topic}.md": _page(topic, found) for topic, found in SECTIONS.items()}


def test_a_page_no_section_falls_on_says_so():
    pages = docs_gen.results_pages(PREAMBLE + SECTIONS["data"][0])
    empty = ["No section of `benchmarks/RESULTS.md` falls here at present."]
    assert pages == {f"results/{t}.md": _page(t, SECTIONS["data"] if t == "data" else empty) for t in TITLES}


class _Results:
    """RESULTS.md read on a host whose locale encoding is not UTF-8: only the encoding asked for decodes it."""

    def __init__(self, text: str):
        self.data = text.encode("utf-8")

    def read_text(self, encoding=None):
        return self.data.decode(encoding or "latin-1")


def test_results_md_is_read_as_utf8(monkeypatch):
    section = "## Rewards: 1.3 µs per completion\n\nµs"
    monkeypatch.setattr(docs_gen, "RESULTS", _Results(PREAMBLE + section + "\n"))
    assert docs_gen.results_pages()["results/kernels.md"] == _page("kernels", [section])


# --- every page, and the mkdocs hook --------------------------------------------------------------------------------

def test_generated_pages_and_the_hook(small_config, small_parser, monkeypatch, tmp_path):
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files

    monkeypatch.setattr(docs_gen, "RESULTS", _Results(_results_text()))
    pages = docs_gen.generated_pages()
    results = {f"results/{topic}.md": _page(topic, found) for topic, found in SECTIONS.items()}
    assert pages == {"reference/config.md": CONFIG_PAGE, "reference/cli.md": docs_gen.cli_reference(), **results}
    assert list(pages)[:2] == ["reference/config.md", "reference/cli.md"]

    config = MkDocsConfig()
    config.load_dict({"site_name": "spatial-jax", "docs_dir": str(tmp_path / "docs"), "site_dir": str(tmp_path / "s")})
    (tmp_path / "docs").mkdir()
    config.validate()
    config.plugins._current_plugin = "docs_gen"  # what mkdocs sets while it runs a hook's event
    files = docs_gen.on_files(Files([]), config)
    assert {f.src_uri: f.content_string for f in files} == pages
    assert {f.generated_by for f in files} == {"docs_gen"}
