"""The documentation site's generated pages, written when `mkdocs build` runs (mkdocs.yml names this file a hook).

Three kinds of page are made from their sources, so none can drift from them:
- reference/config.md: every key of TrainConfig, walked from the typed dataclasses (a new field appears with no page
  edited), each table with its dataclass's docstring;
- reference/cli.md: every subcommand's `--help`, as argparse prints it;
- results/*.md: benchmarks/RESULTS.md (the one results file) cut at its `## ` sections and grouped by topic; a section
  no topic claims lands on results/other.md, so nothing written there is left out.
tests/test_docs.py checks the first two against the config and the parser without building the site.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
HELP_WIDTH = "100"  # argparse wraps to $COLUMNS; fixed, so the page does not depend on the building terminal

# results page -> (title, pattern its sections' headings match); the first match wins, in this order
RESULT_TOPICS = {
    "results/papers.md": ("The papers' claims in miniature",
                          r"Table \d|ProSR|SpatialThinker|AlloSpatial|Benchmark evaluation"),
    "results/scaling.md": ("Scaling: the recipes on their targets", r"spatial-jax plan"),
    "results/kernels.md": ("Kernels, scorers and GPU runs", r"kernel|Pallas|Splash|H200|Rewards"),
    "results/rollouts.md": ("Rollouts and sampling", r"Sampler|one step off|rollout-trainer gap"),
    "results/data.md": ("Data", r"Streaming"),
    "results/training.md": ("Training: the main job, its base, the update and the tools",
                            r"main job|CI|Shared-prefix|Compile time|export|Qwen2\.5|Mutation|TRL"),
}
RESULT_OTHER = "results/other.md"


def _fmt_type(tp) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in typing.get_args(tp))
    name = tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")
    return name.replace("|", "\\|")


def _fmt_default(value) -> str:
    if isinstance(value, tuple):
        value = list(value)
    try:
        text = json.dumps(value)
    except TypeError:
        text = repr(value)
    return "`" + text.replace("|", "\\|") + "`"


def config_tables() -> list[tuple[str, type, list[tuple[str, str, str]]]]:
    """(dotted prefix, dataclass, [(key, type, default)]) for TrainConfig and every table nested in it, in field
    order; a field whose default is a dataclass is a table (the `rewards` table is typed per registered method)."""
    from spatial_jax.rl.config import TrainConfig

    out = []

    def walk(prefix: str, cfg) -> None:
        cls = type(cfg)
        hints = typing.get_type_hints(cls)
        rows, nested = [], []
        for f in dataclasses.fields(cls):
            value = getattr(cfg, f.name)
            if dataclasses.is_dataclass(value):
                nested.append((f.name, value))
            else:
                rows.append((prefix + f.name, _fmt_type(hints[f.name]), _fmt_default(value)))
        out.append((prefix.rstrip("."), cls, rows))
        for name, value in nested:
            walk(f"{prefix}{name}.", value)

    walk("", TrainConfig())
    return out


def config_keys() -> list[str]:
    return [key for _, _, rows in config_tables() for key, _, _ in rows]


def config_reference() -> str:
    parts = [
        "# Config reference",
        "Every key of a job's config (`TrainConfig`, `spatial_jax/rl/config.py`), generated from the typed dataclasses "
        "when this site is built. Set a key in a TOML file's table (`[rl.loss]` then `kind = \"gspo\"`) or on the "
        "command line as `key=value` (`rl.loss.kind=gspo`); an unknown key, a wrong type or a value out of range is "
        "refused before anything compiles, naming the key. Each table's text is its dataclass's docstring.",
    ]
    for prefix, cls, rows in config_tables():
        parts.append(f"## `{prefix}`" if prefix else "## Top level")
        doc = inspect.cleandoc(cls.__doc__ or "")
        if doc and not doc.startswith(cls.__name__ + "("):  # dataclasses invent a signature for undocumented ones
            parts.append(f"`{cls.__module__}.{cls.__name__}`\n\n```text\n{doc}\n```")
        else:
            parts.append(f"`{cls.__module__}.{cls.__name__}`")
        if rows:
            table = ["| key | type | default |", "|---|---|---|"]
            table += [f"| `{key}` | {tp} | {default} |" for key, tp, default in rows]
            parts.append("\n".join(table))
    return "\n\n".join(parts) + "\n"


def cli_helps() -> dict[str, str]:
    """`spatial-jax NAME` (and `spatial-jax data show` ...) -> its --help text."""
    import argparse

    from spatial_jax.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        out = {}

        def collect(prog: str, parser: argparse.ArgumentParser) -> None:
            out[prog] = parser.format_help()
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    for name, sub in action.choices.items():
                        collect(f"{prog} {name}", sub)

        top = build_parser()
        for action in top._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    collect(f"spatial-jax {name}", sub)
        return out
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def cli_reference() -> str:
    parts = ["# CLI reference",
             "Every command's `--help`, generated from the parser when this site is built. What each command is "
             "for: [Commands](../commands.md)."]
    for prog, text in cli_helps().items():
        parts.append(f"## `{prog}`\n\n```text\n{text.rstrip()}\n```")
    return "\n\n".join(parts) + "\n"


def results_pages(text: str | None = None) -> dict[str, str]:
    """RESULTS.md's `## ` sections, each on its topic's page in the file's order (the text as written)."""
    text = RESULTS.read_text(encoding="utf-8") if text is None else text
    chunks = re.split(r"(?m)^(?=## )", text)
    preamble, sections = chunks[0], chunks[1:]
    grouped: dict[str, list[str]] = {page: [] for page in [*RESULT_TOPICS, RESULT_OTHER]}
    for section in sections:
        heading = section.split("\n", 1)[0]
        page = next((p for p, (_, pat) in RESULT_TOPICS.items() if re.search(pat, heading)), RESULT_OTHER)
        grouped[page].append(section.rstrip())
    intro = re.sub(r"(?m)^# .*\n", "", preamble).strip()
    pages = {}
    for page, found in grouped.items():
        title = RESULT_TOPICS[page][0] if page in RESULT_TOPICS else "Other measurements"
        body = found or ["No section of `benchmarks/RESULTS.md` falls here at present."]
        head = (f"# Results: {title}\n\nSections of `benchmarks/RESULTS.md`, the project's one results file, as "
                f"written there. {intro}")
        pages[page] = "\n\n".join([head, *body]) + "\n"
    return pages


def generated_pages() -> dict[str, str]:
    return {"reference/config.md": config_reference(), "reference/cli.md": cli_reference(), **results_pages()}


def on_files(files, config):
    """mkdocs hook: the generated pages join the site's files before the nav is built."""
    from mkdocs.structure.files import File

    for src_uri, content in generated_pages().items():
        files.append(File.generated(config, src_uri, content=content))
    return files
