"""`spatial-jax filter-sft`: ProSR's SFT data filters (A.3) on each sample's reference completion.

A sample stays when its reference (Sample.reference[--method-key]) has the correct answer, few reconsideration
markers, enough spatial anchors, a sensible length and no repetition (`spatial_jax/data/sft_filters.py` gives the
thresholds and why; override them as key=value, e.g. `min_anchor_ratio=0.05`). The answer is judged by the reward
of the method whose output format writes that reference key. The report (JSON: removed per filter, a sample failing
several counted under each, and the total kept) goes to stdout, or to `--report`.
Exit status: 0 once written, 1 for an unreadable input or an unwritable output, 2 for a bad key or threshold.
"""

from __future__ import annotations

import argparse
import os

from spatial_jax.cli.outputs import check_output_files, print_report
from spatial_jax.data.prompts import THINK_BOXES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="data source with reference completions (JSONL or FORMAT:PATH)")
    parser.add_argument("--output", required=True, help="JSONL of the samples that pass every filter")
    parser.add_argument("--method-key", default=THINK_BOXES.reference_key,
                        help=f"key of Sample.reference to filter (default {THINK_BOXES.reference_key})")
    parser.add_argument("--report", default=None, help="write the JSON report here instead of stdout")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="filter thresholds, e.g. max_words=300")


def accuracy_judge(reference_key: str):
    """(samples, completions) -> accuracies, from the reward of the first registered method whose prompt format
    writes `reference_key`; ConfigError when none does."""
    from spatial_jax.config import ConfigError
    from spatial_jax.methods import METHODS

    methods = [m for m in METHODS.values() if m.prompt.reference_key == reference_key]
    if not methods:
        known = sorted({m.prompt.reference_key for m in METHODS.values()})
        raise ConfigError(f"no method writes reference key {reference_key!r}; known keys: {known}")
    method = methods[0]
    cfg = method.config()

    def judge(samples, completions):
        components = method.score_batch([s.to_rollout(c) for s, c in zip(samples, completions)], cfg)
        return [float(c[method.accuracy_key]) for c in components]

    return judge


def run(args: argparse.Namespace) -> int:
    from spatial_jax.config import apply_overrides
    from spatial_jax.data.jsonl import write_jsonl
    from spatial_jax.data.pipeline import open_source
    from spatial_jax.data.pseudo_gt import relocate
    from spatial_jax.data.sft_filters import SFTFilterConfig, filter_samples
    from spatial_jax.data.sources import refuse_writing_into_copies, spec_paths

    cfg = apply_overrides(SFTFilterConfig(reference_key=args.method_key), args.overrides)
    check_output_files({"--output": args.output, "--report": args.report}, spec_paths(args.input))
    refuse_writing_into_copies({"--output": args.output, "--report": args.report}, args.input)
    judge = accuracy_judge(cfg.reference_key)
    kept, report = filter_samples(list(open_source(args.input, check_images=False)), judge, cfg)
    out_dir = os.path.dirname(os.path.abspath(args.output))
    write_jsonl([relocate(s, out_dir) for s in kept], args.output)
    print_report(report, args.report, f"kept {report['kept']} of {report['samples']} samples -> {args.output}")
    return 0
