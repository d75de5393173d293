"""What the dataset and scoring commands share about their outputs: never the input, written before any work is
lost, and a JSON report to a file or to stdout."""

from __future__ import annotations

import json
import os
from typing import Any

from spatial_jax.config import ConfigError


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def refuse_overwriting_input(output: str, input_: str) -> None:
    """ConfigError (rc 2) when --output names the input, through a symlink too."""
    if same_file(output, input_):
        raise ConfigError(f"--output {output} would overwrite its input")


def print_report(report: dict[str, Any], path: str | None, summary: str) -> None:
    """The JSON report to `path` (and a one-line summary to stdout), or the report itself to stdout."""
    text = json.dumps(report, indent=1)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        print(f"{summary} (report: {path})")
    else:
        print(text)
