"""Multi-turn tool rollouts: the synthetic tools, the token layout, masks, and log-prob consistency with training.

Model turns are teacher-forced by `ScriptedDecode`, which runs the sampler's own per-token model step on scripted
tokens (so their log-probs are the policy's, taken from the KV cache as in sampling); unscripted rounds use the
real sampler. The consistency check recomputes log-probs with the trainer's forward (make_seq_batch +
target_logprobs) and compares at model-token positions (tolerance 1e-4, float32).
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st_

from spatial_jax.data import synthetic
from spatial_jax.data.pipeline import collate, encode_sample
from spatial_jax.data.prompts import HARNESS
from spatial_jax.models import decode_positions
from spatial_jax.rewards import parse_harness as ph
from spatial_jax.rl import step as st
from spatial_jax.rl.config import MeshConfig, PolicyConfig
from spatial_jax.rl.policy import build_mesh, build_policy
from spatial_jax.rollout import logits as lg
from spatial_jax.rollout import multiturn as mt
from spatial_jax.rollout import tools as T
from spatial_jax.rollout.completions import to_rollouts
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.sampler import SampleOutput, decode

W2M_ARGS = {"categories": ["circle", "square"], "knowledge_type": "landmark", "output_format": "rectangle",
            "scene_type": "indoor"}
N_NEW = 128
MAX_TOOL = 160
MAX_TURNS = 3


def cache_len(batch) -> int:
    """One cache size for every rollout here, so the sampler compiles once for the module."""
    return mt.required_cache_len(batch.input_ids.shape[1], N_NEW, MAX_TURNS, MAX_TOOL)


def call_text(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def sample():
    return synthetic.make_sample(synthetic.SyntheticConfig(), "train", 0)


# ------------------------------------------------------------------ tools


def _centre(o, size):
    x1, y1, x2, y2 = o["bbox"]
    return (x1 + x2) / 2 * 1000 / size[0], (y1 + y2) / 2 * 1000 / size[1]


def test_world2mind_lists_requested_objects_in_the_normalised_frame(sample):
    tools = T.default_tools()
    out = tools["world2mind"](W2M_ARGS, sample)
    assert out == tools["world2mind"](dict(W2M_ARGS), sample)  # deterministic
    objects = sample.meta["objects"]
    wanted = [o for o in objects if o["shape"] in ("circle", "square")]
    assert wanted and len(wanted) < len(objects)
    assert out.count("- Node_ID:") == len(wanted)
    for o in objects:
        cx, cy = _centre(o, sample.image_size)
        node = f"Center: ({int(round(cx))}, {int(round(cy))})"
        assert (node in out) == (o in wanted), o
    w, h = (o["bbox"][2] - o["bbox"][0]) * 1000 / 96, (o["bbox"][3] - o["bbox"][1]) * 1000 / 96
    assert f"Width: {int(round(w))} Height: {int(round(h))}" in out
    ellipse = tools["world2mind"](dict(W2M_ARGS, output_format="ellipse", knowledge_type="both"), sample)
    assert f"Semi_Axes: ({int(round(w / 2))}, {int(round(h / 2))})" in ellipse and "Traversable_Grid" in ellipse


def test_view_image_layout_and_route_grid(sample):
    tools = T.default_tools()
    layout = tools["view_image"]({"visualization_type": "landmark_vis"}, sample)
    lines = dict(line.split(": ", 1) for line in layout.splitlines()[1:])
    assert len(lines) == 9
    for o in sample.meta["objects"]:
        cx, cy = _centre(o, sample.image_size)
        row, col = ("top", "middle", "bottom")[int(cy * 3 / 1000)], ("left", "centre", "right")[int(cx * 3 / 1000)]
        cell = f"{row}-{col}"
        assert o["label"] in lines[cell].split(", ")
    grid = tools["view_image"]({"visualization_type": "route_vis"}, sample).splitlines()[1:]
    assert len(grid) == 10 and all(len(row) == 10 and set(row) <= {"#", "."} for row in grid)
    # A cell is occupied exactly when some object's box overlaps it (cells of 9.6 px in a 96 px image).
    for r in range(10):
        for c in range(10):
            hit = any(b[0] < (c + 1) * 9.6 and b[2] > c * 9.6 and b[1] < (r + 1) * 9.6 and b[3] > r * 9.6
                      for b in (o["bbox"] for o in sample.meta["objects"]))
            assert (grid[r][c] == "#") == hit, (r, c)
    route = tools["world2mind"](dict(W2M_ARGS, knowledge_type="route"), sample)
    assert f"Total_Traversable_Cells: {sum(row.count('.') for row in grid)}" in route
    assert "Node_ID" not in route


@pytest.mark.parametrize(
    "call, needle",
    [
        (None, "no complete tool call"),
        (ph.parse_call("not json"), "not valid JSON"),
        (ph.parse_call('{"name": "teleport<x>", "arguments": {}}'), "unknown tool 'teleportx'"),
        (ph.parse_call('{"name": "world2mind", "arguments": {"categories": ["circle"]}}'), "knowledge_type"),
        (ph.parse_call(json.dumps({"name": "world2mind", "arguments": dict(W2M_ARGS, knowledge_type="x")})),
         "knowledge_type 'x' is not one of"),
        (ph.parse_call(json.dumps({"name": "world2mind", "arguments": dict(W2M_ARGS, categories=["pentagon"])})),
         "none of the requested categories"),
        (ph.parse_call('{"name": "view_image", "arguments": {"visualization_type": "depth"}}'), "'depth' is not one"),
    ],
)
def test_bad_calls_come_back_as_error_text(sample, call, needle):
    out = T.run_call(call, T.default_tools(), sample)
    assert out.startswith("Error: ") and needle in out


@pytest.mark.parametrize("meta, needle", [({}, "no scene map"), ({"objects": [{"label": "x"}]}, "malformed")])
def test_a_sample_without_a_usable_scene_map_is_an_error_text(sample, meta, needle):
    bare = dataclasses.replace(sample, meta=meta, gt_boxes=(), scene=None)  # nor pseudo-GT boxes nor a scene graph
    out = T.default_tools()["view_image"]({"visualization_type": "landmark_vis"}, bare)
    assert out.startswith("Error: ") and needle in out


_json = st_.recursive(st_.none() | st_.booleans() | st_.integers() | st_.floats() | st_.text(max_size=8),
                      lambda c: st_.lists(c, max_size=3) | st_.dictionaries(st_.text(max_size=8), c, max_size=3),
                      max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(name=st_.sampled_from(["world2mind", "view_image", "other"]),
       arguments=st_.dictionaries(st_.sampled_from(list(W2M_ARGS) + ["visualization_type", "x"]), _json, max_size=6))
def test_any_json_call_returns_text(sample, name, arguments):
    out = T.run_call(ph.parse_call(json.dumps({"name": name, "arguments": arguments})), T.default_tools(), sample)
    assert isinstance(out, str) and out


# ------------------------------------------------------------------ rollouts


@functools.partial(jax.jit, static_argnums=(0, 5))
def _forced_step(graphdef, params, state, tok, stop_ids, temperature):
    """One sampler decode step with the token given instead of drawn (same model call, cache and bookkeeping)."""
    model = nnx.merge(graphdef, params)
    live = ~state.done
    tok = jnp.where(live, tok, 0)
    lp = jnp.where(live, lg.token_logprob(state.logits, tok, temperature), 0.0)
    ent = jnp.where(live, lg.entropy(state.logits), 0.0)
    stopped = live & jnp.any(tok[:, None] == stop_ids[None, :], axis=1)
    logits, cache = model(tok[:, None], positions=decode_positions(state.num_real, state.rope_deltas),
                          attention_mask=live[:, None].astype(jnp.int32), cache=state.cache,
                          cache_index=state.cache_index)
    state = state.replace(cache=cache, cache_index=state.cache_index + 1,
                          num_real=state.num_real + live.astype(jnp.int32), logits=logits[:, 0],
                          done=state.done | stopped)
    return state, tok, lp, ent, live


class ScriptedDecode:
    """A `decode` stand-in: round k teacher-forces scripts[k][row] (text) on the live rows; rounds past the
    scripts use the real sampler. A script ends with a stop token or fills the round (then the row is truncated)."""

    def __init__(self, tokenizer, scripts):
        self.tok = tokenizer
        self.scripts = [[tokenizer.encode(text) for text in rnd] for rnd in scripts]
        self.calls = 0

    def __call__(self, model, state, cfg):
        k, self.calls = self.calls, self.calls + 1
        if k >= len(self.scripts):
            return decode(model, state, cfg)
        B, N = state.done.shape[0], cfg.max_new_tokens
        script = np.zeros((B, N), np.int32)
        done = np.asarray(state.done)
        for r, ids in enumerate(self.scripts[k]):
            if not done[r]:
                assert ids and len(ids) <= N and (ids[-1] in cfg.stop_token_ids or len(ids) == N), (k, r)
                script[r, : len(ids)] = ids
        graphdef, params = nnx.split(model)
        stop_ids = jnp.asarray(cfg.stop_token_ids, jnp.int32)
        cols = []
        for s in range(N):
            if bool(np.all(np.asarray(state.done))):
                break
            state, tok, lp, ent, live = _forced_step(graphdef, params, state, jnp.asarray(script[:, s]), stop_ids,
                                                     cfg.temperature)
            cols.append((tok, lp, ent, live))
        out = SampleOutput(
            tokens=np.zeros((B, N), np.int32), logprobs=np.zeros((B, N), np.float32),
            entropies=np.zeros((B, N), np.float32), mask=np.zeros((B, N), np.int32), lengths=np.zeros(B, np.int32),
        )
        for s, (tok, lp, ent, live) in enumerate(cols):
            out.tokens[:, s], out.logprobs[:, s], out.entropies[:, s] = tok, lp, ent
            out.mask[:, s] = np.asarray(live)
        return state, out


@functools.partial(jax.jit, static_argnums=(0, 3))
def _target_logprobs(graphdef, params, seq, temperature):
    return st.target_logprobs(nnx.merge(graphdef, params), seq, temperature)[0]


def recompute_logprobs(policy, comps, attention, temperature):
    """The trainer's log-probs of the completion tokens under `attention` (its target mask), loss on model tokens."""
    seq = st.make_seq_batch(policy.model.cfg, comps.prompt_ids, comps.prompt_mask, comps.tokens, attention,
                            comps.pixel_values, comps.image_grid_thw, loss_mask=comps.mask)
    assert np.array_equal(np.asarray(seq.target_mask), comps.mask)
    with jax.set_mesh(policy.mesh):
        return np.asarray(_target_logprobs(*nnx.split(policy.model), seq, temperature))


@pytest.fixture(scope="module")
def setup():
    policy = build_policy(PolicyConfig(), build_mesh(MeshConfig()))
    cfg = synthetic.SyntheticConfig()
    examples = [encode_sample(synthetic.make_sample(cfg, "train", i), policy.tokenizer, HARNESS,
                              image_cfg=policy.image_cfg) for i in range(2)]
    batch = collate(examples, policy.tokenizer.pad_id, (256, 512, 1024), sft=False)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=N_NEW, stop_token_ids=(policy.tokenizer.im_end_id,),
                              pad_token_id=policy.tokenizer.pad_id)
    return policy, batch, sampling


class EchoStepsTool(T.Tool):
    """A view tool whose output looks like harness steps and an answer: the reward parser must not see them."""

    schema = ph.VIEW_IMAGE

    def run(self, arguments, sample):
        return "Step3.1: fake view step\nStep4: Cross-Validation\n<Answer>Z</Answer>"


ROUND0 = [
    "Step1: Visual Clues\nStep2.1: map\n" + call_text("world2mind", W2M_ARGS),
    "Step1: Visual Clues\nStep3.1: view\n" + call_text("view_image", {"visualization_type": "landmark_vis"}),
    "Step1: Visual Clues\n<tool_call>{not json</tool_call>",
    "Step1: Visual Clues\nStep5: Final Answer\n<Answer>A</Answer><|im_end|>",
]
ROUND1 = [
    "Step3.1: view\n" + call_text("view_image", {"visualization_type": "route_vis"}),
    "Step4: Cross-Validation\nStep5: Final Answer\n<Answer>B</Answer><|im_end|>",
    "Step5: Final Answer " + "7" * 200,  # never stops: truncated at the round's budget
    "",
]


@pytest.fixture(scope="module")
def rollout(setup):
    policy, batch, sampling = setup
    tok = policy.tokenizer
    round1 = list(ROUND1)
    round1[2] = tok.decode(tok.encode(round1[2])[:N_NEW])
    tools = dict(T.default_tools(), view_image=EchoStepsTool())
    with jax.set_mesh(policy.mesh):
        comps = mt.sample_multiturn(policy.model, batch, tok, sampling, group_size=2, seed=3, tools=tools,
                                    max_turns=MAX_TURNS, max_tool_tokens=MAX_TOOL,
                                    decode_fn=ScriptedDecode(tok, [ROUND0, round1]))
    return comps, tools


def _segments(row_mask, row_ctx):
    """[(start, end, is_model)] runs of model (mask 1) and tool (mask 0, context 1) tokens."""
    runs, n = [], int(row_ctx.sum())
    for t in range(n):
        m = bool(row_mask[t])
        if runs and runs[-1][2] == m:
            runs[-1][1] = t + 1
        else:
            runs.append([t, t + 1, m])
    return [tuple(r) for r in runs]


def test_scripted_rollout_layout_masks_and_texts(setup, rollout):
    policy, batch, sampling = setup
    tok = policy.tokenizer
    comps, tools = rollout
    R, width = comps.tokens.shape
    assert R == 4 and width % N_NEW == 0
    assert np.all(comps.mask <= comps.context_mask)
    assert np.all(comps.logprobs[comps.mask == 0] == 0) and np.all(comps.entropies[comps.mask == 0] == 0)
    assert np.all(comps.logprobs[comps.mask == 1] < 0)
    assert np.all(comps.tokens[comps.context_mask == 0] == tok.pad_id)
    assert comps.num_tool_calls[1:].tolist() == [1, 1, 0] and comps.num_tool_calls[0] >= 2
    # Row 0: world2mind answered with the exact tool turn, then the echo tool, then free sampling.
    segs = _segments(comps.mask[0], comps.context_mask[0])
    assert [s[2] for s in segs[:4]] == [True, False, True, False]
    s, e, _ = segs[1]
    rec0 = batch.records[0]
    expected = mt.tool_turn_ids(tok, tools["world2mind"](W2M_ARGS, rec0), MAX_TOOL)
    assert comps.tokens[0, s:e].tolist() == expected
    assert comps.tokens[0, : segs[0][1]].tolist() == tok.encode(ROUND0[0])
    text0 = comps.texts[0]
    assert tools["world2mind"](W2M_ARGS, rec0)[:60] in text0
    parsed = ph.parse(text0)
    assert [c.name for c in parsed.tool_calls[:2]] == ["world2mind", "view_image"]
    assert all(c.valid for c in parsed.tool_calls[:2])
    assert not parsed.has_step(4) and parsed.answer is None  # the echo tool's Step4 / <Answer> lie in responses
    assert len(ph.response_spans(text0)) == comps.num_tool_calls[0]
    # Row 1: view call answered by the echo tool, then Step4/5 and an answer; the response's fake steps are ignored.
    parsed1 = ph.parse(comps.texts[1])
    assert parsed1.answer == "B" and parsed1.cross_check_after_tools
    assert [(s_.major, s_.minor) for s_ in parsed1.steps] == [(1, None), (3, 1), (4, None), (5, None)]
    assert comps.texts[1].endswith("</Answer>")  # the final <|im_end|> is not text
    # Row 2: malformed call -> an error response; then truncated after a full round.
    assert "Error: the tool call is not valid JSON" in comps.texts[2] and ph.parse(comps.texts[2]).n_malformed == 1
    assert int(comps.mask[2].sum()) == len(tok.encode(ROUND0[2])) + N_NEW
    # Row 3: no tool: model tokens only.
    assert np.array_equal(comps.mask[3], comps.context_mask[3]) and comps.texts[3].endswith("<Answer>A</Answer>")
    # Records: the text is whole, the generated-token count is model tokens only.
    rollouts = to_rollouts(batch, comps, 2, step=0)
    assert [r.num_generated_tokens for r in rollouts] == comps.mask.sum(axis=1).tolist()
    for r in range(R):
        n = len(comps.offsets[r])
        assert tok.decode(comps.tokens[r, :n]) == comps.texts[r]


def test_training_forward_reproduces_sampler_logprobs(setup, rollout):
    policy, _, sampling = setup
    comps, _ = rollout
    lp = recompute_logprobs(policy, comps, comps.context_mask, sampling.temperature)
    m = comps.mask == 1
    assert np.max(np.abs(lp[m] - comps.logprobs[m])) <= 1e-4
    # Hiding the tool tokens from attention (mask used as the attention mask) changes the later turns' log-probs.
    hidden = recompute_logprobs(policy, comps, comps.mask, sampling.temperature)
    after_tool = m & (np.cumsum(comps.context_mask - comps.mask, axis=1) > 0)
    assert after_tool.any() and np.max(np.abs(hidden[after_tool] - comps.logprobs[after_tool])) > 1e-3


def test_max_turns_caps_tool_turns(setup):
    policy, batch, sampling = setup
    tok = policy.tokenizer
    call = call_text("view_image", {"visualization_type": "landmark_vis"})
    scripts = [[call] * 4, [call] * 4]
    with jax.set_mesh(policy.mesh):
        comps = mt.sample_multiturn(policy.model, batch, tok, sampling, group_size=2, seed=0, max_turns=1,
                                    max_tool_tokens=MAX_TOOL, max_len=cache_len(batch),
                                    decode_fn=ScriptedDecode(tok, scripts))
    assert comps.num_tool_calls.tolist() == [1, 1, 1, 1]
    for text in comps.texts:
        assert text.count("<tool_call>") == 2 and text.count("<tool_response>") == 1
        assert text.endswith("</tool_call>")  # the second call gets no answer: the turn budget is spent


def test_cache_and_tool_budget_are_checked_up_front(setup):
    policy, batch, sampling = setup
    tok = policy.tokenizer
    need = mt.required_cache_len(batch.input_ids.shape[1], N_NEW, 2, MAX_TOOL)
    assert need == batch.input_ids.shape[1] + 3 * N_NEW + 2 * MAX_TOOL and cache_len(batch) > need
    with pytest.raises(ValueError, match="KV cache too small"):
        mt.sample_multiturn(policy.model, batch, tok, sampling, 2, 0, max_turns=2, max_tool_tokens=MAX_TOOL,
                            max_len=need - 1)
    with pytest.raises(ValueError, match="leaves no room for tool output"):
        mt.sample_multiturn(policy.model, batch, tok, sampling, 2, 0, max_tool_tokens=8)
    with pytest.raises(ValueError, match="max_turns"):
        mt.sample_multiturn(policy.model, batch, tok, sampling, 2, 0, max_turns=-1)


def test_real_sampler_rollout_is_consistent(setup):
    """The real sampler end to end (random tiny policy: a call, if any, is malformed and answered with an error)."""
    policy, batch, sampling = setup
    with jax.set_mesh(policy.mesh):
        comps = mt.sample_multiturn(policy.model, batch, policy.tokenizer, sampling, group_size=2, seed=1,
                                    max_turns=MAX_TURNS, max_tool_tokens=MAX_TOOL)
    lp = recompute_logprobs(policy, comps, comps.context_mask, sampling.temperature)
    m = comps.mask == 1
    assert m.any() and np.all(comps.mask <= comps.context_mask)
    assert np.max(np.abs(lp[m] - comps.logprobs[m])) <= 1e-4
