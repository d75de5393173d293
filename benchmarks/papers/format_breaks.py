"""Where a sampled completion leaves the method's format, and how likely the token that broke it was.

`python benchmarks/papers/format_breaks.py RUN_DIR [--config F] [--prompts N] [key=value ...]` loads the run's newest
weights, samples the RL stage's rollouts of N training prompts (its group size, temperature and token budget) and
scores them with the method's plug-in. For each malformed one it finds the breaking token: the first token k of the
completion such that greedy decoding goes on well-formed from the first k tokens but not from the first k + 1
(binary search over k, all malformed rollouts in one batch a round; it assumes one break, which the searched prefixes'
greedy continuations bear out where the search ends between a sound and an unsound prefix). Reported per breaking
token: its probability at temperature 1 and rank (1 = the policy's most likely token) in the policy's distribution,
and its kind: a byte fragment (it decodes to no whole character), a format word (its text is part of the method's
format: tags, JSON keys and punctuation, which the reference completions write), or other text.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import jax
import numpy as np

from spatial_jax import config as C
from spatial_jax.cli import one_line_errors
from spatial_jax.cli.script_guard import check_counts, check_own_output, write_own
from spatial_jax.data.pipeline import train_iterator
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.workspace import Workspace
from spatial_jax.rollout.collect import collect
from spatial_jax.rollout.sampler import decode, prefill

OWNER = Path(__file__).name
KINDS = ("byte fragment", "format word", "other text")


# what the formats write around the content: tag and JSON punctuation
FORMAT_CHARS = set('{}[],:"<>/()\n')


def token_kind(text: str, format_names: set[str]) -> str:
    """A token's kind (KINDS) from its decoded text: U+FFFD marks bytes that make no whole character; a format word
    is made of the format's punctuation alone, or is (a piece of) one of its tag or key names."""
    if "\ufffd" in text:
        return KINDS[0]
    core = text.strip().strip("".join(FORMAT_CHARS))
    if text.strip() and (not core or any(core in name for name in format_names)):
        return KINDS[1]
    return KINDS[2]


def format_names(references: list[str]) -> set[str]:
    """The tag and JSON key names the reference completions write (observe, scene, objects, bbox, ...)."""
    return {name for text in references for pair in re.findall(r"</?(\w+)>|\"(\w+)\":", text)
            for name in pair if name}


def first_break(sound, n: list[int], rounds: int | None = None) -> list[int]:
    """Per row r, the largest k in [0, n[r]) with sound(prefixes)[r] true for k, when the whole completion (k =
    n[r]) is unsound and k = 0 is sound: the token at index k broke it. `sound(ks)` -> list[bool] for one prefix
    length per row, called once a round for every row at once."""
    lo, hi = [0] * len(n), list(n)  # sound at lo, unsound at hi
    while any(h - lo_ > 1 for lo_, h in zip(lo, hi)):
        mid = [(lo_ + h) // 2 for lo_, h in zip(lo, hi)]
        for r, ok in enumerate(sound(mid)):
            if hi[r] - lo[r] > 1:
                lo[r], hi[r] = (mid[r], hi[r]) if ok else (lo[r], mid[r])
    return lo


def measure(cfg: TrainConfig, prompts: int, seed: int) -> dict:
    ws = Workspace(cfg)
    stage = ws.load_latest()
    if stage is None:
        raise C.ConfigError(f"{cfg.run_dir} holds no checkpoint to measure")
    tok, method = ws.tok, ws.method
    rc = cfg.rl
    sampling = dataclasses.replace(rc.sampling, stop_token_ids=(tok.im_end_id,), pad_token_id=tok.pad_id)
    batch = next(train_iterator(cfg.data, tok, method.prompt, prompts, image_cfg=ws.policy.image_cfg))
    model = ws.model
    with jax.set_mesh(ws.mesh):
        got = collect(model, batch, tok, method, ws.reward_cfg, sampling, rc.group_size, seed)
    comps, G = got.completions, rc.group_size
    lengths = comps.mask.sum(axis=1).astype(int)
    broken = [r for r, s in enumerate(got.scores) if not method.well_formed(s)]
    out = {"run_dir": cfg.run_dir, "stage": stage, "rollouts": len(got.scores),
           "malformed_share": len(broken) / len(got.scores), "prompts": prompts, "group_size": G, "seed": seed}
    if not broken:
        return out
    records = batch.records
    # every searched prefix is one row of a fixed [B, P + N] block (left-padded), so one program serves each round
    P, N = batch.input_ids.shape[1], comps.tokens.shape[1]
    greedy = dataclasses.replace(sampling, temperature=0.0, seed=0)
    rows = [r // G for r in broken]
    items, patches = np.concatenate([[0], np.cumsum(batch.image_counts)]), np.concatenate(
        [[0], np.cumsum(np.prod(batch.image_grid_thw, axis=-1))])

    def run(ks: list[int]):
        ids = np.full((len(broken), P + N), tok.pad_id, np.int32)
        mask = np.zeros_like(ids)
        for b, (r, k) in enumerate(zip(broken, ks)):
            row = np.concatenate([batch.input_ids[rows[b]][batch.attention_mask[rows[b]] > 0], comps.tokens[r, :k]])
            ids[b, -len(row):], mask[b, -len(row):] = row, 1
        pixels = np.concatenate([batch.pixel_values[patches[items[p]]:patches[items[p + 1]]] for p in rows])
        grid = np.concatenate([batch.image_grid_thw[items[p]:items[p + 1]] for p in rows])
        with jax.set_mesh(ws.mesh):
            state = prefill(model, ids, mask, pixel_values=pixels, image_grid_thw=grid, max_len=P + 2 * N)
            logits = np.asarray(state.logits)
            _, sample = decode(model, state, greedy)
        return logits, np.asarray(sample.tokens), np.asarray(sample.mask)

    def sound(ks: list[int]) -> list[bool]:
        _, tokens, mask = run(ks)
        texts = [tok.decode(tok.trim_completion([*comps.tokens[r, :k], *tokens[b][mask[b] > 0]]))
                 for b, (r, k) in enumerate(zip(broken, ks))]
        scores = method.score_batch([records[rows[b]].to_rollout(t) for b, t in enumerate(texts)], ws.reward_cfg)
        return [bool(method.well_formed(s)) for s in scores]

    # greedy from the prompt alone: where it is malformed too, no token of the sample broke the format
    whole_ok = sound([0] * len(broken))
    out["greedy_from_prompt_well_formed"] = float(np.mean(whole_ok))
    broken = [r for r, ok in zip(broken, whole_ok) if ok]
    rows = [r // G for r in broken]
    if not broken:
        return out
    ks = first_break(sound, [int(lengths[r]) for r in broken])
    logits, _, _ = run(ks)
    names = format_names([s.reference[method.prompt.reference_key] for s in records])
    found = []
    for b, (r, k) in enumerate(zip(broken, ks)):
        t = int(comps.tokens[r, k])
        found.append({"rollout": r, "index": k, "of": int(lengths[r]), "token": tok.decode([t]),
                      "p": float(np.exp(comps.logprobs[r, k])),
                      "rank": int(np.sum(logits[b] > logits[b, t])) + 1,
                      "kind": token_kind(tok.decode([t]), names)})
    p = np.array([f["p"] for f in found])
    out.update({"breaks": found,
                "p_median": float(np.median(p)), "p_below_0.01": float(np.mean(p < 0.01)),
                "rank_median": float(np.median([f["rank"] for f in found])),
                "kinds": {k: sum(f["kind"] == k for f in found) for k in KINDS},
                "vocabulary": len(tok)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--config", required=True, help="the run's config; key=value as the run had them")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON file to write the figures and every break to")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_intermixed_args(argv)
    return one_line_errors("format_breaks.py", lambda: run(args))


def run(args: argparse.Namespace) -> int:
    check_counts({"--prompts": (args.prompts, 1, 10**5), "--seed": (args.seed, 0, 2**31)})
    if args.out:
        check_own_output(args.out, "--out", OWNER, [args.run_dir, args.config])
    cfg = C.load(TrainConfig, args.config, [*args.overrides, f"run_dir={args.run_dir}", "progress=false",
                                            "tensorboard=false"])
    result = measure(cfg, args.prompts, args.seed)
    summary = {k: v for k, v in result.items() if k != "breaks"}
    print(json.dumps(summary, indent=1))
    if args.out:
        write_own(args.out, result, OWNER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
