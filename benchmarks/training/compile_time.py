"""Compile time of the RL update (rl/step.py's `rl_update`: forward, backward and optimiser step of the policy loss
over a batch with images) with the decoder layers unrolled vs scanned (ModelConfig.scan_layers), on CPU.

    JAX_PLATFORMS=cpu python benchmarks/training/compile_time.py [--layers 6 12 24 36] [--remat none]

A small-width Qwen3-VL (hidden 64, ModelConfig.tiny's widths, 4 vision blocks with 3 DeepStack taps) with LoRA
adapters (rank 8, text and vision) as the trainable state, AdamW; the batch is 4 rows of a 32-token prompt holding
one 4x4-patch image each and a 16-token completion. Per depth and layout: seconds to trace and lower
(`rl_update.lower`) and to compile (`.compile()`), each model in a fresh jit cache. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from spatial_jax.models import LoRAConfig, LoRAParam, ModelConfig, create_model
from spatial_jax.platforms import cpu_name
from spatial_jax.rl.losses import LossConfig
from spatial_jax.rl.step import RLData, make_seq_batch, rl_update

ROWS, PROMPT, COMPLETION = 4, 32, 16


def model_config(layers: int, scan: bool, remat: str) -> ModelConfig:
    tiny = ModelConfig.tiny(1024, tie_word_embeddings=False)
    return tiny.replace(
        text=dataclasses.replace(tiny.text, num_hidden_layers=layers),
        vision=dataclasses.replace(tiny.vision, depth=4, deepstack_visual_indexes=(1, 2, 3)),
        lora=LoRAConfig(rank=8, alpha=16.0, vision_rank=8, vision_alpha=16.0, dropout=0.05),
        scan_layers=scan, remat_policy=remat,
    )


def rl_data(cfg: ModelConfig) -> RLData:
    rng = np.random.default_rng(0)
    grid = np.array([[1, 4, 4]] * ROWS)
    n_img = 4  # 16 patches merged 2x2
    prompt = rng.integers(0, 1000, size=(ROWS, PROMPT))
    prompt[:, 2] = cfg.vision_start_token_id
    prompt[:, 3:3 + n_img] = cfg.image_token_id
    prompt[:, 3 + n_img] = cfg.vision_end_token_id
    pixels = rng.standard_normal((int(grid.prod(-1).sum()), cfg.vision.patch_dim)).astype(np.float32)
    seq = make_seq_batch(cfg, prompt, np.ones_like(prompt), rng.integers(0, 1000, size=(ROWS, COMPLETION)),
                         np.ones((ROWS, COMPLETION)), pixels, grid)
    zeros = jnp.zeros((ROWS, COMPLETION), jnp.float32)
    return RLData(seq=seq, old_logp=zeros, ref_logp=zeros, advantages=jnp.linspace(-1.0, 1.0, ROWS),
                  normalizer=jnp.float32(ROWS * COMPLETION))


def compile_seconds(layers: int, scan: bool, remat: str) -> tuple[float, float]:
    cfg = model_config(layers, scan, remat)
    model = create_model(cfg, seed=0)
    graphdef, trainable, frozen = nnx.split(model, LoRAParam, ...)
    tx = optax.adamw(1e-4)
    opt_state = tx.init(trainable)
    jax.clear_caches()
    t0 = time.perf_counter()
    lowered = rl_update.lower(graphdef, trainable, frozen, opt_state, rl_data(cfg), LossConfig(), 1.0, tx,
                              jax.random.key(0))
    t1 = time.perf_counter()
    lowered.compile()
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[6, 12, 24, 36])
    parser.add_argument("--remat", default="none", choices=["none", "full", "dots", "dots_no_batch"])
    args = parser.parse_args()
    rows = []
    for layers in args.layers:
        cells = []
        for scan in (False, True):
            lower, comp = compile_seconds(layers, scan, args.remat)
            cells.append((lower, comp))
            print(f"  {layers} layers {'scanned' if scan else 'unrolled'}: lower {lower:.1f} s, compile {comp:.1f} s",
                  file=sys.stderr, flush=True)
        (ul, uc), (sl, sc) = cells
        rows.append(f"| {layers} | {ul:.1f} + {uc:.1f} = {ul + uc:.1f} | {sl:.1f} + {sc:.1f} = {sl + sc:.1f} | "
                    f"{(ul + uc) / (sl + sc):.1f}x |")
    print(f"`JAX_PLATFORMS=cpu python benchmarks/training/compile_time.py --layers {' '.join(map(str, args.layers))} "
          f"--remat {args.remat}`; {cpu_name()}, {os.cpu_count()} cores "
          f"(load average {os.getloadavg()[0]:.1f}), jax {jax.__version__}, {jax.devices()[0].platform}\n")
    print("| decoder layers | unrolled: lower + compile (s) | scanned: lower + compile (s) | unrolled / scanned |")
    print("|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
