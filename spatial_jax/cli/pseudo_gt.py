"""`spatial-jax pseudo-gt`: fills each sample's `gt_boxes` from a local zero-shot detector (SpatialCORE A.3).

Phrases of the objects in the question and options (offline by default; `--extractor-url` asks an OpenAI-compatible
endpoint instead, with the key from the environment variable named by `--extractor-key-env`), a Grounding DINO or
OWLv2 folder saved by transformers (never downloaded), the top box per phrase, scores below `--threshold` dropped.
The output is appended to and flushed per batch: after a kill, the same command carries on where it stopped, and only
then: the settings that decide the boxes are recorded beside the output (`<output>.settings.json`), and an output
holding rows written otherwise, or by anything else, is refused naming the difference.
Exit status: 0 once every sample is written, 1 for an unreadable input or detector or a failing extractor, 2 for a
bad argument or an unsupported detector.
"""

from __future__ import annotations

import argparse
import os
import sys

from spatial_jax.cli.outputs import check_output_files


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="data source: dataset JSONL or FORMAT:PATH[:split]")
    parser.add_argument("--output", required=True, help="JSONL written with gt_boxes filled; a rerun resumes it")
    parser.add_argument("--detector", required=True, help="local folder of a transformers zero-shot detector")
    parser.add_argument("--threshold", type=float, default=0.3, help="drop boxes scored below it (default 0.3)")
    parser.add_argument("--batch-size", type=int, default=8, help="samples per detector call (default 8)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--extractor-url", default=None,
                        help="OpenAI-compatible API base (e.g. https://api.openai.com/v1) for phrase extraction")
    parser.add_argument("--extractor-model", default="gpt-4o-mini", help="model name sent to --extractor-url")
    parser.add_argument("--extractor-key-env", default="OPENAI_API_KEY",
                        help="environment variable holding the endpoint's API key (none: no key sent)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from spatial_jax.data.phrases import ChatExtractor, ExtractorError
    from spatial_jax.data.pipeline import open_source
    from spatial_jax.data.pseudo_gt import (
        PseudoGTConfig,
        ZeroShotDetector,
        annotate,
        box_settings,
        completed_ids,
        extract_phrases,
        resume_settings,
        settings_path,
    )
    from spatial_jax.data.sources import refuse_writing_into_copies, spec_paths
    from spatial_jax.locks import PidLock

    try:
        cfg = PseudoGTConfig(threshold=args.threshold, batch_size=args.batch_size)
    except ValueError as e:
        print(f"spatial-jax pseudo-gt: {e}", file=sys.stderr)
        return 2
    check_output_files({"--output": args.output, "--output's settings": settings_path(args.output)},
                       spec_paths(args.input))
    refuse_writing_into_copies({"--output": args.output}, args.input)
    samples = list(open_source(args.input))
    extractor, words = extract_phrases, "offline"
    if args.extractor_url:
        extractor = ChatExtractor(args.extractor_url, args.extractor_model, os.environ.get(args.extractor_key_env))
        words = f"{args.extractor_url} {args.extractor_model}"
    # one run per output at a time: two would each append every sample the other has not written yet
    with PidLock(f"{args.output}.lock", f"--output {args.output}"):
        # rows are trusted only when written by this command with these settings (the file beside the output)
        resume_settings(args.output, box_settings(args.input, args.detector, cfg, words))
        done = completed_ids(args.output, {s.id for s in samples})
        if len(done) < len(samples):
            detector = ZeroShotDetector(args.detector, args.device)
            try:
                stats = annotate(samples, args.output, detector, extractor, cfg, done, progress=not args.no_progress)
            except ExtractorError as e:
                print(f"spatial-jax pseudo-gt: {e} (what is written stays; rerun to resume)", file=sys.stderr)
                return 1
        else:
            stats = {"samples": len(samples), "already_done": len(done), "written": 0}
    print(" ".join(f"{k}={v}" for k, v in stats.items()) + f" -> {args.output}")
    return 0
