"""A 2-step SFT and 2-step GRPO job (SpatialThinker's reward) on a tiny random checkpoint of each non-default
architecture (Qwen2.5-VL, Qwen3-VL-MoE), then `spatial-jax export` of its run, and transformers' logits on the
job's own export and on the exported files against ours (float32, max abs over the real tokens of a left-padded
two-row image batch).

    python benchmarks/training/arch_jobs.py --out /tmp/arch_jobs        # both architectures, ~1-4 min each on 2 cores
Prints one line per architecture and export, and writes <out>/arch_jobs.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from flax import nnx

from spatial_jax.cli import main as cli
from spatial_jax.data.tokenizer import build_tokenizer
from spatial_jax.models import Qwen3VL
from spatial_jax.models.hf_io import from_pretrained, save_pretrained
from spatial_jax.models.registry import config_from_hf

JOB = ["sft.steps=2", "rl.steps=2", "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=12",
       "eval.after_rl=false", "data.train=synthetic:train:16", "data.eval=synthetic:heldout:4", "tensorboard=false",
       "progress=false", "data.bucket_lengths=[256,512]", "method=spatialthinker"]
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]))
ARCHS = {
    "qwen2_5_vl": (dict(TEXT), dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=14,
                                    out_hidden_size=64, window_size=56, fullatt_block_indexes=[1],
                                    tokens_per_second=2)),
    # moe_intermediate 32: the gate/up stack is square ([E, 64, 64])
    "qwen3_vl_moe": ({**TEXT, "num_experts": 5, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
                     dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=16,
                          out_hidden_size=64, num_position_embeddings=16, deepstack_visual_indexes=[0])),
}


def logits_gap(path: Path) -> float:
    import torch
    import transformers

    hf_cfg = json.loads((path / "config.json").read_text())
    hf = getattr(transformers, hf_cfg["architectures"][0]).from_pretrained(path).float().eval()
    ours = from_pretrained(path)
    c = ours.cfg
    grids = np.array([[1, 4, 6], [1, 2, 2]])
    n = grids.prod(-1) // c.vision.spatial_merge_size**2
    vs, ve, img = c.vision_start_token_id, c.vision_end_token_id, c.image_token_id
    rows = [[105, 106, vs] + [img] * n[0] + [ve, 107], [109, vs] + [img] * n[1] + [ve, 108, 109, 110]]
    T = max(map(len, rows))
    ids, mask = np.full((2, T), 103), np.zeros((2, T), np.int64)
    for b, r in enumerate(rows):
        ids[b, T - len(r):], mask[b, T - len(r):] = r, 1
    pixels = np.random.default_rng(0).standard_normal((int(grids.prod(-1).sum()), c.vision.patch_dim))
    pixels = pixels.astype(np.float32)
    types = (ids == img).astype(np.int64) * mask
    t = {k: torch.from_numpy(v) for k, v in dict(ids=ids, mask=mask, types=types, grids=grids, pixels=pixels).items()}
    with torch.no_grad():
        pos, _ = hf.model.get_rope_index(t["ids"], t["types"], image_grid_thw=t["grids"], attention_mask=t["mask"])
        ref = hf(input_ids=t["ids"], attention_mask=t["mask"], position_ids=pos, pixel_values=t["pixels"],
                 image_grid_thw=t["grids"], mm_token_type_ids=t["types"]).logits.numpy()
    got = np.asarray(ours(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids)[0])
    return float(np.abs(got - ref)[mask > 0].max())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="a new folder for the checkpoints and runs")
    p.add_argument("--archs", nargs="+", choices=sorted(ARCHS), default=sorted(ARCHS))
    args = p.parse_args(argv)
    if args.out.exists():
        p.error(f"--out {args.out} exists: give a new folder")
    tok = build_tokenizer()
    results = []
    for arch in args.archs:
        text, vision = ARCHS[arch]
        cfg = config_from_hf(dict(model_type=arch, text_config={**text, "vocab_size": tok.vocab_size},
                                       vision_config=vision, tie_word_embeddings=False, **tok.model_token_ids()))
        base = args.out / arch / "base"
        save_pretrained(Qwen3VL(cfg, rngs=nnx.Rngs(0)), base)
        tok.save(base)
        run = args.out / arch / "run"
        start = time.perf_counter()
        rc = cli(["train", f"run_dir={run}", f"policy.checkpoint={base}", *JOB])
        seconds = time.perf_counter() - start
        steps = {s: len((run / s / "metrics.jsonl").read_text().splitlines()) for s in ("sft", "rl")}
        rc_export = cli(["export", f"--run-dir={run}", f"--out={args.out / arch / 'exported'}"])
        for name, path in (("job's export", run / "hf"), ("spatial-jax export", args.out / arch / "exported")):
            row = dict(arch=arch, train_rc=rc, export_rc=rc_export, steps=steps, job_seconds=round(seconds, 1),
                       checkpoint=name, max_abs_logit_diff=logits_gap(path))
            results.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "arch_jobs.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
