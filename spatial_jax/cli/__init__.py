"""The `spatial-jax` command: one thin module per subcommand in this package, each over library functions
(what the user reads is DESCRIPTION; this paragraph is for the code's readers).

An error the project anticipates (a bad setting, dataset or rollout record, an unreadable checkpoint, a file-system
failure such as a full disk, SIGINT or SIGTERM) reaches the user as one line, `spatial-jax <command>: <message>`, and
a non-zero status: 2 for a configuration error, 128 + the signal's number for a signal, 1 for the others. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable

from spatial_jax import compile_cache
from spatial_jax.config import ConfigError
from spatial_jax.data.sample import DatasetError
from spatial_jax.interrupts import Interrupted, raising
from spatial_jax.records import RecordError

# subcommand -> (module, help); each module exposes add_arguments(parser) and run(args) -> int.
COMMANDS = {
    "score": ("spatial_jax.cli.score", "score rollouts from a JSONL file with a method's reward"),
    "gen-data": ("spatial_jax.cli.gen_data", "write the synthetic spatial world to JSONL + PNG files"),
    "sft": ("spatial_jax.cli.sft", "supervised cold start (completion-only cross-entropy)"),
    "pretrain": ("spatial_jax.cli.pretrain", "pre-train the tiny base on the synthetic world (a HF checkpoint)"),
    "train": ("spatial_jax.cli.train", "RL post-training (GRPO / GSPO) with a method's reward"),
    "eval": ("spatial_jax.cli.eval", "evaluate a checkpoint on a JSONL dataset"),
    "export": ("spatial_jax.cli.export", "write a run's newest checkpoint as a Hugging Face checkpoint (LoRA merged)"),
    "pseudo-gt": ("spatial_jax.cli.pseudo_gt", "fill pseudo-GT boxes from a local zero-shot detector (A.3)"),
    "corrupt": ("spatial_jax.cli.corrupt", "corrupt a share of a dataset's pseudo-GT boxes (A.3 robustness test)"),
    "filter-sft": ("spatial_jax.cli.filter_sft", "keep samples whose reference completion passes ProSR's filters"),
    "plan": ("spatial_jax.cli.plan", "memory per chip of a recipe's programs, compiled for a TPU slice"),
    "data": ("spatial_jax.cli.data", "show or check a data source as training reads it (data show / data check)"),
    "to-cvbench": ("spatial_jax.cli.to_cvbench", "write a dataset's multiple-choice questions as a CV-Bench copy"),
}


DESCRIPTION = """\
Post-train Qwen-VL policies to reason about space with reinforcement learning whose rewards check where the model
looked (boxes, scene graphs, tool calls), not only what it answered: SpatialCORE, ProSR, SpatialThinker and
AlloSpatial on JAX, from the datasets and layouts you already have.

The main job, on the embedded default (a tiny model, synthetic data, CPU):  spatial-jax train
A recipe, with key=value overrides:  spatial-jax train --config configs/spatialcore_4b.toml rl.steps=10
Each command's own options:  spatial-jax COMMAND --help"""

# the commands that compile programs, and so open the persistent compilation cache (spatial_jax/compile_cache.py)
COMPILING = ("sft", "pretrain", "train", "eval", "export", "plan")


def _description() -> str:
    """DESCRIPTION and the commands, one line each (argparse's own list wraps the longer names onto two lines)."""
    width = max(map(len, COMMANDS)) + 2
    lines = [f"  {name:<{width}}{help_}" for name, (_, help_) in COMMANDS.items()]
    return DESCRIPTION + "\n\ncommands:\n" + "\n".join(lines)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Imports only the chosen subcommand's module (every one when `only` is None, none when it names no command), so
    `score` never pays for the model code."""
    parser = argparse.ArgumentParser(
        prog="spatial-jax", description=_description(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=version(), help="print the package's and jax's versions")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of the commands above")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, description=help_)
        p.set_defaults(_module=module)
        if only is None or only == name:
            importlib.import_module(module).add_arguments(p)
    return parser


def version() -> str:
    """The package's version and the jax it runs on; read from jax's metadata, so that `--version` never imports
    jax (or pays for its platform probe)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from spatial_jax import __version__

    try:
        jax = installed("jax")
    except PackageNotFoundError:
        jax = "not installed"
    return f"spatial-jax {__version__} (jax {jax})"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def entry() -> None:
    """The `spatial-jax` process: main()'s status as its exit status. A job ended by SIGINT or SIGTERM has already
    waited for its checkpoint and closed its metrics, and printed its one line; it then leaves at once (os._exit,
    standard streams flushed) instead of through the interpreter's teardown, which segfaulted (status 139, no Python
    frame) in 8 of 14 interrupts sent 4-16 s into the main job's RL stage, and in none of 14 paired ones this way."""
    status = main()
    if status in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # with no known command first (--help, --version, a typo) no subcommand module is imported: they need no jax
    chosen = argv[0] if argv and argv[0] in COMMANDS else ""
    args = build_parser(chosen).parse_args(argv)
    if args.command in COMPILING:
        compile_cache.enable()
    return one_line_errors(f"spatial-jax {args.command}", lambda: importlib.import_module(args._module).run(args))


def one_line_errors(prog: str, run: Callable[[], int | None]) -> int:
    """run()'s status, or for an anticipated error one line `<prog>: <message>` on stderr and its status (the
    module doc); the tools' scripts use it too."""
    try:
        with raising():
            return int(run() or 0)
    except Interrupted as e:  # SIGINT or SIGTERM: 128 + its number, as the shell says of a process it ended
        print(f"{prog}: {e}", file=sys.stderr)
        return e.status
    except ConfigError as e:
        print(f"{prog}: configuration error: {_one_line(e)}", file=sys.stderr)
        return 2
    # OSError covers the run directory's files and an unreadable checkpoint (rl.checkpoint.CheckpointError)
    except (DatasetError, RecordError, OSError) as e:
        print(f"{prog}: {_one_line(e)}", file=sys.stderr)
        return 1
