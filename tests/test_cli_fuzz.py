"""A fuzz of the whole `spatial-jax` surface (issue 36): for each command, Hypothesis (fixed draws, 40 runs) picks
flags from the command's own parser (required ones nearly always, the others at random) with values from pools of
paths (missing, a folder, /dev/null, an input named again as an output, files of random bytes, of random JSON
lines, of valid rows, a benchmark copy, a predictions file, configs of random and of valid text), numbers and
words, plus key=value overrides, and runs it in-process.

Every run ends with status 0, 1 or 2 and, when not 0, its last line is `spatial-jax <command>: ...` (argparse's
usage errors end the same way); no exception escapes. A job whose checks all pass stops where it would build the
policy (or, for `plan`, compile or estimate), and `pseudo-gt` where it would load the detector: no run compiles, so
the fuzz takes seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import traceback
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st
from test_bench_loaders import write_copy

import spatial_jax.data.pseudo_gt
import spatial_jax.rl.plan
import spatial_jax.rl.plan.gpu
import spatial_jax.rl.workspace
from spatial_jax.cli import COMMANDS, build_parser, main
from spatial_jax.data import synthetic
from spatial_jax.data.jsonl import write_jsonl

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = 40  # per command

# the settings most likely to matter, each with values in and out of range; and keys that are no setting
KEYS = ["seed", "run_dir", "method", "data.train", "data.eval", "data.sft_train", "data.max_image_pixels",
        "data.bucket_lengths", "sft.steps", "sft.batch_size", "rl.steps", "rl.group_size", "rl.prompts_per_step",
        "mesh.fsdp", "mesh.data", "policy.checkpoint", "policy.min_pixels", "eval.max_samples", "grid", "anchor",
        "mirror_rate", "width", "min_objects", "threshold", "max_words", "rewards.spatialcore.beta",
        "rewards.prosr.lam", "nonsense", "rl.loss.kind", ""]
NUMBERS = ["1", "-1", "0", "2", "0.3", "0.5", "nan", "inf", "1e309", "99999999999999999999"]
WORDS = NUMBERS + ["x", "", "true", "[]", "[1, 2]", '["green"]', "{", "spatialcore", "gspo", "synthetic:train:2",
                   "synthetic:heldout:x", "synthetic:", "rows.jsonl", "missing.jsonl", ".", "\u2028", "a" * 300]
# what a flag is given, by its dest: files below the example's folder (made by _files), absolute paths, words
PATHS = {
    "input": ["rows.jsonl", "lines.jsonl", "bytes.bin", "missing.jsonl", ".", "/dev/null"],
    "data": ["copy", "rows.jsonl", "lines.jsonl", "missing", ".", "synthetic:heldout:2"],
    "predictions": ["preds.json", "lines.jsonl", "bytes.bin", "missing.json", ".", "rows.jsonl"],
    "config": ["job.toml", "config.toml", str(ROOT / "configs" / "tiny_cpu.toml"), "missing.toml", "bytes.bin", "."],
    "run_dir": ["run", ".", "missing", "rows.jsonl"],
    "detector": ["missing", ".", "run"],
}
ELSEWHERE = [".", "rows.jsonl", "missing/deeper/out.json", "/dev/null", "run", "copy", "preds.md"]
OUTPUTS = {"output": ["out.jsonl", *ELSEWHERE], "report": ["report.json", "out.jsonl", *ELSEWHERE],
           "json": ["plan.json", *ELSEWHERE], "out": ["export", *ELSEWHERE]}
NAMES = {
    "method": ["spatialcore", "prosr", "spatialthinker", "allospatial", "nope"],
    "benchmark": ["embspatial", "cvbench", "nope"],
    "protocol": ["spatialcore", "nope"],
    "topology": ["cpu:1", "cpu:0", "cpu:x", "gpu:h100x8", "gpu:x", "v5p:2x2x1", "v5p:3x3x7", "v9z:1"],
    "variant": ["official", "nope"],
    "backend": ["default", "torch", "nope"],
    "method_key": ["spatialcore", "nope"],
    "extractor_url": ["http://127.0.0.1:9", "not a url"],
    "image_size": ["64", "64x48", "1", "100000", "x"],
    "displace_iou": ["0.5", "0", "1", "nan"],
    "question_types": ["relative_position", "size,counting", "nope", ""],
    "min_objects": ["2", "1", "4", "99"],
    "max_objects": ["4", "2", "99"],
}
# gen-data's counts, always given: it would otherwise draw the job's (4,000 questions) or its default 1,200
SMALL = ["1", "0", "2", "-1"]
# flags most runs give: without them a command mostly stops at its first check
OFTEN = {"num_train", "num_eval", "data", "benchmark", "predictions", "input", "output"}


class Reached(Exception):
    """Every check passed: the command would now build the policy, compile or load the detector."""


def _stop(*args, **kwargs):
    raise Reached


@pytest.fixture
def stopped(monkeypatch, tmp_path):
    for module, name in [(spatial_jax.rl.workspace, "build_policy"), (spatial_jax.rl.plan, "programs"),
                         (spatial_jax.rl.plan.gpu, "estimate_gpu"), (spatial_jax.data.pseudo_gt, "ZeroShotDetector")]:
        monkeypatch.setattr(module, name, _stop)
    monkeypatch.chdir(tmp_path)  # relative defaults (runs/..., checkpoints/...) land here
    return tmp_path


def _files(folder: Path, raw: bytes, lines: list) -> None:
    """The example's inputs: random bytes, random JSON lines, valid rows with their images, a benchmark copy and
    predictions for it, a config of random text and a valid one, a run directory without checkpoints."""
    (folder / "bytes.bin").write_bytes(raw)
    (folder / "lines.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    write_jsonl(synthetic.generate(synthetic.SyntheticConfig(width=32, height=32, min_objects=2, max_objects=2),
                                   "heldout", 2), folder / "rows.jsonl", folder / "images")
    write_copy("embspatial", folder / "copy")
    (folder / "preds.json").write_text(json.dumps({"mp3d_0": "B", "ai2thor_1": "A"}))
    (folder / "config.toml").write_text(raw.decode("utf-8", "replace").replace("\x00", ""), encoding="utf-8")
    (folder / "job.toml").write_text(f'run_dir = "{folder / "jobrun"}"\n[data]\ntrain = "synthetic:train:2"\n'
                                     'eval = "synthetic:heldout:2"\n[sft]\nsteps = 1\n')
    (folder / "run").mkdir()
    (folder / "run" / "config.json").write_text(json.dumps({"run_dir": str(folder / "run")}))


def _resolve(word: str, folder: Path) -> str:
    """Names of the example's files are paths below its folder."""
    names = {name for pool in [*PATHS.values(), *OUTPUTS.values()] for name in pool}
    return str(folder / word) if word in names and word and not word.startswith(("/", "synthetic:")) else word


def _pick(data, pool: list[str], folder: Path) -> str:
    """Half the time the pool's first (a value that works), else any of the pool, sometimes any word."""
    roll = data.draw(st.floats(0, 1))
    word = pool[0] if roll < 0.5 else data.draw(st.sampled_from(pool if roll < 0.9 else WORDS))
    return _resolve(word, folder)


def _value(data, action: argparse.Action, folder: Path) -> list[str]:
    if action.nargs == 0:
        return []
    if action.dest in ("num_train", "num_eval"):
        return [data.draw(st.sampled_from(SMALL))]
    if action.choices:
        return [_pick(data, [str(c) for c in action.choices], folder)]
    pool = PATHS.get(action.dest) or NAMES.get(action.dest) or OUTPUTS.get(action.dest)
    if pool is None:
        pool = NUMBERS if action.type in (int, float) else WORDS
    return [_pick(data, pool, folder)]


def _argv(data, command: str, folder: Path) -> list[str]:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    argv = [command]
    for action in sub._actions:
        if not action.option_strings or action.dest == "help":
            continue
        wanted = 0.95 if action.required or action.dest in OFTEN else 0.3
        if action.dest in ("num_train", "num_eval") or data.draw(st.floats(0, 1)) < wanted:
            argv += [data.draw(st.sampled_from(action.option_strings)), *_value(data, action, folder)]
    if any(a.dest == "overrides" for a in sub._actions):
        for _ in range(data.draw(st.integers(0, 3))):
            argv.append(f"{data.draw(st.sampled_from(KEYS))}={_pick(data, WORDS, folder)}")
    return argv


@pytest.mark.parametrize("command", sorted(COMMANDS))
# no shrinking (minutes of reruns): each assertion names the argv that failed
@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, verbosity=Verbosity.quiet,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), raw=st.binary(max_size=300),
       lines=st.lists(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                                   lambda inner: st.lists(inner, max_size=3)
                                   | st.dictionaries(st.sampled_from(["id", "question", "image", "answer",
                                                                     "options", "gt_boxes", "completion"]), inner,
                                                     max_size=4), max_leaves=8), max_size=4))
def test_no_command_ends_in_a_traceback(stopped, data, command, raw, lines):
    folder = Path(tempfile.mkdtemp(dir=stopped))
    _files(folder, raw, lines)
    argv = _argv(data, command, folder)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: a usage error
            code = e.code
        except Reached:
            code = 0
        except Exception:
            pytest.fail(f"spatial-jax {' '.join(argv)} raised:\n{traceback.format_exc()}")
    text = err.getvalue()
    assert "Traceback" not in text, (argv, text)
    assert code in (0, 1, 2), (argv, code, text)
    if code:
        last = [line for line in text.splitlines() if line.strip()][-1]
        assert last.startswith(f"spatial-jax {command}: "), (argv, text)
