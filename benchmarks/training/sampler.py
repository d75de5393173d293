"""Sampler benchmark: spatial_jax's jitted KV-cache sampler vs transformers' generate, same tiny weights, one process;
and continuous batching (rollout/engine.py) vs the static batch on a skewed-length workload.

    python benchmarks/training/sampler.py [--batch 8] [--new 128] [--repeats 3] [--vocab 1024]
    python benchmarks/training/sampler.py --skewed-only [--requests 40] [--slots 10] [--short 32]

A tiny Qwen3-VL (spatial_jax ModelConfig.tiny, untied head) is built in transformers, saved, and loaded by
spatial_jax's from_pretrained, so both sides run identical float32 weights on CPU. The batch holds `--batch`
left-padded prompts, each with one image of its own size. Both sides produce exactly `--new` tokens per row (no stop
token), greedy and sampled (temperature 1, top-p 0.9). For each side, time = best of `--repeats` warm runs of
prefill + decode; decode time = that minus a 1-token run (prefill + first token). The JAX side's first call
(compilation included) is reported apart. transformers runs with 1 torch thread and with torch's default, and its
faster setting is the one compared (on a tiny model, extra intra-op threads mostly add contention).

Skewed case: `--requests` prompts with images (as above), one in ten drawing 8 x `--short` tokens and the rest
`--short` (sampled at temperature 1; a request's budget stands in for where it would stop), at equal slots: the
static sampler decodes them `--slots` rows at a time, each batch until its longest row is done (8 x short steps);
the engine keeps `--slots` requests in flight, a finished one's slot taking the next. Its page pool holds
`--slots` x (longest prompt + 2 x short) tokens (16-token pages); requests that outgrow it wait (or restart, the
same tokens) as the engine decides. tokens/s = the requested tokens (the same for both) / best warm wall time; KV
memory = bytes of keys/values allocated (static: one batch's cache; engine: its pool), with the engine's peak pages
in use beside it. Both produce the same tokens for each request up to its budget (checked).
Writes benchmarks/out/sampler.json and prints a table.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from spatial_jax.cli.script_guard import check_counts, check_own_output, write_own
from spatial_jax.config import ConfigError
from spatial_jax.models.registry import config_to_hf

OUT = Path(__file__).resolve().parents[1] / "out" / "sampler.json"
OWNER = Path(__file__).name


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def build(vocab: int, batch: int, seed: int):
    import numpy as np
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from spatial_jax.data.image_processing import ImageProcessingConfig, num_image_tokens, preprocess
    from spatial_jax.models import ModelConfig
    from spatial_jax.models.hf_io import from_pretrained

    cfg = ModelConfig.tiny(vocab_size=vocab, tie_word_embeddings=False)
    torch.manual_seed(seed)
    hf = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**config_to_hf(cfg))).eval()
    path = Path(tempfile.mkdtemp(prefix="tiny_qwen3vl_"))
    hf.save_pretrained(path)
    model = from_pretrained(path)

    rng = np.random.default_rng(seed)
    f = cfg.vision.patch_size * cfg.vision.spatial_merge_size
    icfg = ImageProcessingConfig(patch_size=cfg.vision.patch_size, merge_size=cfg.vision.spatial_merge_size,
                                 min_pixels=f * f * 4, max_pixels=f * f * 16)
    images = [rng.integers(0, 256, size=(int(rng.integers(40, 160)), int(rng.integers(40, 160)), 3), dtype=np.uint8)
              for _ in range(batch)]
    pv, grid = preprocess(images, icfg)
    n_img = num_image_tokens(grid, cfg.vision.spatial_merge_size)
    rows = []
    for i in range(batch):
        text = [int(t) for t in rng.integers(1, vocab - 8, int(rng.integers(10, 30)))]
        rows.append(text[:3] + [cfg.vision_start_token_id] + [cfg.image_token_id] * int(n_img[i])
                    + [cfg.vision_end_token_id] + text[3:])
    T = max(len(r) for r in rows)
    ids = np.zeros((batch, T), np.int32)
    mask = np.zeros((batch, T), np.int32)
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = r
        mask[i, T - len(r):] = 1
    return cfg, hf, model, ids, mask, pv, grid


def skewed(args) -> dict:
    """Continuous batching vs the static batch on one long request in ten (see the module docstring)."""
    import dataclasses

    import jax
    import numpy as np

    from spatial_jax.rollout import SamplingConfig, generate
    from spatial_jax.rollout.engine import Engine, image_counts_of, split_rows

    cfg, _, model, ids, mask, pv, grid = build(args.vocab, args.requests, args.seed)
    R, S, short, long_ = args.requests, args.slots, args.short, 8 * args.short
    budgets = np.where(np.arange(R) % 10 == 0, long_, short)
    scfg = SamplingConfig(temperature=1.0, max_new_tokens=long_, seed=1)
    wanted = int(budgets.sum())
    counts = image_counts_of(cfg, ids, mask, grid)
    items = np.concatenate([[0], np.cumsum(counts)])
    patches = np.concatenate([[0], np.cumsum(grid.prod(-1))])

    def static():
        outs = []
        for a in range(0, R, S):
            b = min(R, a + S)
            out, _ = generate(model, ids[a:b], mask[a:b], pixel_values=pv[patches[items[a]]:patches[items[b]]],
                              image_grid_thw=grid[items[a]:items[b]], cfg=scfg, row_ids=np.arange(a, b))
            outs.append(np.asarray(jax.block_until_ready(out.tokens)))
        return np.concatenate(outs)

    page_size = 16
    prompt = int(mask.sum(1).max())
    pages = S * -(-(prompt + 2 * short) // page_size) + 1
    engine = Engine(model, scfg, slots=S, max_len=ids.shape[1] + long_, page_size=page_size, pages=pages, chunk=16)
    requests = [dataclasses.replace(r, max_new_tokens=int(budgets[i]))
                for i, r in enumerate(split_rows(ids, mask, pv, grid, counts))]

    def paged():
        return engine.run(requests)

    ref, got = static(), paged()  # compiles
    same = all(np.array_equal(got[i][0].tokens, ref[i, : budgets[i]]) for i in range(R))
    t_static = _best(static, args.repeats)
    t_engine = _best(paged, args.repeats)
    t = cfg.text
    per_token = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * 4  # float32 keys + values
    static_kv = S * (ids.shape[1] + long_) * per_token
    row = {
        "requests": R, "slots": S, "short_tokens": short, "long_tokens": long_, "long_every": 10,
        "prompt_len_padded": int(ids.shape[1]), "prompt_len_max": prompt, "requested_tokens": wanted,
        "page_size": page_size, "pool_pages": pages, "engine_peak_pages": engine.peak_pages,
        "engine_stats": engine.stats, "same_tokens": bool(same),
        "static_s": t_static, "engine_s": t_engine,
        "static_tok_s": wanted / t_static, "engine_tok_s": wanted / t_engine, "speedup": t_static / t_engine,
        "static_kv_bytes": static_kv, "engine_kv_bytes": engine.kv_bytes,
        "engine_peak_kv_bytes_in_use": engine.peak_pages * page_size * per_token,
        "kv_ratio": engine.kv_bytes / static_kv,
    }
    print(f"skewed: {R} requests ({long_} tokens one in ten, else {short}), {S} slots, prompts <= {prompt} tokens")
    print(f"{'':<8} {'tok/s':>8} {'wall':>8} {'KV bytes':>10}")
    print(f"{'static':<8} {row['static_tok_s']:>8.0f} {t_static:>7.2f}s {static_kv:>10}")
    print(f"{'engine':<8} {row['engine_tok_s']:>8.0f} {t_engine:>7.2f}s {engine.kv_bytes:>10}  "
          f"(peak in use {row['engine_peak_kv_bytes_in_use']}, {engine.stats})")
    print(f"engine / static: {row['speedup']:.2f}x tokens/s, {row['kv_ratio']:.2f}x KV memory; same tokens: {same}")
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--short", type=int, default=32)
    parser.add_argument("--skewed-only", action="store_true", help="only the skewed-length case")
    args = parser.parse_args(argv)
    try:
        check_counts({"--batch": (args.batch, 1, 4096), "--new": (args.new, 1, 2**16),
                      "--repeats": (args.repeats, 1, 1000), "--vocab": (args.vocab, 16, 2**20),
                      "--seed": (args.seed, 0, 2**31), "--requests": (args.requests, 1, 10**5),
                      "--slots": (args.slots, 1, 4096), "--short": (args.short, 1, 2**16)})
        check_own_output(OUT, "the output", OWNER)
    except ConfigError as e:
        parser.error(str(e))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.skewed_only:
        report = {"skewed": skewed(args)}
        write_own(OUT, report, OWNER, "the output")
        print(f"wrote {OUT}")
        return

    import jax
    import numpy as np
    import torch

    from spatial_jax.rollout import SamplingConfig, generate

    cfg, hf, model, ids, mask, pv, grid = build(args.vocab, args.batch, args.seed)
    default_threads = torch.get_num_threads()
    B, N = args.batch, args.new
    max_len = ids.shape[1] + N
    suppress = [cfg.image_token_id, cfg.video_token_id]
    hf_inputs = dict(
        input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
        pixel_values=torch.tensor(pv), image_grid_thw=torch.tensor(grid),
        mm_token_type_ids=torch.tensor((ids == cfg.image_token_id).astype(np.int64)),
    )
    modes = {
        "greedy": (SamplingConfig(temperature=0.0, max_new_tokens=N), dict(do_sample=False)),
        "sample": (SamplingConfig(temperature=1.0, top_p=0.9, max_new_tokens=N, seed=1),
                   dict(do_sample=True, temperature=1.0, top_p=0.9, top_k=0)),
    }
    results = []
    for mode, (scfg, hf_kwargs) in modes.items():
        def ours(n):
            c = SamplingConfig(**{**scfg.__dict__, "max_new_tokens": n})
            out, _ = generate(model, ids, mask, pixel_values=pv, image_grid_thw=grid, cfg=c, max_len=max_len)
            return jax.block_until_ready(out)

        def theirs(n):
            with torch.no_grad():
                return hf.generate(**hf_inputs, **hf_kwargs, max_new_tokens=n, min_new_tokens=n, pad_token_id=0,
                                   eos_token_id=None, suppress_tokens=suppress)

        t0 = time.perf_counter()
        out = ours(N)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        ours(1)
        cold_1 = time.perf_counter() - t0
        ours_total = _best(lambda: ours(N), args.repeats)
        ours_first = _best(lambda: ours(1), args.repeats)
        hf_by_threads = {}
        for threads in sorted({1, default_threads}):
            torch.set_num_threads(threads)
            theirs(1)  # warm torch's allocator and kernels
            hf_by_threads[threads] = (_best(lambda: theirs(N), args.repeats), _best(lambda: theirs(1), args.repeats))
        torch.set_num_threads(default_threads)
        hf_threads = min(hf_by_threads, key=lambda t: hf_by_threads[t][0])
        hf_total, hf_first = hf_by_threads[hf_threads]
        row = {
            "mode": mode,
            "ours_total_s": ours_total,
            "ours_prefill_plus_1_s": ours_first,
            "ours_decode_s": ours_total - ours_first,
            "ours_compile_s": cold + cold_1 - ours_total - ours_first,
            "hf_total_s": hf_total,
            "hf_prefill_plus_1_s": hf_first,
            "hf_decode_s": hf_total - hf_first,
            "hf_torch_threads": hf_threads,
            "hf_total_s_by_threads": {str(t): v[0] for t, v in hf_by_threads.items()},
        }
        row["ours_decode_tok_s"] = B * (N - 1) / row["ours_decode_s"]
        row["hf_decode_tok_s"] = B * (N - 1) / row["hf_decode_s"]
        row["decode_speedup"] = row["ours_decode_tok_s"] / row["hf_decode_tok_s"]
        row["end_to_end_speedup"] = hf_total / ours_total
        if mode == "greedy":
            ref = theirs(N)[:, ids.shape[1]:].numpy()
            row["greedy_token_agreement"] = float((np.asarray(out.tokens) == ref).mean())
        results.append(row)

    report = {
        "batch": B, "new_tokens": N, "prompt_len": int(ids.shape[1]), "vocab": args.vocab,
        "image_tokens_per_row": [int(x) for x in (grid.prod(-1) // 4)], "repeats": args.repeats,
        "jax": jax.__version__, "torch": torch.__version__, "torch_default_threads": default_threads,
        "cpu_count": os.cpu_count(), "platform": platform.platform(), "results": results, "skewed": skewed(args),
    }
    write_own(OUT, report, OWNER, "the output")

    print(f"batch {B}, {N} new tokens, prompt {ids.shape[1]} tokens, vocab {args.vocab}, CPU x{os.cpu_count()}")
    head = f"{'mode':<7} {'ours tok/s':>11} {'HF tok/s':>10} {'decode x':>9} {'e2e x':>7} {'ours total':>11} " \
           f"{'HF total':>9} {'HF thr':>6} {'compile':>8}"
    print(head)
    for r in results:
        print(f"{r['mode']:<7} {r['ours_decode_tok_s']:>11.0f} {r['hf_decode_tok_s']:>10.0f} "
              f"{r['decode_speedup']:>9.2f} {r['end_to_end_speedup']:>7.2f} {r['ours_total_s']:>10.3f}s "
              f"{r['hf_total_s']:>8.3f}s {r['hf_torch_threads']:>6} {r['ours_compile_s']:>7.2f}s")
    if "greedy_token_agreement" in results[0]:
        print(f"greedy token agreement with HF: {results[0]['greedy_token_agreement']:.3f}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
