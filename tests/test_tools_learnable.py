"""AlloSpatial tools a policy can learn: the system prompt names the tools and their arguments, `view_image`'s
picture goes through the vision tower in the next turn, World2Mind maps what a sample carries, and the SFT targets
call tools the harness parser accepts and the tools answer.

The picture check teacher-forces the model turns (one sampler step per scripted token, the sampler's own model call
and cache) and compares the sampler's log-probs and entropies with one training forward over the whole conversation
(float32, 1e-5); blanking the picture's pixels in that forward must change the tokens after it.
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
from test_rollout_multiturn import _forced_step

import spatial_jax.methods  # noqa: F401 (registers the AlloSpatial SFT target builder)
from spatial_jax.data import synthetic, tool_turns
from spatial_jax.data import world_map as wm
from spatial_jax.data.pipeline import DataConfig, collate, encode_sample
from spatial_jax.data.prompts import HARNESS
from spatial_jax.records import GTBox
from spatial_jax.rewards import allospatial as allospatial_rewards
from spatial_jax.rewards import parse_harness as ph
from spatial_jax.rl import step as st
from spatial_jax.rl.config import MeshConfig, PolicyConfig
from spatial_jax.rl.policy import build_mesh, build_policy
from spatial_jax.rollout import multiturn as mt
from spatial_jax.rollout import tools as T
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.sampler import SampleOutput

N_NEW = 96
MAX_TOOL = 160
VIEW = {"visualization_type": "landmark_vis"}


def call_text(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.fixture(scope="module")
def sample():
    return synthetic.make_sample(synthetic.SyntheticConfig(), "train", 0)


# ------------------------------------------------------------------ prompt and tools


def test_system_prompt_lists_every_tool_with_its_arguments():
    for schema in ph.TOOL_SCHEMAS:
        assert f"- {schema.name}: " in HARNESS.system
        for arg in schema.required:
            assert f'"{arg}"' in HARNESS.system, (schema.name, arg)
    for values in (wm.KNOWLEDGE_TYPES, wm.FOOTPRINTS, wm.SCENE_TYPES, wm.VISUALIZATION_TYPES):
        for v in values:
            assert v in HARNESS.system, v


def test_view_image_answers_with_a_picture_of_the_layout(sample):
    tool = T.default_tools()["view_image"]
    picture = tool.picture(VIEW, sample)
    assert picture.shape == (wm.PICTURE_SIDE, wm.PICTURE_SIDE, 3) and picture.dtype == np.uint8
    objects = wm.scene_objects(sample)
    for i, o in enumerate(objects):  # each footprint's centre shows its node colour unless a later one covers it
        cx, cy = ((o["box"][0] + o["box"][2]) / 2 * wm.PICTURE_SIDE / 1000, (o["box"][1] + o["box"][3]) / 2
                  * wm.PICTURE_SIDE / 1000)
        covered = any(p["box"][0] <= cx * 1000 / wm.PICTURE_SIDE <= p["box"][2]
                      and p["box"][1] <= cy * 1000 / wm.PICTURE_SIDE <= p["box"][3] for p in objects[i + 1:])
        if not covered:
            assert tuple(picture[int(cy), int(cx)]) == wm._PALETTE[i % len(wm._PALETTE)]
    route = tool.picture({"visualization_type": "route_vis"}, sample)
    grid = wm.route_grid(objects)
    cell = wm.PICTURE_SIDE // 10 - 1  # a pixel inside each cell
    for r in range(10):
        for c in range(10):
            dark = tuple(route[int(r * wm.PICTURE_SIDE / 10) + cell // 2, int(c * wm.PICTURE_SIDE / 10) + cell // 2])
            assert (dark == (40, 40, 40)) == (grid[r][c] == "#"), (r, c)
    assert tool.picture({"visualization_type": "depth"}, sample) is None  # an error text has no picture
    assert T.default_tools()["world2mind"].picture({"categories": ["circle"], "knowledge_type": "landmark",
                                                    "output_format": "rectangle", "scene_type": "indoor"},
                                                   sample) is None


def test_world2mind_maps_gt_boxes_or_a_scene_graph_and_names_what_is_missing(sample):
    args = {"categories": ["red circle"], "knowledge_type": "landmark", "output_format": "rectangle",
            "scene_type": "indoor"}
    w2m = T.default_tools()["world2mind"]
    boxes = dataclasses.replace(sample, meta={}, scene=None, gt_boxes=(GTBox((100, 200, 300, 400), "red circle"),))
    out = w2m(args, boxes)
    assert "Center: (200, 300)" in out and "Width: 200 Height: 200" in out and "no depth" in out
    graph = dataclasses.replace(sample, meta={}, gt_boxes=(), image_size=(100, 50),
                                scene={"objects": [{"id": "red_circle.1", "bbox": [10, 10, 30, 20]}]})
    assert "Center: (200, 300)" in w2m(args, graph)
    poses = dataclasses.replace(boxes, meta={"camera_poses": [{"image": 1, "position": [0.5, -1], "heading_deg": 90}]})
    assert "Camera_Views:" in w2m(args, poses) and "Position: (0.500, -1.000) Heading_Deg: 90.0" in w2m(args, poses)
    bare = dataclasses.replace(sample, meta={}, gt_boxes=(), scene=None)
    for tool, call in ((w2m, args), (T.default_tools()["view_image"], VIEW)):
        text = tool(call, bare)
        assert text.startswith("Error: ") and "no object boxes" in text and "no depth" in text
        assert "camera poses" in text and tool.picture(call, bare) is None
    bad = dataclasses.replace(sample, meta={}, gt_boxes=(GTBox((0, 0, float("nan"), 5), "x"),))
    assert w2m(args, bad).startswith("Error: ") and "malformed" in w2m(args, bad)


# ------------------------------------------------------------------ the picture turn



class Forced:
    """A `decode` stand-in that teacher-forces scripts[k][row] in round k (each script ends with a stop token)."""

    def __init__(self, tokenizer, scripts):
        self.scripts = [[tokenizer.encode(text) for text in rnd] for rnd in scripts]
        self.calls = 0

    def __call__(self, model, state, cfg):
        k, self.calls = self.calls, self.calls + 1
        B, N = state.done.shape[0], cfg.max_new_tokens
        script = np.zeros((B, N), np.int32)
        for r, ids in enumerate(self.scripts[k]):
            script[r, : len(ids)] = ids
        out = SampleOutput(tokens=np.zeros((B, N), np.int32), logprobs=np.zeros((B, N), np.float32),
                           entropies=np.zeros((B, N), np.float32), mask=np.zeros((B, N), np.int32),
                           lengths=np.zeros(B, np.int32))
        graphdef, params = nnx.split(model)
        stops = jnp.asarray(cfg.stop_token_ids, jnp.int32)
        for s in range(N):
            if bool(np.all(np.asarray(state.done))):
                break
            state, tok, lp, ent, live = _forced_step(graphdef, params, state, jnp.asarray(script[:, s]), stops,
                                                     cfg.temperature)
            out.tokens[:, s], out.logprobs[:, s], out.entropies[:, s] = tok, lp, ent
            out.mask[:, s] = np.asarray(live)
        return state, out


@functools.partial(jax.jit, static_argnums=(0, 3))
def _forward(graphdef, params, seq, temperature):
    return st.target_logprobs(nnx.merge(graphdef, params), seq, temperature)


@pytest.fixture(scope="module")
def policy():
    return build_policy(PolicyConfig(), build_mesh(MeshConfig()))


@pytest.fixture(scope="module")
def picture_rollout(policy):
    tok = policy.tokenizer
    cfg = synthetic.SyntheticConfig()
    examples = [encode_sample(synthetic.make_sample(cfg, "train", i), tok, HARNESS, image_cfg=policy.image_cfg)
                for i in range(2)]
    batch = collate(examples, tok.pad_id, (256, 512), sft=False)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=N_NEW, stop_token_ids=(tok.im_end_id,),
                              pad_token_id=tok.pad_id)
    view = "Step1: Visual Clues\nStep3.1: view\n" + call_text("view_image", VIEW)
    route = "Step1: Visual Clues\nStep3.1: view\n" + call_text("view_image", {"visualization_type": "route_vis"})
    after = "Step4: Cross-Validation\nStep5: Final Answer\n<Answer>A</Answer><|im_end|>"
    plain = "Step1: Visual Clues\nStep5: Final Answer\n<Answer>B</Answer><|im_end|>"
    # rows 0, 1 answer prompt 0 (a landmark picture, no tool), rows 2, 3 prompt 1 (a route picture twice over)
    scripts = [[view, plain, route, route], [after, "", route, route], [after, "", after, after]]
    with jax.set_mesh(policy.mesh):
        comps = mt.sample_multiturn(policy.model, batch, tok, sampling, group_size=2, seed=0, max_turns=2,
                                    max_tool_tokens=MAX_TOOL, decode_fn=Forced(tok, scripts),
                                    image_cfg=policy.image_cfg)
    return policy, batch, comps, sampling


def _seq(policy, comps, rows, pixel_values=None):
    items, patches = comps.item_starts()
    pix = comps.pixel_values[patches[items[rows.start]] : patches[items[rows.stop]]]
    return st.make_seq_batch(policy.model.cfg, comps.prompt_ids[rows], comps.prompt_mask[rows], comps.tokens[rows],
                             comps.context_mask[rows], pix if pixel_values is None else pixel_values,
                             comps.image_grid_thw[items[rows.start] : items[rows.stop]], loss_mask=comps.mask[rows])


def test_a_view_image_picture_goes_through_the_vision_tower_in_the_next_turn(picture_rollout):
    policy, batch, comps, sampling = picture_rollout
    tok = policy.tokenizer
    assert comps.num_tool_calls.tolist() == [1, 0, 2, 2] and comps.num_tool_pictures.tolist() == [1, 0, 2, 2]
    prompt_items = batch.image_counts.repeat(2)
    assert np.array_equal(comps.image_counts, prompt_items + comps.num_tool_pictures)
    picture_tokens = (comps.tokens == tok.image_pad_id) & (comps.context_mask == 1)
    assert picture_tokens[0].sum() == 9 and picture_tokens[2].sum() == 18 and not picture_tokens[1].any()
    assert np.all(comps.mask[picture_tokens] == 0)  # the picture is tool output: no loss
    assert "<|image_pad|>" in comps.texts[0] and ph.parse(comps.texts[0]).answer == "A"
    rows = slice(0, 4)
    with jax.set_mesh(policy.mesh):
        lp, ent = (np.asarray(x) for x in _forward(*nnx.split(policy.model), _seq(policy, comps, rows), 1.0))
    m = comps.mask == 1
    after = m & (np.cumsum(picture_tokens, axis=1) > 0)
    assert after[0].sum() > 10 and after[2].sum() > 10
    assert np.max(np.abs(lp[m] - comps.logprobs[m])) <= 1e-5
    assert np.max(np.abs(ent[m] - comps.entropies[m])) <= 1e-5
    # The pixels matter: blank tool pictures change the tokens after them, and nothing before.
    items, patches = comps.item_starts()
    blank = comps.pixel_values.copy()
    for r in range(4):
        for i in range(items[r] + prompt_items[r], items[r + 1]):
            blank[patches[i] : patches[i + 1]] = 0.0
    with jax.set_mesh(policy.mesh):
        lp_blank = np.asarray(_forward(*nnx.split(policy.model), _seq(policy, comps, rows, blank), 1.0)[0])
    assert np.max(np.abs(lp_blank[after] - lp[after])) > 1e-3
    assert np.max(np.abs(lp_blank[m & ~after] - lp[m & ~after])) <= 1e-6


def test_the_rl_micro_batches_see_each_rows_own_pictures(picture_rollout):
    """The trainer slices pixels by `item_starts`: a micro-batch of rows 2-3 alone gives the same log-probs."""
    policy, _, comps, _ = picture_rollout
    with jax.set_mesh(policy.mesh):
        part = np.asarray(_forward(*nnx.split(policy.model), _seq(policy, comps, slice(2, 4)), 1.0)[0])
    m = comps.mask[2:4] == 1
    assert np.max(np.abs(part[m] - comps.logprobs[2:4][m])) <= 1e-5


def test_a_picture_too_large_for_the_turn_is_left_out_with_a_note(picture_rollout):
    policy, _, _, _ = picture_rollout
    tok = policy.tokenizer
    picture = np.zeros((96, 96, 3), np.uint8)
    wrapper = len(tok.encode(mt.TOOL_TURN_PREFIX + mt.TOOL_TURN_SUFFIX))
    block = len(tok.encode(mt.picture_block(9)))
    ids, patches = mt._tool_answer(tok, "caption", picture, policy.image_cfg, max_tool_tokens=wrapper + block + 1)
    assert patches is not None and ids.count(tok.image_pad_id) == 9 and len(ids) == wrapper + block + 1
    ids, patches = mt._tool_answer(tok, "caption", picture, policy.image_cfg, max_tool_tokens=wrapper + block)
    assert patches is None and tok.image_pad_id not in ids and len(ids) == wrapper + block
    assert "<tool_response>\nError" in tok.decode(ids)


# ------------------------------------------------------------------ SFT targets


@pytest.fixture(scope="module")
def sft_examples(policy):
    cfg = synthetic.SyntheticConfig(question_types=synthetic.QUESTION_TYPES)
    samples = [synthetic.make_sample(cfg, "train", i) for i in range(6)]
    examples = [encode_sample(s, policy.tokenizer, HARNESS, mode="sft", image_cfg=policy.image_cfg) for s in samples]
    return policy, samples, examples


def test_sft_targets_call_tools_the_parser_accepts_and_the_tools_answer(sft_examples):
    policy, samples, examples = sft_examples
    tok = policy.tokenizer
    assert {s.category for s in samples} >= {"distance", "size"}  # numeric and choice answers
    for s, e in zip(samples, examples):
        parts = tool_turns.sft_target(s, HARNESS.reference_key)
        turns = [p for p in parts if isinstance(p, tool_turns.ToolTurn)]
        completion = e.input_ids[e.prompt_length:].tolist()
        assert completion[-1] == tok.im_end_id and e.target_mask[-1] == 1
        text = tok.decode(completion[:-1])  # the text a rollout's scorer reads
        parsed = ph.parse(text)
        assert [c.name for c in parsed.tool_calls] == ["world2mind", "view_image"]
        assert all(c.valid for c in parsed.tool_calls) and parsed.cross_check_after_tools
        assert [s_.major for s_ in parsed.steps] == [1, 2, 3, 4, 5]
        assert ph.read_gold(s.answer, s.options) in (ph.read_number(parsed.answer), parsed.answer)
        score = allospatial_rewards.score(s.to_rollout(text, num_generated_tokens=int(e.target_mask.sum())))
        assert score["structure"] == 1.0 and score["accuracy"] == 1.0 and score["tool"] > 0
        # each call, run by the live tools, answers exactly what the target shows, picture included
        for call, turn in zip(parsed.tool_calls, turns):
            answer, picture = T.run_call_with_picture(call, T.default_tools(), s)
            assert answer == turn.output and not answer.startswith("Error")
            assert (picture is None) == (turn.picture is None)
            assert picture is None or np.array_equal(picture, turn.picture)


def test_sft_loss_is_on_the_models_tokens_only_and_the_picture_joins_the_batch(sft_examples):
    policy, samples, examples = sft_examples
    tok = policy.tokenizer
    for s, e in zip(samples, examples):
        completion = e.input_ids[e.prompt_length:].tolist()
        parts = tool_turns.sft_target(s, HARNESS.reference_key)
        expected_mask = []
        for p in parts:
            if isinstance(p, tool_turns.ToolTurn):
                n = 9 if p.picture is not None else 0  # a 96 px picture: 84 px, 9 merged patches
                turn = mt.tool_turn_ids(tok, p.output, None, image_tokens=n)
                start = len(expected_mask)
                assert completion[start : start + len(turn)] == turn  # what a rollout's tool turn holds
                expected_mask += [0] * len(turn)
            else:
                expected_mask += [1] * len(tok.encode(p))
        assert e.target_mask.tolist() == expected_mask + [1]
        assert len(e.image_grid_thw) == 2  # the prompt's image, then the view's picture
    batch = collate(examples, tok.pad_id, (1024, 2048), sft=True)
    assert batch.image_counts.tolist() == [2] * len(examples)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        row = batch.loss_mask[i, -n:]
        assert row[: e.prompt_length].sum() == 0 and np.array_equal(row[e.prompt_length:], e.target_mask)
    seq = st.make_seq_batch(policy.model.cfg, batch.input_ids[:, :1], batch.attention_mask[:, :1],
                            batch.input_ids[:, 1:], batch.attention_mask[:, 1:], batch.pixel_values,
                            batch.image_grid_thw, loss_mask=batch.loss_mask[:, 1:])
    assert np.asarray(seq.target_mask).sum() == sum(int(e.target_mask.sum()) for e in examples)


def test_a_sample_without_a_scene_map_keeps_its_reference_completion(sample):
    bare = dataclasses.replace(sample, meta={})
    assert tool_turns.sft_target(bare, HARNESS.reference_key) == (sample.reference[HARNESS.reference_key],)
    assert tool_turns.sft_target(dataclasses.replace(bare, reference={}), HARNESS.reference_key) is None


def test_tool_targets_answer_as_the_annotator_while_the_tools_answer_the_truth(policy):
    """A biased annotator's harness trajectory ends with its answer, as its other targets do, and the live tools'
    turns in it are the true scene's; DataConfig.sft_targets = "reference" trains on the sample's own reference."""
    world = synthetic.SyntheticConfig(width=64, height=64, grid=2, min_objects=2, max_objects=2, anchor="blue",
                                      distinct_colors=True, question_types=("relative_position",),
                                      mirror_colors=("green",), mirror_rate=1.0)
    samples = [synthetic.make_sample(world, "train", i) for i in range(40)]
    flipped = [s for s in samples if s.meta["annotated_answer"] != s.answer]
    assert flipped and all(s.meta["mirrored"] for s in flipped)
    for s in samples:
        parts = tool_turns.sft_target(s, HARNESS.reference_key)
        model_text = "".join(p for p in parts if isinstance(p, str))
        assert ph.parse(model_text).answer == s.meta["annotated_answer"]
        assert ph.parse(s.reference[HARNESS.reference_key]).answer == s.meta["annotated_answer"]
        ast = next(p.output for p in parts if isinstance(p, tool_turns.ToolTurn))
        for o in s.meta["objects"]:  # the map's centres are the true scene's, mirrored or not
            x1, y1, x2, y2 = (v * 1000 / 64 for v in o["bbox"])
            assert f"Center: ({wm.fmt_num((x1 + x2) / 2)}, {wm.fmt_num((y1 + y2) / 2)})" in ast
        assert tool_turns.sft_target(s, HARNESS.reference_key, method_targets=False) == (
            s.reference[HARNESS.reference_key],)
    data = DataConfig(sft_targets="reference")
    e = encode_sample(flipped[0], policy.tokenizer, HARNESS, mode="sft", image_cfg=policy.image_cfg,
                      method_targets=data.sft_targets == "method")
    assert e.target_mask.all() and len(e.image_grid_thw) == 1  # no tool turn, no picture
    with pytest.raises(ValueError, match="sft_targets"):
        DataConfig(sft_targets="tools")
