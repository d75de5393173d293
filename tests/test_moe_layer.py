"""The MoE layer's parts one by one (models/moe.py), each against transformers' Qwen3-VL-MoE block or numbers worked
out here in numpy, small enough that a mutation run can afford every mutant (the whole-model tests in
test_model_archs.py take a minute): the router in float32 and bfloat16, the layer at several (E, k) including
experts no token picks, an expert projection's adapters over ragged groups, which meshes give expert parallelism,
and the all-to-all path on 2 and 4 devices against transformers' outputs."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from test_model_archs import IDS, MOE

from spatial_jax.models import LoRAConfig
from spatial_jax.models.moe import ExpertLinear, SparseMoE, dense_moe, expert_parallel_axes, route, token_axes
from spatial_jax.models.registry import config_from_hf
from spatial_jax.models.sharding import make_mesh

TOL = 1e-5


def _pair(num_experts: int, top_k: int, seed: int = 0, lora: LoRAConfig = LoRAConfig(), matmul: str = "ragged_dot",
          dtype: str = "float32"):
    """transformers' Qwen3VLMoeTextSparseMoeBlock and our SparseMoE with the same random weights."""
    from transformers import Qwen3VLMoeConfig
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextSparseMoeBlock

    text = dict(MOE["text"], num_experts=num_experts, num_experts_per_tok=top_k)
    hf_cfg = Qwen3VLMoeConfig(text_config=text, vision_config=dict(MOE["vision"]), **IDS)
    torch.manual_seed(seed)
    block = Qwen3VLMoeTextSparseMoeBlock(hf_cfg.text_config).float()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.3 * torch.randn_like(p))
    cfg = config_from_hf(json.loads(hf_cfg.to_json_string()), lora=lora).replace(moe_matmul=matmul, dtype=dtype)
    ours = SparseMoE(cfg, rngs=nnx.Rngs(seed))
    ours.gate.kernel[...] = jnp.asarray(block.gate.weight.detach().numpy().T)
    ours.experts["gate_up_proj"].kernel[...] = jnp.asarray(block.experts.gate_up_proj.detach().numpy().swapaxes(1, 2))
    ours.experts["down_proj"].kernel[...] = jnp.asarray(block.experts.down_proj.detach().numpy().swapaxes(1, 2))
    return block, ours


def _tokens(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("top_k", [1, 2, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_equals_transformers_router(top_k, dtype):
    """Weights in the logits' dtype (softmax in float32, the k renormalised) and the picked experts, in order."""
    block, _ = _pair(5, top_k)
    x = torch.from_numpy(_tokens((9, 32))).to(dtype)
    with torch.no_grad():
        block.gate.to(dtype)
        logits, ref_w, ref_e = block.gate(x)
    jdt = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
    w, e = route(jnp.asarray(logits.float().numpy()).astype(jdt), top_k)
    assert w.dtype == jdt and e.shape == (9, top_k)
    # each token's weight per expert (bfloat16 logits tie, and the two sorts may order tied experts apart)
    rows = np.arange(9)[:, None]
    dense, ref_dense = np.zeros((9, 5), np.float32), np.zeros((9, 5), np.float32)
    dense[rows, np.asarray(e)] = np.asarray(w.astype(jnp.float32))
    ref_dense[rows, ref_e.numpy()] = ref_w.float().numpy()
    np.testing.assert_allclose(dense, ref_dense, rtol=0, atol=1e-6)
    if dtype == torch.float32:
        np.testing.assert_array_equal(np.asarray(e), ref_e.numpy())


@pytest.mark.parametrize("num_experts,top_k,shape", [(5, 2, (2, 3, 32)), (4, 1, (1, 7, 32)), (3, 3, (3, 1, 32))])
def test_layer_and_dense_loop_equal_transformers(num_experts, top_k, shape):
    """The sorted grouped path and the dense loop over experts give transformers' block, from one token per row
    to every expert picked; three of 4 experts idle in 7 tokens is likely at k = 1, so empty groups occur."""
    block, ours = _pair(num_experts, top_k, seed=num_experts)
    x = _tokens(shape, seed=top_k)
    with torch.no_grad():
        ref = block(torch.from_numpy(x)).numpy()
    got = ours(jnp.asarray(x))
    assert got.shape == shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), ref, atol=TOL)
    np.testing.assert_allclose(np.asarray(dense_moe(ours, jnp.asarray(x))), ref, atol=TOL)


def _expert_linear(rank=0, alpha=1.0, dtype="float32", dropout=0.0):
    layer = ExpertLinear(3, 4, 5, axes=("expert", "embed", "mlp"), rank=rank, alpha=alpha, dtype=dtype,
                         dropout=dropout, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(7)
    kernel = rng.standard_normal((3, 4, 5)).astype(np.float32)
    layer.kernel[...] = jnp.asarray(kernel)
    if rank:
        layer.lora_a[...] = jnp.asarray(rng.standard_normal((3, 4, rank)).astype(np.float32))
        layer.lora_b[...] = jnp.asarray(rng.standard_normal((3, rank, 5)).astype(np.float32))
    return layer, kernel


def test_expert_projection_with_adapters_over_ragged_groups():
    """Rows grouped [2, 0, 3] plus one padding row: expert e's rows get x W_e + (alpha / r) x A_e B_e, the padding
    row 0; adapters switched off leave x W_e; a bfloat16 layer computes and returns bfloat16."""
    layer, kernel = _expert_linear(rank=2, alpha=6.0)
    a, b = np.asarray(layer.lora_a[...]), np.asarray(layer.lora_b[...])
    x = _tokens((6, 4), seed=3)
    sizes = jnp.asarray([2, 0, 3], jnp.int32)
    expert = [0, 0, 2, 2, 2]
    plain = np.stack([x[i] @ kernel[e] for i, e in enumerate(expert)] + [np.zeros(5, np.float32)])
    lora = np.stack([3.0 * (x[i] @ a[e] @ b[e]) for i, e in enumerate(expert)] + [np.zeros(5, np.float32)])
    np.testing.assert_allclose(np.asarray(layer(jnp.asarray(x), sizes)), plain + lora, rtol=1e-5, atol=1e-5)
    layer.adapters_enabled = False
    np.testing.assert_allclose(np.asarray(layer(jnp.asarray(x), sizes)), plain, rtol=1e-5, atol=1e-5)
    assert [w is None for w in layer.weights()] == [False, False, False]

    half, kernel = _expert_linear(rank=2, alpha=6.0, dtype="bfloat16")
    y = half(jnp.asarray(x), sizes)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y.astype(jnp.float32)), plain + lora, rtol=0.05, atol=0.1)

    bare, kernel = _expert_linear()
    assert bare.weights()[1:] == (None, None) and bare.scaling == 0.0 and not bare.dropout_live()
    np.testing.assert_allclose(np.asarray(bare(jnp.asarray(x), sizes)), plain, rtol=1e-5, atol=1e-5)


def test_adapter_dropout_is_live_only_when_training_an_enabled_adapter():
    """dropout_live: an adapter, switched on, in training mode, with a rate above 0; the key given to apply then
    drops adapter inputs (the base product keeps every input)."""
    layer, kernel = _expert_linear(rank=2, alpha=2.0, dropout=0.5)
    assert not layer.dropout_live()  # built deterministic (evaluation)
    layer.lora_dropout.deterministic = False
    assert layer.dropout_live()
    layer.adapters_enabled = False
    assert not layer.dropout_live()
    layer.adapters_enabled = True
    layer.lora_dropout.rate = 0.0
    assert not layer.dropout_live()
    layer.lora_dropout.rate = 0.5

    x = jnp.asarray(_tokens((4, 4), seed=5))
    sizes = jnp.asarray([4, 0, 0], jnp.int32)
    key = jax.random.key(11)
    got = layer.apply(x, sizes, *layer.weights(), dropout_key=key)
    kept = jax.random.bernoulli(key, 0.5, x.shape)  # flax's Dropout draws its mask so, and scales by 1 / (1 - rate)
    dropped = np.where(np.asarray(kept), np.asarray(x) / 0.5, 0.0)
    a, b = np.asarray(layer.lora_a[...]), np.asarray(layer.lora_b[...])
    want = np.asarray(x) @ kernel[0] + dropped @ a[0] @ b[0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_which_meshes_give_expert_parallelism():
    """Experts over the mesh's fsdp devices when they divide E and the batch reaches them; the token axes are the
    batch axes, in order, that together divide the batch."""
    assert expert_parallel_axes(4, 8) is None  # no mesh
    with jax.set_mesh(make_mesh(data=2, fsdp=2, tensor=2)):
        assert token_axes(4) == ("data", "fsdp") and token_axes(2) == ("data",) and token_axes(3) == ()
        assert token_axes(6) == ("data",)
        assert expert_parallel_axes(4, 8) == (("data", "fsdp"), ("fsdp",))
        assert expert_parallel_axes(8, 6) == (("data", "fsdp"), ("fsdp",))
        assert expert_parallel_axes(4, 5) is None  # 2 devices cannot split 5 experts
        assert expert_parallel_axes(2, 8) is None  # the batch stops at data: fsdp holds no tokens of its own
        assert expert_parallel_axes(3, 8) is None
    with jax.set_mesh(make_mesh(data=4, fsdp=2)):
        assert token_axes(4) == ("data",) and token_axes(8) == ("data", "fsdp") and token_axes(3) == ()
        assert token_axes(2) == ("fsdp",)  # data's 4 skipped, fsdp's 2 taken: each axis is tried on its own
        assert expert_parallel_axes(8, 4) == (("data", "fsdp"), ("fsdp",)) and expert_parallel_axes(4, 4) is None
        assert expert_parallel_axes(2, 4) == (("fsdp",), ("fsdp",))
    with jax.set_mesh(make_mesh(fsdp=4)):
        assert token_axes(4) == ("fsdp",) and token_axes(6) == ()
        assert expert_parallel_axes(4, 8) == (("fsdp",), ("fsdp",)) and expert_parallel_axes(4, 6) is None
    with jax.set_mesh(make_mesh(data=2, tensor=4)):
        assert token_axes(2) == ("data",) and expert_parallel_axes(2, 8) is None  # fsdp of 1: no expert axis


@pytest.mark.parametrize("mesh,num_experts,top_k,batch", [
    (dict(fsdp=2), 4, 2, 2), (dict(data=2, fsdp=2), 8, 3, 4), (dict(fsdp=4), 4, 4, 4)])
def test_expert_parallel_layer_equals_transformers(mesh, num_experts, top_k, batch):
    """Through the all-to-alls (each device E / n experts, tokens over the batch axes): transformers' outputs,
    with k above E / n (a token's rows reach several devices) and k = E (every device every token)."""
    block, ours = _pair(num_experts, top_k, seed=top_k)
    x = _tokens((batch, 5, 32), seed=num_experts)
    with torch.no_grad():
        ref = block(torch.from_numpy(x)).numpy()
    with jax.set_mesh(make_mesh(**mesh)):
        assert expert_parallel_axes(batch, num_experts) is not None
        got = jax.jit(lambda x: ours(x))(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), ref, atol=TOL)


def test_each_token_shard_draws_its_own_adapter_dropout():
    """Under expert parallelism the adapters' dropout key is folded with the token shard: two shards holding the
    same tokens drop different inputs (the same mask on every shard would tie their noise)."""
    _, ours = _pair(4, 2, lora=LoRAConfig(rank=2, alpha=2.0, dropout=0.5,
                                          targets=("experts_gate_up", "experts_down")))
    for e in ours.experts.values():
        e.lora_b[...] = jnp.ones_like(e.lora_b[...])
        e.lora_dropout.deterministic = False
    half = _tokens((1, 5, 32), seed=9)
    x = jnp.asarray(np.concatenate([half, half]))
    with jax.set_mesh(make_mesh(fsdp=2)):
        y = np.asarray(nnx.jit(lambda m, x: m(x))(ours, x))
    assert np.abs(y[0] - y[1]).max() > 1e-3


@pytest.mark.parametrize("batch", [3, 4])
def test_megablox_layer_under_a_mesh_equals_transformers(batch):
    """megablox (a Mosaic kernel, which XLA cannot partition) inside the layer's shard_map under a mesh: with expert
    parallelism (batch 4) and, where the batch stops it, every device running all experts on its tokens (3)."""
    block, ours = _pair(4, 2, seed=1, matmul="megablox")
    for e in ours.experts.values():
        e.tiling = (8, 16, 16)
    x = _tokens((batch, 3, 32), seed=batch)
    with torch.no_grad():
        ref = block(torch.from_numpy(x)).numpy()
    with jax.set_mesh(make_mesh(data=2, fsdp=2)):
        got = jax.jit(lambda x: ours(x))(jnp.asarray(x))
        jaxpr = str(jax.make_jaxpr(lambda x: ours(x))(jnp.asarray(x)))
    assert "shard_map" in jaxpr and "pallas_call" in jaxpr and ("all_to_all[" in jaxpr) == (batch == 4)
    np.testing.assert_allclose(np.asarray(got), ref, atol=TOL)


def test_router_logits_are_recorded_on_request():
    """With record_router_logits the layer sows its router logits [B*T, E] as the Intermediate "router_logits"
    (what the load-balancing loss reads): transformers' router logits; nothing is sown without the switch."""
    block, ours = _pair(5, 2)
    x = _tokens((2, 3, 32), seed=4)
    with torch.no_grad():
        ref, _, _ = block.gate(torch.from_numpy(x))
    ours(jnp.asarray(x))
    assert nnx.pop(ours, nnx.Intermediate) == nnx.State({})
    ours.record_router_logits = True
    ours(jnp.asarray(x))
    (logits,) = nnx.pop(ours, nnx.Intermediate)["router_logits"]
    np.testing.assert_allclose(np.asarray(logits), ref.numpy(), atol=TOL)


def test_the_all_to_all_carries_the_compute_dtype():
    """A bfloat16 layer sends its rows through the all-to-alls in bfloat16 (half float32's bytes), the counts in
    int32."""
    _, ours = _pair(4, 2, dtype="bfloat16")
    x = jnp.asarray(_tokens((2, 5, 32)))
    with jax.set_mesh(make_mesh(fsdp=2)):
        jaxpr = str(jax.make_jaxpr(lambda x: ours(x))(x))
    sent = [re.search(r":(\w+)\[", line).group(1) for line in jaxpr.splitlines() if "= all_to_all[" in line]
    assert sent == ["bf16", "i32", "bf16"]


def test_adapter_dropout_runs_where_every_device_holds_every_expert():
    """megablox with a batch the token axes do not divide: all experts on each device, inside shard_map; a live
    adapter dropout there takes the keys drawn outside (the modules' streams cannot advance inside shard_map) and
    changes the output against the same layer in evaluation."""
    _, ours = _pair(4, 2, seed=1, matmul="megablox", lora=LoRAConfig(rank=2, alpha=2.0, dropout=0.5,
                                                                      targets=("experts_gate_up", "experts_down")))
    for e in ours.experts.values():
        e.tiling = (8, 16, 16)
        e.lora_b[...] = jnp.ones_like(e.lora_b[...])
    x = jnp.asarray(_tokens((3, 3, 32), seed=2))
    fwd = nnx.jit(lambda m, x: m(x))
    with jax.set_mesh(make_mesh(data=2, fsdp=2)):
        evaluation = np.asarray(fwd(ours, x))
        for e in ours.experts.values():
            e.lora_dropout.deterministic = False
        training = np.asarray(fwd(ours, x))
    assert np.isfinite(training).all() and np.abs(training - evaluation).max() > 1e-3


def test_the_output_keeps_the_input_dtype_and_the_batch_sharding():
    """bfloat16 tokens through a float32 layer come back bfloat16; under a mesh the output is laid out over the
    batch axes; megablox on two devices, no expert parallelism, still runs in shard_map (Mosaic cannot be
    partitioned)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _, ours = _pair(4, 2)
    assert ours(jnp.asarray(_tokens((1, 3, 32)), jnp.bfloat16)).dtype == jnp.bfloat16
    mesh = make_mesh(data=2, fsdp=2)
    with jax.set_mesh(mesh):
        y = jax.jit(lambda x: ours(x))(jnp.asarray(_tokens((4, 3, 32))))
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, P(("data", "fsdp"))), 3)
    _, mb = _pair(4, 2, matmul="megablox")
    with jax.set_mesh(make_mesh(data=2)):
        assert "shard_map" in str(jax.make_jaxpr(lambda x: mb(x))(jnp.asarray(_tokens((3, 3, 32)))))
