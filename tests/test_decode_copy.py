"""The decoding copy (rollout/decode_copy.py) and per-process decoding (rollout/collect.py, rollout/hosts.py).

The copy of a policy sharded FSDP over a (data=2, fsdp=2) mesh lies on the process's devices, tensor parallel and
never FSDP, and computes the policy's logits: to 1e-6 in float32 (2e-6 split over 2 tensor devices, whose partial
sums add in another order) and, as a bfloat16 copy, within 3e-2 of the float32 policy's logits (bfloat16 weights
carry 8 bits of mantissa; the tiny policy's logits are O(1)). It is made again from the policy's weights after an
update, by the trainer too. A process decoding its block of a batch (rollout ids offset by its block,
`HostShare.row_ids`) draws the tokens one process decoding the whole batch draws for those rows: single-turn,
multi-turn with tools, and ProSR's blank rollouts.
"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import spatial_jax.methods
from spatial_jax import config as C
from spatial_jax.config import ConfigError
from spatial_jax.data.pipeline import DataConfig, train_iterator
from spatial_jax.data.tokenizer import build_tokenizer
from spatial_jax.models import ModelConfig, Qwen3VL
from spatial_jax.models.config import LoRAConfig
from spatial_jax.models.sharding import make_mesh, shard_model
from spatial_jax.rl.config import PolicyConfig
from spatial_jax.rl.policy import image_config
from spatial_jax.rollout.collect import ToolSettings, collect
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.decode_copy import DecodeConfig, DecodeCopy, decode_mesh
from spatial_jax.rollout.hosts import HostShare

TP_TOL = 2e-6
BF16_TOL = 3e-2


@pytest.fixture(scope="module")
def policy():
    tok = build_tokenizer(768)
    cfg = ModelConfig.tiny(tok.vocab_size, **tok.model_token_ids(), lora=LoRAConfig(rank=4))
    mesh = make_mesh(2, 2, 1)
    model = shard_model(Qwen3VL(cfg, rngs=nnx.Rngs(0)), mesh)
    # adapters that do something (lora_b starts at zero)
    nnx.update(model, jax.tree.map(lambda x: x + 0.05, nnx.state(model, nnx.PathContains("lora_b"))))
    return tok, mesh, model


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids):
    return nnx.merge(graphdef, state)(ids)[0]


def _logits(model, ids, mesh):
    with jax.set_mesh(mesh):
        return np.asarray(_forward(*nnx.split(model), jnp.asarray(ids)), np.float32)


def _weight_gathers(model, ids, mesh) -> int:
    """All-gathers in the compiled forward (the program a decode step runs)."""
    with jax.set_mesh(mesh):
        hlo = _forward.lower(*nnx.split(model), jnp.asarray(ids)).compile().as_text()
    return len(re.findall(r"\ball-gather(?:-start)?\(", hlo))


def _ids(seed=0):
    return np.random.RandomState(seed).randint(10, 300, (2, 9)).astype(np.int32)


def test_the_copy_is_the_policy_laid_out_for_sampling(policy):
    tok, mesh, model = policy
    ids = _ids()
    want = _logits(model, ids, mesh)
    copy = DecodeCopy(model, DecodeConfig(tensor=2), mesh)
    assert dict(copy.mesh.shape) == {"data": 2, "fsdp": 1, "tensor": 2}
    assert set(copy.mesh.devices.flat) == set(mesh.devices.flat)  # the process's devices of the mesh
    state = nnx.state(copy.model, nnx.Param)
    for path, var in nnx.to_flat_state(state):
        value = var.get_value()
        split = {a for e in value.sharding.spec for a in ((e,) if isinstance(e, str) else (e or ()))}
        assert value.dtype == jnp.float32 and all(copy.mesh.shape[a] == 1 for a in split - {"tensor"}), path
    assert value.sharding.mesh == copy.mesh
    embedding = state["embed_tokens"]["embedding"].get_value()
    assert embedding.sharding.spec[0] == "tensor"  # vocabulary split over the copy's tensor devices
    assert copy.nbytes() == sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
    # tensor parallel: the split matmuls add their partial sums in another order
    assert np.max(np.abs(_logits(copy.model, ids, copy.mesh) - want)) < TP_TOL
    whole = DecodeCopy(model, DecodeConfig(tensor=1), mesh)  # data parallel: each device holds the whole copy
    assert dict(whole.mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 1}
    assert np.max(np.abs(_logits(whole.model, ids, whole.mesh) - want)) < 1e-6
    # no FSDP gather per token: the policy's forward gathers its sharded weights, the copy's gathers nothing
    assert _weight_gathers(model, ids, mesh) > 0 and _weight_gathers(whole.model, ids, whole.mesh) == 0

    half = DecodeCopy(model, DecodeConfig(dtype="bfloat16"), mesh)
    assert dict(half.mesh.shape)["tensor"] == 4  # tensor 0: all of the process's devices
    assert {x.dtype for x in jax.tree.leaves(nnx.state(half.model, nnx.Param))} == {jnp.dtype(jnp.bfloat16)}
    low = _logits(half.model, ids, half.mesh)
    err = np.max(np.abs(low - want))
    assert 0 < err < BF16_TOL


def test_the_copy_is_refreshed_from_the_updated_policy(policy):
    tok, mesh, model = policy
    ids = _ids(1)
    copy = DecodeCopy(model, DecodeConfig(), mesh)
    before = _logits(model, ids, mesh)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    changed = nnx.merge(graphdef, jax.tree.map(lambda x: x * 1.1, params), rest)  # new arrays: the policy stays
    after = _logits(changed, ids, mesh)
    assert np.max(np.abs(after - before)) > 1e-2
    assert np.max(np.abs(_logits(copy.model, ids, copy.mesh) - before)) < 1e-6  # a copy: not the policy's arrays
    copy.refresh(changed)
    assert np.max(np.abs(_logits(copy.model, ids, copy.mesh) - after)) < 1e-6
    assert copy.refreshes == 2


def test_the_trainer_decodes_from_a_copy_of_its_current_weights(tmp_path):
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.train import Trainer

    job = Trainer(C.load(TrainConfig, None, [f"run_dir={tmp_path}", "mesh.data=2", "mesh.fsdp=2",
                                             "decode.tensor=2"]), record_config=False)
    first = job.experience.decoder()
    assert job.experience.decoder() is first and first.refreshes == 1  # unchanged weights: no new copy
    job.trainable = jax.tree.map(lambda x: x * 2.0, job.trainable)  # what an update or a restore does
    assert job.experience.decoder().refreshes == 2
    ours = jax.tree.leaves(nnx.state(job.model))
    for a, b in zip(jax.tree.leaves(nnx.state(first.model)), ours):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ConfigError, match="decode.tensor=3"):
        decode_mesh(job.mesh, 3)
    with pytest.raises(ConfigError, match="unknown"):
        C.load(TrainConfig, None, ["decode.nope=1"])


@pytest.mark.slow
def test_a_process_decodes_its_block_as_one_process_decodes_the_batch(policy):
    """Processes 0 and 1 of 2 each decode only their block (2 of 4 prompts, G = 2) and draw the tokens, log-probs
    and blank rollouts one process decoding all 4 prompts draws for those rows. The method is AlloSpatial with
    tools (multi-turn rollouts) and, to cover both in one set of compiles, ProSR's blank rollouts as well."""
    tok, mesh, model = policy
    method = dataclasses.replace(spatial_jax.methods.get_method("allospatial"), needs_blank=True)
    tools = 1
    data = DataConfig(train="synthetic:train:8", bucket_lengths=(512,), seed=3)  # one prompt width
    image_cfg = image_config(model.cfg, PolicyConfig())
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8, stop_token_ids=(tok.im_end_id,),
                              pad_token_id=tok.pad_id)
    copy = DecodeCopy(model, DecodeConfig(), make_mesh(1, 1, 1))  # one device: compiles fastest

    def run(batch, hosts):
        return collect(copy, batch, tok, method, method.config_cls(), sampling, 2, 11, blank_seed=12,
                       tools=ToolSettings(tools, 64), image_cfg=image_cfg, hosts=hosts)

    whole = run(next(train_iterator(data, tok, method.prompt, 4, mode="rl", image_cfg=image_cfg)), HostShare())
    assert whole.decoded == 8 + 4  # rollouts and blank rollouts
    for p in range(2):
        hosts = HostShare(p, 2, tok.pad_id)
        got = run(next(hosts.iterator(data, tok, method.prompt, 4, "rl", image_cfg)), hosts)
        assert got.decoded == whole.decoded // 2  # its own rows only
        rows = slice(4 * p, 4 * p + 4)
        n = min(got.completions.tokens.shape[1], whole.completions.tokens.shape[1])  # tool rounds set widths
        np.testing.assert_array_equal(got.completions.tokens[:, :n], whole.completions.tokens[rows, :n])
        np.testing.assert_allclose(got.completions.logprobs[:, :n], whole.completions.logprobs[rows, :n], atol=1e-5)
        assert [r.completion for r in got.rollouts] == [r.completion for r in whole.rollouts[rows]]
        blanks = [r.blank and r.blank.completion for r in got.rollouts]
        assert blanks == [r.blank and r.blank.completion for r in whole.rollouts[rows]]
        assert all(isinstance(b, str) for b in blanks)
        for ours, theirs in zip(got.scores, whole.scores[rows]):
            assert ours == pytest.approx(theirs, abs=1e-5)


def test_an_auto_copy_takes_the_compute_dtype_not_the_parameter_dtype():
    """float32 master weights computing in bfloat16: the copy samples from bfloat16 weights, as the policy computes."""
    tok = build_tokenizer(768)
    cfg = ModelConfig.tiny(tok.vocab_size, **tok.model_token_ids(), dtype="bfloat16", param_dtype="float32")
    model = Qwen3VL(cfg, rngs=nnx.Rngs(0))
    copy = DecodeCopy(model, DecodeConfig(), make_mesh(1, 1, 1))
    assert copy.dtype == jnp.bfloat16
    assert {x.dtype for x in jax.tree.leaves(nnx.state(copy.model, nnx.Param))} == {jnp.dtype(jnp.bfloat16)}
