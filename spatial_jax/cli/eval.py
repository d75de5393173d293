"""`spatial-jax eval`: score a run's latest checkpoint (or, with --initial, the untrained policy) on a dataset with
greedy decoding, or on the papers' benchmarks.

Prints accuracy overall and per category (sample-weighted) with standard errors, and the method's grounding
figures; writes the summary and per-sample rows as JSON. A run directory without a checkpoint (a typo?) is refused
and left as it was; the output's folder is checked before the work.

`--benchmark NAME --data COPY` (or `--protocol NAME --data ROOT`, ROOT holding one folder per benchmark named as the
benchmark) scores the policy on a benchmark's local copy as its official evaluation code scores it and prints and
writes the paper's table (JSON and Markdown): each question is laid out as the benchmark's protocol shows it, and the
official extraction reads the method's final answer (a completion without one is wrong and counted unparsed).
`--layout method` asks each question as the method's own prompt shows a dataset's question instead (lettered
options, no answer instruction): a benchmark copy of a dataset's questions (`spatial-jax to-cvbench`) is then asked
exactly as plain `spatial-jax eval` asks them, so the two can be compared question by question.
Responses are cached per checkpoint under run_dir/eval_cache, so an interrupted run resumes. `--predictions FILE`
(with --protocol: a folder of <benchmark>.json / .jsonl files) scores responses made elsewhere, with no model, each
read whole as given.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    from spatial_jax.suites.layout import PROMPT_LAYOUTS

    p.add_argument("--config", default=None,
                   help="the run's TOML config (default: the README main job, configs/tiny_cpu.toml)")
    p.add_argument("--data", default=None, help="JSONL dataset or synthetic:<split>:<n> (default: data.eval); with "
                   "--benchmark the benchmark's local copy, with --protocol a folder of copies named by benchmark")
    p.add_argument("--output", default=None, help="where to write the JSON report (default: <run_dir>/eval_cli.json)")
    p.add_argument("--initial", action="store_true",
                   help="evaluate the configured policy as built (untrained), not a checkpoint of run_dir")
    p.add_argument("--benchmark", default=None, help="score on one of the papers' benchmarks (--data: its copy)")
    p.add_argument("--protocol", default=None, help="a paper's whole table (--data: a folder of benchmark copies)")
    p.add_argument("--predictions", default=None,
                   help="score these responses (JSON {id: text} or JSONL) instead of running the policy")
    p.add_argument("--variant", default=None, help="the benchmark's scoring variant (default: the official one)")
    p.add_argument("--layout", choices=PROMPT_LAYOUTS, default="benchmark",
                   help="benchmark: each question as the benchmark's protocol lays it out (default); method: as the "
                   "method's own prompt shows a dataset's question (to compare with `spatial-jax eval` on the same "
                   "questions)")
    p.add_argument("--temperature", type=float, default=None, help="override the protocol's sampling temperature")
    p.add_argument("--max-new-tokens", type=int, default=None, help="override the protocol's completion length")
    p.add_argument("--max-tool-turns", type=int, default=None, help="override the protocol's tool turns")
    p.add_argument("--video-frames", type=int, default=None,
                   help="frames sampled uniformly per video (default: the protocol's; 0 = the whole clip)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="show a progress bar while generating")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")


def check_output(path, inputs, markdown: bool = False) -> None:
    """ConfigError now, before the work, when the report (and, with `markdown`, its .md twin) would overwrite one of
    `inputs` (files or folders: the config, the data, the predictions, the benchmark copy) or the other, or cannot be
    written: its folder must exist and take new files (the report is written whole, through a temp file renamed over
    it)."""
    from spatial_jax.cli.outputs import check_output_files, check_writable_file

    outputs = {"--output": path}
    if markdown:
        outputs["--output's Markdown table"] = path.with_suffix(".md")
    check_output_files(outputs, inputs)
    check_writable_file("--output", path)


def run(args) -> int:
    if args.benchmark or args.protocol:
        return run_benchmarks(args)
    import dataclasses
    from pathlib import Path

    import jax

    from spatial_jax import distributed
    from spatial_jax.cli.job_config import job_files, load_job
    from spatial_jax.config import ConfigError
    from spatial_jax.eval.evaluate import evaluate
    from spatial_jax.rl.report import write_json
    from spatial_jax.rl.workspace import Workspace, has_checkpoint
    from spatial_jax.rollout.collect import ToolSettings
    from spatial_jax.rollout.decode_copy import DecodeCopy
    from spatial_jax.rollout.hosts import HostShare

    cfg = load_job(args.config, args.overrides)  # config errors surface before the cluster is joined
    if not args.initial and not has_checkpoint(cfg.run_dir):
        raise ConfigError(f"run_dir {cfg.run_dir} holds no checkpoint (sft/ or rl/) to evaluate; pass --initial to "
                          "evaluate the untrained policy on purpose")
    out = Path(args.output or Path(cfg.run_dir) / "eval_cli.json")
    check_output(out, [*job_files(args.config), args.data or cfg.data.eval])
    distributed.initialize()
    if args.data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, eval=args.data))
    ws = Workspace(cfg)
    stage = None if args.initial else ws.load_latest()
    if ws.primary:
        print(f"evaluating {'the ' + stage + ' checkpoint' if stage else 'the initial policy'} of {cfg.run_dir} "
              f"on {cfg.data.eval}", flush=True)
    hosts = HostShare.of_cluster(ws.tok.pad_id)  # each process evaluates its share of the questions
    with jax.set_mesh(ws.mesh):
        it = hosts.eval_iterator(cfg.data, ws.tok, ws.method.prompt, cfg.eval.batch_size, cfg.eval.max_samples,
                                 ws.policy.image_cfg)
        summary, rows = evaluate(DecodeCopy(ws.model, cfg.decode, ws.mesh), ws.tok, it, ws.method, ws.reward_cfg,
                                 cfg.eval.max_new_tokens, cfg.eval.max_samples, hosts=hosts,
                                 tools=ToolSettings(cfg.rl.max_tool_turns, cfg.rl.max_tool_tokens),
                                 blank_fill=cfg.rl.blank_fill, image_cfg=ws.policy.image_cfg,
                                 diagnostics=cfg.eval.diagnostics, seed=cfg.seed)
    if not ws.primary:  # multi-host: the first process writes the report
        return 0
    write_json(out, {"checkpoint": stage, "data": cfg.data.eval, "summary": summary, "rows": rows}, indent=1)
    print(json.dumps(summary, indent=2))
    print(f"wrote {out}")
    return 0


def _plan(args):
    """(protocol or None, [(benchmark, copy folder, predictions file or None)]), refused before any work."""
    from pathlib import Path

    from spatial_jax.config import ConfigError
    from spatial_jax.suites import LOADERS
    from spatial_jax.suites.protocols import get_protocol

    if args.benchmark and args.protocol:
        raise ConfigError("pass either --benchmark or --protocol, not both")
    if not args.data:
        raise ConfigError("--benchmark / --protocol need --data: the benchmark's local copy (a protocol: a folder "
                          "holding one folder per benchmark, named as the benchmark)")
    protocol = get_protocol(args.protocol) if args.protocol else None
    names = protocol.benchmarks if protocol else (args.benchmark,)
    if args.benchmark and args.benchmark not in LOADERS:
        raise ConfigError(f"unknown benchmark {args.benchmark!r}; known: {sorted(LOADERS)}")
    if args.variant and protocol:
        raise ConfigError("--variant goes with --benchmark (a protocol names its benchmarks' variants)")
    if args.predictions and args.layout != "benchmark":
        raise ConfigError("--layout chooses how the policy is prompted; --predictions were prompted elsewhere")
    data = Path(args.data)
    preds = Path(args.predictions) if args.predictions else None
    plan = []
    for name in names:
        copy = data / name if protocol else data
        pred = None
        if preds is not None:
            if protocol:
                found = [preds / f"{name}{ext}" for ext in (".json", ".jsonl") if (preds / f"{name}{ext}").is_file()]
                if not found:
                    raise ConfigError(f"--predictions {preds}: no {name}.json or {name}.jsonl in that folder")
                pred = found[0]
            else:
                pred = preds
        plan.append((name, copy, pred))
    return protocol, plan


def _decoding(args, protocol, cfg):
    from spatial_jax.suites.runner import Decoding

    def pick(flag, from_protocol, default):
        return flag if flag is not None else (from_protocol if from_protocol else default)

    return Decoding(
        temperature=pick(args.temperature, protocol.temperature if protocol else 0.0, 0.0),
        max_new_tokens=pick(args.max_new_tokens, protocol.max_new_tokens if protocol else 0, cfg.eval.max_new_tokens),
        max_tool_turns=pick(args.max_tool_turns, protocol.max_tool_turns if protocol else 0, cfg.rl.max_tool_turns),
        max_tool_tokens=cfg.rl.max_tool_tokens,
        video_frames=pick(args.video_frames, protocol.video_frames if protocol else 0, 0),
        seed=cfg.seed,
    )


def _checkpoint_tag(run_dir, stage) -> str:
    from pathlib import Path

    if stage is None:
        return "initial"
    steps = [int(p.name) for p in (Path(run_dir) / stage / "checkpoints").iterdir() if p.name.isdigit()]
    return f"{stage}-{max(steps) if steps else 0}"


def run_benchmarks(args) -> int:
    """--benchmark / --protocol: the paper's table from the policy's responses or from --predictions."""
    from pathlib import Path

    from spatial_jax.cli.job_config import job_files
    from spatial_jax.rl.report import write_json
    from spatial_jax.suites import load, score_responses
    from spatial_jax.suites.protocols import summary
    from spatial_jax.suites.runner import read_predictions

    protocol, plan = _plan(args)
    title = protocol.name if protocol else plan[0][0]
    records = {name: load(name, copy) for name, copy, _ in plan}  # a broken copy fails before the model loads
    if args.predictions:
        responses = {name: read_predictions(pred) for name, _, pred in plan}
        given = Path(args.predictions)
        out = Path(args.output) if args.output else (given if given.is_dir() else given.parent) / f"eval_{title}.json"
        check_output(out, [*job_files(args.config), args.data, *(pred for _, _, pred in plan)], markdown=True)
        meta = {"predictions": str(args.predictions)}
        skipped: dict[str, list[str]] = {}
        final_answer = None  # responses made elsewhere are read as given
    else:
        responses, skipped, meta, out, final_answer = _generate(args, protocol, plan, records, title)
        if out is None:  # multi-host: the first process reports
            return 0
    tables, report = {}, {"protocol": protocol.name if protocol else None, **meta, "benchmarks": {}}
    for name, _, _ in plan:
        variant = (protocol.variants.get(name) if protocol else args.variant)
        scored = score_responses(name, records[name], responses[name], variant, final_answer)
        tables[name] = scored.table
        report["benchmarks"][name] = {"table": scored.table.as_dict(), "missing": scored.missing,
                                      "no_sample_form": skipped.get(name, []), "rows": scored.rows}
    markdown = [t.markdown() for t in tables.values()]
    if protocol:
        combined = summary(protocol, tables)
        report["summary"] = {k: v.as_dict() for k, v in combined.items()}
        markdown.append(_summary_markdown(protocol, combined))
    text = "\n\n".join(markdown)
    print(text)
    for name, _, _ in plan:
        missing = report["benchmarks"][name]["missing"]
        if missing:
            print(f"note: {name}: {len(missing)} of {len(records[name])} records have no response and are not "
                  "scored")
    write_json(out, report, indent=1)
    out.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def _summary_markdown(protocol, combined) -> str:
    from spatial_jax.suites.table import columns

    rule = {"official": "each benchmark's official overall", "category_size": "accuracy weighted by the official "
            "category sizes", "task_mean": "unweighted mean over task types"}[protocol.rule]
    return f"### {protocol.name} ({rule})\n\n" + columns(list(combined.items()))


def _generate(args, protocol, plan, records, title):
    """The policy's responses for every benchmark of the plan, through the per-checkpoint cache, and the method's
    final_answer that scoring reads them through."""
    from pathlib import Path

    import jax

    from spatial_jax import distributed
    from spatial_jax.cli.job_config import job_files, load_job
    from spatial_jax.config import ConfigError
    from spatial_jax.rl.workspace import Workspace, has_checkpoint
    from spatial_jax.rollout.decode_copy import DecodeCopy
    from spatial_jax.rollout.hosts import HostShare
    from spatial_jax.suites.protocols import decoding_protocol
    from spatial_jax.suites.runner import ResponseCache, cache_dir, generate

    cfg = load_job(args.config, args.overrides)
    if not args.initial and not has_checkpoint(cfg.run_dir):
        raise ConfigError(f"run_dir {cfg.run_dir} holds no checkpoint (sft/ or rl/) to evaluate; pass --initial to "
                          "evaluate the untrained policy on purpose")
    out = Path(args.output or Path(cfg.run_dir) / f"eval_{title}.json")
    check_output(out, [*job_files(args.config), args.data], markdown=True)
    decoding = _decoding(args, decoding_protocol(protocol, cfg.method, tuple(name for name, _, _ in plan)), cfg)
    distributed.initialize()
    ws = Workspace(cfg)
    stage = None if args.initial else ws.load_latest()
    folder = cache_dir(Path(cfg.run_dir), _checkpoint_tag(cfg.run_dir, stage), ws.method.name, decoding, args.layout)
    total = sum(len(r) for r in records.values())
    bar = None
    if args.progress and ws.primary:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=f"eval {title}", unit="q")
    responses, skipped = {}, {}
    hosts = HostShare.of_cluster(ws.tok.pad_id)  # each process answers its share of the questions
    with jax.set_mesh(ws.mesh):
        model = DecodeCopy(ws.model, cfg.decode, ws.mesh)
        for name, _, _ in plan:
            cache = ResponseCache(folder / f"{name}.jsonl", writes=ws.primary)
            own = [records[name][i] for i in hosts.share(len(records[name]))]
            if hosts.count > 1:
                print(f"process {hosts.index} of {hosts.count} answers {len(own)} of the {len(records[name])} "
                      f"{name} questions", flush=True)
            if bar is not None:
                bar.update(sum(1 for r in own if r.id in cache.responses))
            got, skip = generate(
                own, cache, model=model, tokenizer=ws.tok, method=ws.method, reward_cfg=ws.reward_cfg,
                data_cfg=cfg.data, image_cfg=ws.policy.image_cfg, batch_size=cfg.eval.batch_size, decoding=decoding,
                blank_fill=cfg.rl.blank_fill, progress=bar.update if bar is not None else None, layout=args.layout)
            shares = hosts.everyone((dict(got), skip))
            every = {rid: text for share, _ in shares for rid, text in share.items()}
            cache.add([(rid, text) for rid, text in every.items() if rid not in cache.responses])
            responses[name] = {r.id: every[r.id] for r in records[name] if r.id in every}
            skipped[name] = [rid for _, skip in shares for rid in skip]
    if bar is not None:
        bar.close()
    if not ws.primary:
        return responses, skipped, {}, None, None
    meta = {"checkpoint": stage, "run_dir": str(cfg.run_dir), "cache": str(folder), "layout": args.layout,
            "decoding": {"temperature": decoding.temperature, "max_new_tokens": decoding.max_new_tokens,
                         "max_tool_turns": decoding.max_tool_turns, "video_frames": decoding.video_frames}}
    return responses, skipped, meta, out, ws.method.final_answer
