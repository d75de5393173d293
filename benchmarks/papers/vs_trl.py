"""One GRPO step of the main job's RL stage against TRL's GRPOTrainer on the same work, ABAB, on a quiet host.

    python benchmarks/papers/vs_trl.py [--pairs 8] [--load 1.5] [--wait 900] [--config configs/tiny_cpu.toml]
                                [--out benchmarks/out/vs_trl] [--results benchmarks/RESULTS.md] [key=value ...]

Needs the bench extra (`pip install -e ".[bench]"`: trl 1.16 and what it brings).

The work, equal on both sides: the job's policy checkpoint (the tiny base, float32), the job's first batch of prompts
(8), G = 8 rollouts each of at most rl.sampling.max_new_tokens (192) at temperature 1, top-k 0, top-p 1, stopping at
<|im_end|>; the vision tower frozen, no KL term and no reference model; the token-mean loss (TRL's "dapo") clipped at
0.2; AdamW at rl.optim.lr (5e-4) held constant, gradients clipped at 1.0, one optimiser step per batch; SpatialCORE's
reward (the project's scorer on both sides; TRL's `generate` returns no per-token entropies, so its rollouts are
scored with H = 0 in eq. 5, which changes reward values, not the work). Every step rolls out the same prompts anew.

Each side runs in its own worker process, so each has its own peak RSS and neither's thread pools or allocator see
the other's; the driver lets exactly one work at a time: before each pair it waits (up to --wait seconds) for the
host's 1-minute load average to fall below --load and says when it did not, then one step of spatial-jax, then one
of TRL. The first pair is each side's warm-up (compilation for JAX; TRL's first step) and is reported as "first step"
over the median. Before timing, the driver checks that both sides see the same prompt ids and bit-identical pixel
values (sha256 of the float32 patches), prompt by prompt.

Columns: step = sampling + update; sampling = generation and scoring (spatial-jax: `Experience.roll_out`; TRL:
`_generate_and_score_completions`); update = the rest of the optimiser step (spatial-jax: `Learner.learn`; TRL: the
loss forward and backward, clipping and AdamW, from on_step_begin to on_step_end less its sampling). Times are
medians (min-max) over the pairs after the first; TRL / spatial-jax is the median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import pickle
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIDES = ("spatial-jax", "trl")
BEGIN, END = "<!-- vs_trl:begin -->", "<!-- vs_trl:end -->"
OWNED = {"run_dir": "--out", "sft.steps": "the RL stage alone is timed", "rl.steps": "--pairs"}


# ---------------------------------------------------------------- protocol: one JSON line per message, on pipes
def send(fd: int, obj) -> None:
    os.write(fd, (json.dumps(obj) + "\n").encode())


def receive(stream) -> dict:
    line = stream.readline()
    if not line:
        raise EOFError("the worker ended before answering (its log is in --out)")
    return json.loads(line)


def pixel_digest(pixels) -> str:
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(pixels, np.float32).tobytes()).hexdigest()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------- spatial-jax's side
def sjax_worker(args: argparse.Namespace, rd, wr: int) -> None:
    import jax
    import numpy as np

    from spatial_jax.cli.job_config import load_job
    from spatial_jax.data.processor_files import write_processor_configs
    from spatial_jax.data.prompts import build_messages
    from spatial_jax.data.visuals import load_visuals, video_config
    from spatial_jax.models.registry import architecture
    from spatial_jax.rl.train import Trainer

    out = Path(args.out)
    cfg = load_job(args.config, job_overrides(args))
    lr = cfg.rl.optim.lr
    # a constant learning rate, as TRL's lr_scheduler_type="constant" (the job's warmup makes its first update lr 0)
    cfg = dataclasses.replace(cfg, rl=dataclasses.replace(
        cfg.rl, optim=dataclasses.replace(cfg.rl.optim, warmup_ratio=0.0, min_lr=lr)))
    tr = Trainer(cfg, record_config=False)
    rc = cfg.rl
    with jax.set_mesh(tr.mesh):
        it = tr.hosts.iterator(cfg.data, tr.tok, tr.method.prompt, rc.prompts_per_step, "rl", tr.policy.image_cfg)
        batch = next(it)
        starts = np.concatenate([[0], np.cumsum(np.prod(batch.image_grid_thw, axis=1))])
        items = np.concatenate([[0], np.cumsum(batch.image_counts)])
        signature, rows = [], []
        for i, sample in enumerate(batch.records):
            ids = batch.input_ids[i][batch.attention_mask[i] > 0]
            pixels = batch.pixel_values[starts[items[i]]:starts[items[i + 1]]]
            signature.append({"ids": ids.tolist(), "pixels": pixel_digest(pixels),
                              "grid": batch.image_grid_thw[items[i]:items[i + 1]].tolist()})
            rows.append({"messages": build_messages(sample, tr.method.prompt), "sample": sample,
                         "images": load_visuals(sample).images})
        with open(out / "prompts.pkl", "wb") as f:
            pickle.dump({"rows": rows, "thinking": tr.method.prompt.thinking, "signature": signature,
                         "max_new_tokens": rc.sampling.max_new_tokens, "temperature": rc.sampling.temperature,
                         "group": rc.group_size, "lr": lr, "clip": rc.loss.clip_low,
                         "grad_clip": cfg.rl.optim.grad_clip_norm, "seed": cfg.seed}, f)
        base = out / "trl_base"  # the job's checkpoint with the image processor's settings beside it, for TRL
        shutil.rmtree(base, ignore_errors=True)
        shutil.copytree(cfg.policy.checkpoint, base)
        write_processor_configs(base, tr.policy.image_cfg, video_config(tr.policy.image_cfg, None),
                                architecture(tr.model.cfg.model_type).processor_files)
        tx = tr.optimizer("rl")
        opt_state = tx.init(tr.trainable)
        n_micro = tr.optim_config("rl").grad_accum_steps
        sampling = dataclasses.replace(rc.sampling, stop_token_ids=(tr.tok.im_end_id,), pad_token_id=tr.tok.pad_id)
        send(wr, {"ready": True, "signature": signature, "rss_mb": peak_rss_mb()})
        step = 0
        while receive(rd).get("go"):
            t0 = time.perf_counter()
            rolled = tr.experience.roll_out(step, batch, sampling, None, version=step)
            t1 = time.perf_counter()
            metrics, opt_state = tr.learner.learn(rolled, tx, n_micro, opt_state, sampling)
            t2 = time.perf_counter()
            lengths = rolled.completions.mask.sum(axis=1)
            send(wr, {"sampling": t1 - t0, "update": t2 - t1, "length": float(np.mean(lengths)),
                      "reward": metrics["reward_mean"], "rss_mb": peak_rss_mb()})
            step += 1


def job_overrides(args: argparse.Namespace) -> list[str]:
    return [f"run_dir={Path(args.out) / 'spatial-jax'}", "sft.steps=0", f"rl.steps={args.pairs}",
            "progress=false", "tensorboard=false", *args.overrides]


# ---------------------------------------------------------------- TRL's side
def trl_worker(args: argparse.Namespace, rd, wr: int) -> None:
    import datasets
    import numpy as np
    import torch
    import transformers
    from PIL import Image
    from trl import GRPOConfig, GRPOTrainer

    from spatial_jax.cli.job_config import load_job
    from spatial_jax.data.tokenizer import SpatialTokenizer
    from spatial_jax.records import TokenTrace

    out = Path(args.out)
    with open(out / "prompts.pkl", "rb") as f:
        work = pickle.load(f)
    cfg = load_job(args.config, job_overrides(args))
    method, reward_cfg = cfg.plugin, cfg.reward_config()
    base = out / "trl_base"
    tok = SpatialTokenizer.load(base)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class Processor(transformers.Qwen3VLProcessor):
        def check_argument_for_proper_class(self, name, arg):  # looks a video class up in torchvision's registry
            return None

    # the PIL image processor (the one data/image_processing.py is held to), read from the settings written beside
    # the checkpoint; no video processor (it needs torchvision, and the prompts hold no video)
    processor = Processor(image_processor=Qwen2VLImageProcessorPil.from_pretrained(base),
                          tokenizer=transformers.AutoTokenizer.from_pretrained(base), video_processor=None,
                          chat_template=(base / "chat_template.jinja").read_text())
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(base, dtype=torch.float32)
    model.model.visual.requires_grad_(False)
    rows = work["rows"]
    samples = [r["sample"] for r in rows]
    scored = {"n": 0}

    def spatialcore(completions, completion_ids, index, **_):
        """The project's SpatialCORE scorer on TRL's rollouts, decoded as the project's sampler decodes its own."""
        rollouts = []
        for k, (ids, i) in enumerate(zip(completion_ids, index)):
            kept = tok.trim_completion(ids)
            text, offsets = tok.decode_with_offsets(kept)
            rollouts.append(samples[i].to_rollout(text, rollout_id=f"{samples[i].id}/{scored['n']}/{k}",
                                                  trace=TokenTrace(entropies=(0.0,) * len(offsets),
                                                                   offsets=tuple(offsets)),
                                                  num_generated_tokens=len(ids)))
        scored["n"] += 1
        return [s["reward"] for s in method.score_batch(rollouts, reward_cfg)]

    # every turn's content as blocks (Arrow holds one type per column; the chat template reads both forms alike)
    dataset = datasets.Dataset.from_list([
        {"prompt": [dict(m, content=blocks(m["content"])) for m in r["messages"]],
         "image": Image.fromarray(np.asarray(r["images"][0])), "index": i} for i, r in enumerate(rows)])
    G, P = work["group"], len(rows)
    config = GRPOConfig(
        output_dir=str(out / "trl"), use_cpu=True, seed=work["seed"], max_steps=args.pairs, report_to="none",
        disable_tqdm=True, logging_steps=10**6, save_strategy="no", bf16=False, fp16=False,
        per_device_train_batch_size=P * G, gradient_accumulation_steps=1, num_generations=G, num_iterations=1,
        max_completion_length=work["max_new_tokens"], temperature=work["temperature"], top_k=0, top_p=1.0,
        generation_kwargs={"eos_token_id": tok.im_end_id, "pad_token_id": tok.pad_id},
        chat_template_kwargs={"enable_thinking": work["thinking"]},
        beta=0.0, epsilon=work["clip"], loss_type="dapo", learning_rate=work["lr"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        max_grad_norm=work["grad_clip"], remove_unused_columns=False, dataloader_num_workers=0,
    )
    times: dict[str, float] = {}

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            result = super()._generate_and_score_completions(inputs)
            times["sampling"] = time.perf_counter() - t0
            times["length"] = float(result["completion_mask"].sum(1).float().mean())
            return result

    class Pairs(transformers.TrainerCallback):
        """Waits for the driver's word before each step and answers with the step's times after it."""

        def on_step_begin(self, *_, **__):
            if not receive(rd).get("go"):
                raise SystemExit(0)
            times["t0"] = time.perf_counter()

        def on_step_end(self, *_, **__):
            step = time.perf_counter() - times["t0"]
            send(wr, {"sampling": times["sampling"], "update": step - times["sampling"], "length": times["length"],
                      "rss_mb": peak_rss_mb()})

    trainer = Timed(model=model, reward_funcs=[spatialcore], args=config, train_dataset=dataset,
                    processing_class=processor, callbacks=[Pairs()])
    # what TRL's sampler is given, prompt by prompt, as `_generate` tokenizes it
    prompt_ids, _, fields = trainer._tokenize_prompts([d["prompt"] for d in prepare(dataset)])
    grids = np.asarray(fields["image_grid_thw"])
    starts = np.concatenate([[0], np.cumsum(np.prod(grids, axis=1))])
    pixels = np.asarray(fields["pixel_values"])
    signature = [{"ids": list(map(int, ids)), "pixels": pixel_digest(pixels[starts[i]:starts[i + 1]]),
                  "grid": [grids[i].tolist()]} for i, ids in enumerate(prompt_ids)]
    send(wr, {"ready": True, "signature": signature, "rss_mb": peak_rss_mb()})
    trainer.train()
    receive(rd)  # the driver's last word


def blocks(content) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def prepare(dataset) -> list[dict]:
    """The rows' prompts with their images put in, as TRL's trainer puts them in before tokenizing."""
    from trl.data_utils import prepare_multimodal_messages

    return [{"prompt": prepare_multimodal_messages(d["prompt"], [d["image"]])} for d in dataset]


# ---------------------------------------------------------------- the driver
class Worker:
    def __init__(self, side: str, args: argparse.Namespace):
        to_r, self.to_w = os.pipe()
        from_r, from_w = os.pipe()
        self.log = open(Path(args.out) / f"{side}.log", "w")
        cmd = [sys.executable, __file__, "--worker", side, "--fds", f"{to_r},{from_w}", "--config", args.config,
               "--out", args.out, "--pairs", str(args.pairs), *args.overrides]
        self.proc = subprocess.Popen(cmd, pass_fds=(to_r, from_w), stdout=self.log, stderr=subprocess.STDOUT)
        os.close(to_r)
        os.close(from_w)
        self.stream = os.fdopen(from_r)
        self.side = side

    def ready(self) -> dict:
        return self.answer()

    def step(self) -> dict:
        send(self.to_w, {"go": True})
        return self.answer()

    def answer(self) -> dict:
        try:
            return receive(self.stream)
        except EOFError:
            raise RuntimeError(f"the {self.side} worker ended (exit {self.proc.wait()}); see {self.log.name}") from None

    def close(self) -> None:
        try:
            send(self.to_w, {"go": False})
        except OSError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def wait_quiet(threshold: float, max_wait: float, poll: float = 5.0) -> tuple[float, bool]:
    """(the 1-minute load average when the pair starts, whether it was below `threshold`), after waiting up to
    `max_wait` seconds for it to fall below."""
    deadline = time.monotonic() + max_wait
    while True:
        load = os.getloadavg()[0]
        if load < threshold or time.monotonic() >= deadline:
            return load, load < threshold
        time.sleep(poll)


def check_same_prompts(a: list[dict], b: list[dict]) -> None:
    """RuntimeError naming the first prompt whose ids, pixels or grid differ between the sides."""
    if len(a) != len(b):
        raise RuntimeError(f"spatial-jax has {len(a)} prompts, TRL {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        for key in ("ids", "pixels", "grid"):
            if x[key] != y[key]:
                raise RuntimeError(f"prompt {i}: the sides' {key} differ (spatial-jax {str(x[key])[:80]}, TRL "
                                   f"{str(y[key])[:80]})")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def versions() -> str:
    names = ("jax", "jaxlib", "torch", "transformers", "trl", "accelerate")
    found = []
    for n in names:
        try:
            found.append(f"{n} {importlib.metadata.version(n)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{n} (not installed)")
    return ", ".join(found)


def table(runs: dict[str, list[dict]], ready: dict[str, dict], loads: list[tuple[float, bool]], threshold: float,
          command: str, cpu: str) -> str:
    """The Markdown section: the settings line, the table and the per-pair loads. runs[side][0] is the first step."""
    sj, tr = runs["spatial-jax"], runs["trl"]
    timed = range(1, len(sj))

    def col(side, key):
        return [runs[side][k][key] if key != "step" else runs[side][k]["sampling"] + runs[side][k]["update"]
                for k in timed]

    def ratio(key):
        r = [b / a for a, b in zip(col("spatial-jax", key), col("trl", key))]
        return f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})"

    def first(side):
        steps = col(side, "step")
        return f"+{runs[side][0]['sampling'] + runs[side][0]['update'] - statistics.median(steps):.1f} s"

    quiet = sum(q for _, q in loads)
    lines = [
        f"`{command}`; {cpu}, {os.cpu_count()} cores; {versions()}. {len(timed)} timed pairs after one warm-up "
        f"pair; load average (1 min) at each pair's start: {', '.join(f'{la:.2f}' for la, _ in loads)} "
        f"({quiet} of {len(loads)} below {threshold}"
        + ("" if quiet == len(loads) else "; the others ran on a busy host: a quiet-host measurement is still owed")
        + f"). Mean completion length: spatial-jax {statistics.mean(col('spatial-jax', 'length')):.0f}, TRL "
        f"{statistics.mean(col('trl', 'length')):.0f} tokens.",
        "",
        "| | spatial-jax | TRL | TRL / spatial-jax |",
        "|---|---|---|---|",
    ]
    for key in ("step", "sampling", "update"):
        lines.append(f"| {key} | {spread(col('spatial-jax', key))} | {spread(col('trl', key))} | {ratio(key)} |")
    lines.append(f"| first step over the median (compile) | {first('spatial-jax')} | {first('trl')} | |")
    lines.append(f"| peak RSS | {sj[-1]['rss_mb'] / 1024:.2f} GB ({ready['spatial-jax']['rss_mb'] / 1024:.2f} "
                 f"before the first step) | {tr[-1]['rss_mb'] / 1024:.2f} GB "
                 f"({ready['trl']['rss_mb'] / 1024:.2f} before) | |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=9, help="pairs of steps, the first a warm-up (default 9: 8 timed)")
    p.add_argument("--load", type=float, default=1.5, help="the 1-minute load average a pair waits to fall below")
    p.add_argument("--wait", type=float, default=900.0, help="seconds a pair waits for it at most")
    p.add_argument("--config", default="configs/tiny_cpu.toml", help="the job whose RL step is timed")
    p.add_argument("--out", default="benchmarks/out/vs_trl", help="the workers' files and logs")
    p.add_argument("--results", default=None, help="RESULTS.md to write the section into")
    p.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--fds", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    args.seeds = [0]  # driver_args.check's; the job's seed is the config's
    return args


def validate(args: argparse.Namespace) -> None:
    import driver_args

    from spatial_jax.cli.job_config import load_job
    from spatial_jax.config import ConfigError

    driver_args.check(args, OWNED, counts={"--pairs": (args.pairs, 2, 1000)})
    if args.load <= 0 or args.wait < 0:
        raise ConfigError(f"--load must be > 0 and --wait >= 0, got {args.load} and {args.wait}")
    try:
        importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError("trl is not installed: pip install -e \".[bench]\"") from None
    cfg = load_job(args.config, job_overrides(args))
    if cfg.rl.loss.kl_coef > 0 or cfg.policy.train_vision or cfg.rl.updates_per_batch != 1:
        raise ConfigError("the comparison is of a step without KL, with the vision tower frozen and one update per "
                          "batch (TRL's settings here): set rl.loss.kl_coef=0, policy.train_vision=false, "
                          "rl.updates_per_batch=1")


def measure(args: argparse.Namespace) -> int:
    validate(args)
    from spatial_jax.platforms import cpu_name

    Path(args.out).mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/papers/vs_trl.py " + " ".join(
        [f"--pairs {args.pairs}", f"--load {args.load}", *args.overrides])
    workers: dict[str, Worker] = {}
    try:
        workers["spatial-jax"] = Worker("spatial-jax", args)
        ready = {"spatial-jax": workers["spatial-jax"].ready()}  # writes the prompts TRL's side reads
        workers["trl"] = Worker("trl", args)
        ready["trl"] = workers["trl"].ready()
        check_same_prompts(ready["spatial-jax"]["signature"], ready["trl"]["signature"])
        print(f"vs_trl: both sides see the same {len(ready['trl']['signature'])} prompts (ids and pixels)",
              file=sys.stderr, flush=True)
        runs: dict[str, list[dict]] = {s: [] for s in SIDES}
        loads = []
        for k in range(args.pairs):
            load, quiet = wait_quiet(args.load, args.wait)
            if k:
                loads.append((load, quiet))
            if not quiet:
                print(f"vs_trl: pair {k}: the host stayed busy (1-minute load {load:.2f} >= {args.load}) for "
                      f"{args.wait:.0f} s; timing anyway", file=sys.stderr, flush=True)
            for side in SIDES:
                runs[side].append(workers[side].step())
            print(f"vs_trl: pair {k}: load {load:.2f}; " + "; ".join(
                f"{s} {runs[s][-1]['sampling']:.2f} + {runs[s][-1]['update']:.2f} s" for s in SIDES),
                file=sys.stderr, flush=True)
    finally:
        for w in workers.values():
            w.close()
    text = table(runs, ready, loads, args.load, command, cpu_name())
    print(text)
    if args.results:
        import learning

        learning.write_results(Path(args.results), text, BEGIN, END)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        rd, wr = (int(x) for x in args.fds.split(","))
        with os.fdopen(rd) as stream:
            (sjax_worker if args.worker == "spatial-jax" else trl_worker)(args, stream, wr)
        return 0
    from spatial_jax.cli import one_line_errors

    return one_line_errors("vs_trl.py", lambda: measure(args))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
