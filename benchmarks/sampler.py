"""Sampler benchmark: spatial_jax's jitted KV-cache sampler vs transformers' generate, same tiny weights, one process.

    python benchmarks/sampler.py [--batch 8] [--new 128] [--repeats 3] [--vocab 1024]

A tiny Qwen3-VL (spatial_jax ModelConfig.tiny, untied head) is built in transformers, saved, and loaded by
spatial_jax's from_pretrained, so both sides run identical float32 weights on CPU. The batch holds `--batch`
left-padded prompts, each with one image of its own size. Both sides produce exactly `--new` tokens per row (no stop
token), greedy and sampled (temperature 1, top-p 0.9). For each side, time = best of `--repeats` warm runs of
prefill + decode; decode time = that minus a 1-token run (prefill + first token). The JAX side's first call
(compilation included) is reported apart. transformers runs with 1 torch thread and with torch's default, and its
faster setting is the one compared (on a tiny model, extra intra-op threads mostly add contention).
Writes benchmarks/out/sampler.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out" / "sampler.json"


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
    hf = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**cfg.to_hf())).eval()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
        "cpu_count": os.cpu_count(), "platform": platform.platform(), "results": results,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2))

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
