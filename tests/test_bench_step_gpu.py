"""benchmarks/training/step_gpu.py on CPU: the FLOP bookkeeping behind its MFU, the roofline's byte count, the engine's
fixed-context decode inputs, and both parts end to end on the tiny policy."""

import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "benchmarks" / "training"))

import step_gpu  # noqa: E402

from spatial_jax.models import Qwen3VL  # noqa: E402
from spatial_jax.rollout.config import SamplingConfig  # noqa: E402
from spatial_jax.rollout.engine import SCRATCH_PAGE, Engine  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    mc = step_gpu.model_config("tiny")
    return mc, Qwen3VL(mc, rngs=nnx.Rngs(0))


def test_parameter_counts_cover_every_weight_once(tiny):
    mc, model = tiny
    counts = step_gpu.parameter_counts(model)
    assert sum(counts.values()) == sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert counts["embed_tokens"] == mc.text.vocab_size * mc.text.hidden_size and "lm_head" not in counts  # tied
    assert counts["merger"] > 0 and counts["vision"] > 0 and counts["decoder"] > counts["norm"]


def test_shared_prefix_saves_exactly_the_recomputed_prompts(tiny):
    # whole rows run each prompt G times; the shared update once: the difference is (G - 1) prompts' decoder
    # matmuls and causal attention per prompt, x 3 for the update; images and completions cost the same
    mc, model = tiny
    counts = step_gpu.parameter_counts(model)
    t = mc.text
    prompts, G, P, N, grid = 3, 4, 40, 24, (1, 4, 4)
    whole = step_gpu.model_flops(mc, counts, prompts, G, P, N, grid, shared=False)
    shared = step_gpu.model_flops(mc, counts, prompts, G, P, N, grid, shared=True)
    prompt = 2 * counts["decoder"] * P + 4 * t.num_attention_heads * t.head_dim * t.num_hidden_layers * P * (P + 1) / 2
    assert whole - shared == pytest.approx(3 * (G - 1) * prompts * prompt, rel=1e-12)
    # the LM head runs on completion tokens only: doubling the prompt leaves its share alone
    longer = step_gpu.model_flops(mc, counts, prompts, G, 2 * P, N, grid, shared=True)
    assert longer > shared


def test_decode_weight_bytes_read_leave_out_the_vision_tower(tiny):
    mc, model = tiny
    counts = step_gpu.parameter_counts(model)
    read = counts["decoder"] + counts["norm"] + counts["embed_tokens"]  # the tied head is the embedding table
    assert step_gpu.weight_bytes_read(model) == 4 * read  # float32 weights


def test_engine_inputs_at_a_fixed_context(tiny):
    _, model = tiny
    engine = Engine(model, SamplingConfig(max_new_tokens=8, chunk=8), slots=3, max_len=72, page_size=16, chunk=8)
    table, lengths, deltas, live, rows, drawn, budget = engine.chunk_inputs_at(50)
    need = -(-(50 + 8) // 16)
    assert lengths.tolist() == [50] * 3 and budget.tolist() == [8] * 3 and live.all() and not drawn.any()
    assert rows.tolist() == [0, 1, 2] and not deltas.any()
    pages = table[:, :need]
    assert len(set(pages.ravel().tolist())) == 3 * need and SCRATCH_PAGE not in pages
    assert (table[:, need:] == SCRATCH_PAGE).all()
    with pytest.raises(ValueError, match="does not fit"):  # 73 + 8 tokens: more than max_len's 5 pages
        engine.chunk_inputs_at(73)


@pytest.mark.slow
def test_every_part_end_to_end_on_the_tiny_policy(tmp_path, capsys):
    """`all` as the GPU session runs it, on the tiny policy: decode arms with and without command buffers, an update
    arm, and whole RL steps reusing its compiled update; one JSON, three tables. (The engine with the Pallas decode
    kernel: test_engine; the flash kernel: test_gpu_kernels; here they would only add interpreter compiles.)"""
    out = tmp_path / "all.json"
    step_gpu.main(["all", "--model", "tiny", "--prompts", "2", "--group", "2", "--prompt-len", "48", "--completion",
                   "8", "--image", "64", "--steps", "1", "--arms", "shared:full:xla", "--matmul-n", "128", "--slots",
                   "2", "--context", "40", "--chunk", "4", "--decode-arms", "xla", "xla+graph", "--repeats", "1",
                   "--copy-gib", "0.01", "--step-arms", "xla/shared:full:xla", "xla/best", "xla/whole:dots:xla",
                   "--out", str(out)])
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    d, rl = r["decode"], r["rl"]
    assert [(c["slots"], c["arm"]) for c in d["cases"]] == [(2, "xla"), (2, "xla+graph")]
    for c in d["cases"]:
        assert c["of_roofline"] == pytest.approx(c["roofline_s"] / c["step_s"])
    (run,) = rl["variants"]["shared:full:xla"]
    assert run["attention"] == "xla" and run["remat"] == "full" and np.isfinite(run["losses"]).all()
    assert run["mfu"] == pytest.approx(run["model_flops"] / run["seconds"] / 989e12)
    done, best, missing = rl["steps"]
    assert done["completion_tokens"] == 2 * 2 * 8 and done["step_s"] == done["rollout_s"] + done["update_s"] > 0
    assert done["command_buffer_error"] is None and np.isfinite(done["loss"])
    assert best["arm"] == "xla/shared:full:xla" and np.isfinite(best["loss"])  # the only update arm
    assert "was not measured" in missing["error"]  # its update arm was not among --arms: reported, not a crash
    assert "| 2 | xla+graph |" in printed and "| shared:full:xla | full | xla |" in printed
    assert "| xla/shared:full:xla |" in printed


def test_arms_are_checked_before_anything_runs(capsys):
    for argv in (["rl", "--arms", "whole:fulll:auto"], ["all", "--step-arms", "pallas/whole:full"],
                 ["decode", "--decode-arms", "graph"]):
        with pytest.raises(SystemExit):
            step_gpu.main(argv)
        assert "error" in capsys.readouterr().err
