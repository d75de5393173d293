"""`spatial-jax corrupt`: the SpatialCORE A.3 corruption test on a dataset with pseudo-GT boxes.

Exactly round(fraction x boxes) boxes are removed, relabelled with another label of the same sample, or displaced to
IoU < 0.6 with their original; the same seed gives the same output. The report (JSON) goes to stdout, or to
`--report`; each changed sample lists what was done in meta["corruption"].
Exit status: 0 once written, 1 for an unreadable input or an unwritable output, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import os
import sys

from spatial_jax.cli.outputs import check_output_files, print_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="data source with gt_boxes (JSONL or FORMAT:PATH)")
    parser.add_argument("--output", required=True, help="corrupted dataset JSONL")
    parser.add_argument("--fraction", type=float, default=0.4, help="share of all boxes corrupted (default 0.4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--displace-iou", type=float, default=0.6,
                        help="a displaced box's IoU with its original stays below this (default 0.6)")
    parser.add_argument("--report", default=None, help="write the JSON report here instead of stdout")


def run(args: argparse.Namespace) -> int:
    from spatial_jax.data.corrupt import CorruptConfig, corrupt
    from spatial_jax.data.jsonl import write_jsonl
    from spatial_jax.data.pipeline import open_source
    from spatial_jax.data.pseudo_gt import relocate
    from spatial_jax.data.sources import refuse_writing_into_copies, spec_paths

    try:
        cfg = CorruptConfig(fraction=args.fraction, seed=args.seed, displace_iou=args.displace_iou)
    except ValueError as e:
        print(f"spatial-jax corrupt: {e}", file=sys.stderr)
        return 2
    check_output_files({"--output": args.output, "--report": args.report}, spec_paths(args.input))
    refuse_writing_into_copies({"--output": args.output, "--report": args.report}, args.input)
    samples, report = corrupt(list(open_source(args.input, check_images=False)), cfg)
    out_dir = os.path.dirname(os.path.abspath(args.output))
    write_jsonl([relocate(s, out_dir) for s in samples], args.output)
    print_report(report, args.report, f"corrupted {report['corrupted']} of {report['boxes']} boxes -> {args.output}")
    return 0
