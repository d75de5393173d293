"""How often a policy calls AlloSpatial's tools in its held-out rollouts, read from a run's own evaluation.

The job's evaluation after a stage (`<run_dir>/eval_<stage>.json`) holds one greedy multi-turn rollout per held-out
sample, run with the live tools (rl.max_tool_turns > 0). This counts, over those rollouts: any `<tool_call>`, a
valid one (the harness parser's schema check), one the tool answered without an error, a view answered with a
picture (its image tokens in the response), and the gated answer accuracy.

    python benchmarks/papers/tool_use.py runs/<run> [--stage sft]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spatial_jax.rewards import parse_harness as ph


def answered_without_error(responses: list[str]) -> bool:
    """Whether any of a rollout's tool responses (their text, `<tool_response>` included) is an answer, not an
    "Error: ..." text."""
    return any(not r.removeprefix("<tool_response>").lstrip().startswith("Error:") for r in responses)


def tool_use(rows: list[dict]) -> dict[str, float]:
    """Shares of rollouts (and their count) with a call, a valid call, an answered call, a picture."""
    n = len(rows)
    if n == 0:
        raise ValueError("the evaluation holds no rollout")
    called = valid = answered = pictured = 0
    for row in rows:
        text = row["completion"]
        calls = ph.parse(text).tool_calls
        responses = [text[s:e] for s, e in ph.response_spans(text)]
        called += bool(calls)
        valid += any(c.valid for c in calls)
        answered += answered_without_error(responses)
        pictured += any("<|image_pad|>" in r for r in responses)
    return {"rollouts": n, "tool_call": called / n, "valid_call": valid / n, "answered_without_error": answered / n,
            "view_with_picture": pictured / n, "accuracy": sum(float(r["accuracy"]) for r in rows) / n}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--stage", default="sft", choices=("sft", "rl"))
    args = parser.parse_args(argv)
    path = Path(args.run_dir) / f"eval_{args.stage}.json"
    if not path.is_file():
        print(f"tool_use: {path} is missing (run the job with eval.after_{args.stage} = true)", file=sys.stderr)
        return 2
    print(json.dumps(tool_use(json.loads(path.read_text())["rows"]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
