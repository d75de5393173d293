"""The RL update with each prompt run once for its G rollouts (`rl.shared_prefix`) against the whole-row update,
side by side in one process, on the main job's policy and shapes.

    JAX_PLATFORMS=cpu python benchmarks/training/shared_prefix.py [--prompts 8] [--group 8] [--prompt-len 224]
        [--completion 192] [--calls 5] [key=value ...]

The policy is the main job's (configs/tiny_cpu.toml, key=value overrides as `spatial-jax train` takes them); the
batch is `prompts` prompts of `prompt-len` tokens holding one 64 px image (4 image tokens), each with `group`
completions of random length up to `completion`. Both programs are compiled first; then `calls` updates of each
alternate, from the same weights, so host load falls on both alike. Prints per program the median seconds per
update, the rows x tokens its decoder runs, XLA's temp memory from the compile, and the ratio; and the largest
difference between the two programs' losses.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from spatial_jax.cli.job_config import load_job
from spatial_jax.platforms import cpu_name
from spatial_jax.rl.policy import build_mesh, build_policy
from spatial_jax.rl.step import RLData, make_seq_batch, rl_update


def batch(cfg, prompts: int, group: int, prompt_len: int, completion: int, shared: bool, grid=(1, 4, 4),
          pad: int = 7, full: bool = False) -> RLData:
    """`prompts` left-padded prompts of `prompt_len` tokens (`pad` of them padding), each holding one image of
    `grid` (t, h, w) patches, with `group` completions each: of random length up to `completion`, or all of it
    with `full`. The defaults are the main job's: 217-token prompts in the 224 bucket, one 64 px image."""
    rng = np.random.default_rng(0)
    vocab = cfg.text.vocab_size
    text_ids = np.arange(vocab)[~np.isin(np.arange(vocab), [cfg.image_token_id, cfg.video_token_id,
                                                            cfg.vision_start_token_id, cfg.vision_end_token_id])]
    n_img = int(np.prod(grid)) // cfg.vision.spatial_merge_size**2
    prompt = rng.choice(text_ids, size=(prompts, prompt_len))
    prompt[:, :pad] = 0
    prompt[:, pad + 2] = cfg.vision_start_token_id
    prompt[:, pad + 3 : pad + 3 + n_img] = cfg.image_token_id
    prompt[:, pad + 3 + n_img] = cfg.vision_end_token_id
    mask = (np.arange(prompt_len) >= pad)[None].repeat(prompts, 0).astype(np.int32)
    R = prompts * group
    grids = np.array([grid] * R)
    pixels = rng.standard_normal((int(grids.prod(-1).sum()), cfg.vision.patch_dim)).astype(np.float32)
    targets = rng.choice(text_ids, size=(R, completion))
    lengths = np.full(R, completion) if full else rng.integers(completion // 4, completion + 1, size=R)
    tmask = (np.arange(completion)[None] < lengths[:, None]).astype(np.int32)
    seq = make_seq_batch(cfg, np.repeat(prompt, group, 0), np.repeat(mask, group, 0), targets, tmask, pixels, grids,
                         row_group=np.arange(R) // group, row_image_counts=np.ones(R, np.int32),
                         group=group if shared else 1)
    old = jnp.asarray(rng.normal(-2.0, 0.5, (R, completion)), jnp.float32)
    return RLData(seq=seq, old_logp=old, ref_logp=jnp.zeros_like(old),
                  advantages=jnp.asarray(rng.standard_normal(R), jnp.float32), normalizer=jnp.float32(tmask.sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=224)
    parser.add_argument("--completion", type=int, default=192)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_job(None, args.overrides)
    mesh = build_mesh(cfg.mesh)
    policy = build_policy(cfg.policy, mesh)
    with jax.set_mesh(mesh):
        graphdef, trainable, frozen = nnx.split(policy.model, policy.trainable, ...)
        tx = optax.adamw(cfg.rl.optim.lr)
        opt_state = tx.init(trainable)
        mc = policy.model.cfg
        runs = {}
        for name, shared in (("whole rows", False), ("shared prefix", True)):
            data = batch(mc, args.prompts, args.group, args.prompt_len, args.completion, shared)
            t0 = time.perf_counter()
            compiled = rl_update.lower(graphdef, trainable, frozen, opt_state, data, cfg.rl.loss, 1.0, tx,
                                       None).compile()
            mem = compiled.memory_analysis()
            runs[name] = dict(data=data, compile_s=time.perf_counter() - t0, times=[], losses=[],
                              temp=getattr(mem, "temp_size_in_bytes", 0) if mem is not None else 0)
            print(f"  {name}: compiled in {runs[name]['compile_s']:.1f} s", file=sys.stderr, flush=True)
        for i in range(args.calls + 1):  # the first call of each is a warm-up
            for run in runs.values():
                # fresh copies: rl_update donates the weights and optimiser state it is given
                w, o = jax.tree.map(jnp.copy, trainable), jax.tree.map(jnp.copy, opt_state)
                t0 = time.perf_counter()
                _, _, loss, _, _ = rl_update(graphdef, w, frozen, o, run["data"], cfg.rl.loss, 1.0, tx, None)
                loss = float(loss)
                if i:
                    run["times"].append(time.perf_counter() - t0)
                    run["losses"].append(loss)
    R, P, N, G = args.prompts * args.group, args.prompt_len, args.completion, args.group
    tokens = {"whole rows": f"{R} x {P + N}", "shared prefix": f"{R // G} x {P} + {R} x {N}"}
    print(f"`JAX_PLATFORMS=cpu python benchmarks/training/shared_prefix.py --prompts {args.prompts} --group {G} "
          f"--prompt-len {P} --completion {N} --calls {args.calls}{''.join(' ' + o for o in args.overrides)}`; "
          f"{cpu_name()}, {os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f}), jax {jax.__version__}\n")
    print("| update | decoder tokens | s per update (median) | XLA temp (MB) | compile (s) |")
    print("|---|---:|---:|---:|---:|")
    for name, run in runs.items():
        print(f"| {name} | {tokens[name]} | {statistics.median(run['times']):.2f} | {run['temp'] / 2**20:.0f} | "
              f"{run['compile_s']:.1f} |")
    whole, shared = runs["whole rows"], runs["shared prefix"]
    print(f"\nwhole / shared: {statistics.median(whole['times']) / statistics.median(shared['times']):.2f}x time, "
          f"{whole['temp'] / max(shared['temp'], 1):.2f}x temp memory; largest loss difference "
          f"{max(abs(a - b) for a, b in zip(whole['losses'], shared['losses'])):.2e}")


if __name__ == "__main__":
    main()
