"""Qwen2.5-VL and Qwen3-VL-MoE against transformers (float32, tiny random models with every parameter perturbed):
logits over real tokens to 1e-5 for text only, one image, several images (a Qwen2.5-VL video: test_qwen2_5_video.py),
left padding, windows that do not divide the grid, experts / top-k that do not divide the tokens; M-RoPE positions
equal; gradients of a loss through the MoE layer to 1e-5; checkpoints in and out through transformers; the registry
is the one place that names architectures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from test_model_utils import IMG, VEND, VID, VOCAB, VSTART, forward, max_err_real

from spatial_jax.models import prepare_vision_inputs
from spatial_jax.models.hf_io import from_pretrained, save_pretrained
from spatial_jax.models.moe import SparseMoE, dense_moe, load_balancing_loss
from spatial_jax.models.registry import config_from_hf, config_to_hf

TOL = 1e-5
IDS = dict(image_token_id=IMG, video_token_id=VID, vision_start_token_id=VSTART, vision_end_token_id=VEND)

# Qwen2.5-VL: patch 4 and window 16 px = 2x2 merged tokens per window; the grids' 3 x 5 and 2 x 3 merged tokens
# leave cut windows at the edges; block 1 attends over the whole frame.
Q25 = dict(
    text=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, rms_norm_eps=1e-6,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3])),
    vision=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, temporal_patch_size=2,
                spatial_merge_size=2, out_hidden_size=32, window_size=16, fullatt_block_indexes=[1],
                tokens_per_second=2),
)
# Qwen3-VL-MoE: 5 experts, top 2, layer 1 dense (mlp_only_layers) between two sparse ones; gate_up square
# ([E, 32, 32]: which layout a file holds is then told by its writer, not its shape).
MOE = dict(
    text=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_experts=5,
              num_experts_per_tok=2, mlp_only_layers=[1], num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3],
                                   mrope_interleaved=True)),
    vision=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, temporal_patch_size=2,
                spatial_merge_size=2, out_hidden_size=32, num_position_embeddings=16, deepstack_visual_indexes=[0]),
)
ARCHS = ("qwen2_5_vl", "qwen3_vl_moe")


def hf_model(arch: str, seed: int = 0, tie: bool = False, vocab_size: int = VOCAB, ids: dict | None = None):
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen3VLMoeConfig,
        Qwen3VLMoeForConditionalGeneration,
    )

    spec, (config_cls, model_cls) = (Q25, (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration)) \
        if arch == "qwen2_5_vl" else (MOE, (Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration))
    cfg = config_cls(text_config={**spec["text"], "vocab_size": vocab_size}, vision_config=dict(spec["vision"]),
                     tie_word_embeddings=tie, **(IDS if ids is None else ids))
    torch.manual_seed(seed)
    model = model_cls(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def left_pad(rows, seed=0):
    T = max(map(len, rows)) + 2
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 100, size=(len(rows), T))  # padding content must not matter
    mask = np.zeros((len(rows), T), np.int64)
    for b, row in enumerate(rows):
        ids[b, T - len(row):] = row
        mask[b, T - len(row):] = 1
    return ids, mask


def image_batch(seed=0):
    """Row 0: one image (1, 6, 10); row 1: two images (1, 4, 6), (1, 2, 2); left padding."""
    grids = np.array([[1, 6, 10], [1, 4, 6], [1, 2, 2]])
    n = grids.prod(-1) // 4
    rows = [[5, 6, VSTART] + [IMG] * n[0] + [VEND, 7, 8],
            [11, VSTART] + [IMG] * n[1] + [VEND, 12, VSTART] + [IMG] * n[2] + [VEND, 13]]
    ids, mask = left_pad(rows, seed)
    pixels = np.random.default_rng(seed).standard_normal((int(grids.prod(-1).sum()), 96)).astype(np.float32)
    return ids, mask, pixels, grids


def text_batch(seed=1):
    ids = np.random.default_rng(seed).integers(0, 100, size=(3, 9))
    mask = np.ones((3, 9), np.int64)
    mask[1, :3] = 0
    mask[2, :7] = 0
    return ids, mask


def hf_run(model, ids, mask, pixels=None, grids=None):
    """transformers' logits with its own position ids (get_rope_index), and those positions."""
    types = np.where(ids == IMG, 1, 0) * mask
    t = {k: torch.from_numpy(v) for k, v in dict(input_ids=ids, attention_mask=mask, mm_token_type_ids=types).items()}
    kw = {}
    if pixels is not None:
        kw = {"pixel_values": torch.from_numpy(pixels), "image_grid_thw": torch.from_numpy(grids)}
    rope_kw = {k: v for k, v in kw.items() if k.endswith("grid_thw")}
    with torch.no_grad():
        pos, _ = model.model.get_rope_index(t["input_ids"], t["mm_token_type_ids"], attention_mask=t["attention_mask"],
                                            **rope_kw)
        out = model(**t, position_ids=pos, **kw)
    return out.logits.numpy(), pos.numpy()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> (transformers model, ours loaded from its save_pretrained)."""
    out = {}
    for arch in ARCHS:
        hf = hf_model(arch)
        path = tmp_path_factory.mktemp(arch)
        hf.save_pretrained(path)
        out[arch] = hf, from_pretrained(path)
    return out


@pytest.fixture(params=ARCHS)
def pair(request, models):
    return (request.param, *models[request.param])


def test_config_round_trip(pair):
    arch, hf, ours = pair
    assert ours.cfg.model_type == arch
    assert config_from_hf(config_to_hf(ours.cfg)) == ours.cfg
    assert config_from_hf(json.loads(hf.config.to_json_string())) == ours.cfg


def test_text_logits(pair):
    _, hf, ours = pair
    ids, mask = text_batch()
    ref, _ = hf_run(hf, ids, mask)
    assert max_err_real(forward(ours, ids, mask), ref, mask) < TOL


def test_image_logits_and_positions(pair):
    _, hf, ours = pair
    ids, mask, pixels, grids = image_batch()
    ref, ref_pos = hf_run(hf, ids, mask, pixels, grids)
    pos, _ = ours.get_rope_index(ids, grids, mask)
    np.testing.assert_array_equal(pos[:, mask > 0], ref_pos[:, mask > 0])
    got = forward(ours, ids, mask, pixels, grids, positions=pos)
    assert np.isfinite(got).all() and max_err_real(got, ref, mask) < TOL


def test_scanned_layers_equal_unrolled(pair, tmp_path):
    arch, hf, ours = pair
    hf.save_pretrained(tmp_path)
    if arch == "qwen3_vl_moe":
        with pytest.raises(ValueError, match="scan_layers"):
            from_pretrained(tmp_path, scan_layers=True)
        return
    scanned = from_pretrained(tmp_path, scan_layers=True)
    ids, mask, pixels, grids = image_batch(seed=2)
    a = forward(ours, ids, mask, pixels, grids)
    np.testing.assert_allclose(forward(scanned, ids, mask, pixels, grids), a, atol=TOL)


def test_export_loads_in_transformers(pair, tmp_path):
    import transformers

    arch, hf, ours = pair
    save_pretrained(ours, tmp_path)
    cls = getattr(transformers, json.loads((tmp_path / "config.json").read_text())["architectures"][0])
    back = cls.from_pretrained(tmp_path).float().eval()
    ids, mask, pixels, grids = image_batch(seed=3)
    a, _ = hf_run(hf, ids, mask, pixels, grids)
    b, _ = hf_run(back, ids, mask, pixels, grids)
    np.testing.assert_array_equal(a[mask > 0], b[mask > 0])  # float32 weights survive exactly
    assert max_err_real(forward(from_pretrained(tmp_path), ids, mask, pixels, grids), a, mask) < TOL


def test_released_expert_layout_is_read(models, tmp_path):
    """Qwen3-VL-MoE's released files (written before transformers 5) hold experts [E, in, out]: the same model
    read from them, the square stacks included, as from transformers 5's [E, out, in]."""
    from spatial_jax.models.hf_io import read_safetensors_header, read_tensor, write_safetensors

    hf, ours = models["qwen3_vl_moe"]
    hf.save_pretrained(tmp_path / "v5")
    header, start = read_safetensors_header(tmp_path / "v5" / "model.safetensors")
    tensors = {k: read_tensor(tmp_path / "v5" / "model.safetensors", header, start, k) for k in header}
    tensors = {k: np.swapaxes(v, 1, 2) if ".experts." in k else v for k, v in tensors.items()}
    (tmp_path / "old").mkdir()
    write_safetensors(tmp_path / "old" / "model.safetensors", tensors)
    config = json.loads((tmp_path / "v5" / "config.json").read_text())
    (tmp_path / "old" / "config.json").write_text(json.dumps({**config, "transformers_version": "4.57.0"}))
    ids, mask = text_batch()
    np.testing.assert_array_equal(forward(from_pretrained(tmp_path / "old"), ids, mask), forward(ours, ids, mask))


def test_window_ids_equal_transformers_windows():
    """The window of every patch equals the one transformers' window_index / cu_window_seqlens give it."""
    from transformers.vision_utils import get_vision_window_index

    cfg = config_from_hf(json.loads(hf_model("qwen2_5_vl").config.to_json_string())).vision
    grids = np.array([[1, 6, 10], [2, 4, 6], [1, 10, 4]])
    vi = prepare_vision_inputs(np.zeros((int(grids.prod(-1).sum()), cfg.patch_dim), np.float32), grids, cfg)
    seg = np.asarray(vi.segment_ids) > 0
    ours = np.asarray(vi.window_ids)[seg]  # patches in HF order
    frame = np.repeat(np.arange(seg.shape[0]), seg.sum(1))
    index, cu = get_vision_window_index(torch.from_numpy(grids), spatial_merge_size=2, window_size=16, patch_size=4)
    theirs = np.zeros(len(ours), np.int64)
    for w, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        units = index.numpy()[lo // 4: hi // 4]
        theirs[(units[:, None] * 4 + np.arange(4)).ravel()] = w
    # the same partition of the patches (ours numbers windows per frame, transformers over the batch)
    pairs = set(zip(zip(frame.tolist(), ours.tolist()), theirs.tolist()))
    assert len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs}) == len(np.unique(theirs))


# ---------------------------------------------------------------- the MoE layer


def _moe_pair(seed=0, lora=None):
    """Our SparseMoE and transformers' Qwen3VLMoeTextSparseMoeBlock with the same random weights."""
    from transformers import Qwen3VLMoeConfig
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextSparseMoeBlock

    hf_cfg = Qwen3VLMoeConfig(text_config=dict(MOE["text"]), vision_config=dict(MOE["vision"]), **IDS)
    torch.manual_seed(seed)
    block = Qwen3VLMoeTextSparseMoeBlock(hf_cfg.text_config).float()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.3 * torch.randn_like(p))
    cfg = config_from_hf(json.loads(hf_cfg.to_json_string()), **({} if lora is None else dict(lora=lora)))
    ours = SparseMoE(cfg, rngs=nnx.Rngs(0))
    ours.gate.kernel[...] = jnp.asarray(block.gate.weight.detach().numpy().T)
    ours.experts["gate_up_proj"].kernel[...] = jnp.asarray(block.experts.gate_up_proj.detach().numpy().swapaxes(1, 2))
    ours.experts["down_proj"].kernel[...] = jnp.asarray(block.experts.down_proj.detach().numpy().swapaxes(1, 2))
    return block, ours


def test_moe_layer_outputs_and_gradients_equal_torch():
    block, ours = _moe_pair()
    x = np.random.default_rng(0).standard_normal((3, 7, 32)).astype(np.float32)  # 21 tokens, 5 experts, top 2
    w = np.random.default_rng(1).standard_normal((3, 7, 32)).astype(np.float32)

    xt = torch.from_numpy(x).requires_grad_(True)
    loss_t = (block(xt) * torch.from_numpy(w)).sum()
    loss_t.backward()

    def loss(model, x):
        return jnp.sum(model(x) * w)

    value, (g_model, g_x) = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1)))(ours, jnp.asarray(x))
    assert abs(float(value) - loss_t.item()) < TOL * max(1.0, abs(loss_t.item()))
    np.testing.assert_allclose(np.asarray(g_x), xt.grad.numpy(), atol=TOL)
    np.testing.assert_allclose(np.asarray(g_model.gate.kernel[...]), block.gate.weight.grad.numpy().T, atol=TOL)
    np.testing.assert_allclose(np.asarray(g_model.experts["gate_up_proj"].kernel[...]),
                               block.experts.gate_up_proj.grad.numpy().swapaxes(1, 2), atol=TOL)
    np.testing.assert_allclose(np.asarray(g_model.experts["down_proj"].kernel[...]),
                               block.experts.down_proj.grad.numpy().swapaxes(1, 2), atol=TOL)
    # the dense loop over every expert computes the same layer
    both = nnx.jit(lambda m, x: (dense_moe(m, x), m(x)))(ours, jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(both[0]), np.asarray(both[1]), atol=TOL)


def test_load_balancing_loss_equals_transformers():
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import load_balancing_loss_func

    logits = np.random.default_rng(2).standard_normal((2, 2 * 6, 5)).astype(np.float32)  # 2 layers, B=2, T=6
    mask = np.ones((2, 6), np.int64)
    mask[0, :2] = 0
    ref = load_balancing_loss_func(tuple(torch.from_numpy(logits)), 5, 2, torch.from_numpy(mask))
    got = load_balancing_loss(jnp.asarray(logits), 2, jnp.asarray(mask.reshape(-1)))
    assert abs(float(got) - float(ref)) < TOL
    ref_all = load_balancing_loss_func(tuple(torch.from_numpy(logits)), 5, 2)
    assert abs(float(load_balancing_loss(jnp.asarray(logits), 2)) - float(ref_all)) < TOL


def test_expert_lora_trains_and_merges():
    """Adapters on both expert projections: per-expert A [E, in, r], B [E, r, out]; merged weights compute the
    same layer; they receive gradients (the router takes none); router logits are recorded on request."""
    from spatial_jax.models import LoRAConfig, LoRAParam, merge_lora

    _, layer = _moe_pair(lora=LoRAConfig(rank=4, targets=("experts_gate_up", "experts_down")))
    gu, dn = layer.experts["gate_up_proj"], layer.experts["down_proj"]
    assert gu.lora_a[...].shape == (5, 32, 4) and dn.lora_b[...].shape == (5, 4, 32) and layer.gate.rank == 0
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, 32)), jnp.float32)
    fwd = nnx.jit(lambda m: m(x))
    layer.record_router_logits = True  # what a trainer adding the load-balancing loss reads
    base = fwd(layer)
    (logits,) = nnx.pop(layer, nnx.Intermediate)["router_logits"]
    np.testing.assert_allclose(np.asarray(logits), np.asarray(x.reshape(10, 32) @ layer.gate.kernel[...]), atol=TOL)
    layer.record_router_logits = False
    for e in (gu, dn):
        e.lora_b[...] = 0.1 * jnp.ones_like(e.lora_b[...])
    adapted = fwd(layer)
    assert float(jnp.abs(adapted - base).max()) > 1e-3
    np.testing.assert_allclose(np.asarray(fwd(merge_lora(layer))), np.asarray(adapted), rtol=TOL, atol=TOL)
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x) ** 2), argnums=nnx.DiffState(0, LoRAParam)))(layer)
    assert all(float(jnp.abs(g[...]).sum()) > 0 for g in jax.tree.leaves(grads, is_leaf=lambda v: isinstance(
        v, nnx.Variable)))


def test_expert_parallel_layer_equals_one_device():
    """Experts over the fsdp axis (2 devices x 4 experts; tokens over data and fsdp, tensor replicated): the
    all-to-all path gives the one-device layer's outputs and gradients (adapters on, so theirs too) through its
    three all-to-alls; a batch the token axes do not divide falls back to every device
    running all experts."""
    from transformers import Qwen3VLMoeConfig

    from spatial_jax.models import LoRAConfig
    from spatial_jax.models.moe import expert_parallel_axes
    from spatial_jax.models.sharding import make_mesh
    from spatial_jax.rl.plan.measure import all_to_alls

    text = dict(MOE["text"], num_experts=8, num_experts_per_tok=3)
    hf_cfg = Qwen3VLMoeConfig(text_config=text, vision_config=dict(MOE["vision"]), **IDS)
    cfg = config_from_hf(json.loads(hf_cfg.to_json_string()),
                              lora=LoRAConfig(rank=2, targets=("experts_gate_up", "experts_down")))
    layer = SparseMoE(cfg, rngs=nnx.Rngs(3))
    for e in layer.experts.values():
        e.lora_b[...] = 0.01 * jax.random.normal(jax.random.key(1), e.lora_b[...].shape)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 6, 32)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((4, 6, 32)), jnp.float32)
    grad = nnx.jit(nnx.value_and_grad(lambda m, x: jnp.sum(m(x) * w), argnums=(nnx.DiffState(0, nnx.Param), 1)))
    value, (g_params, g_x) = grad(layer, x)
    with jax.set_mesh(make_mesh(data=2, fsdp=2, tensor=2)):
        assert expert_parallel_axes(4, 8) == (("data", "fsdp"), ("fsdp",)) and expert_parallel_axes(3, 8) is None
        ep_value, (ep_params, ep_x) = grad(layer, x)
        jaxpr = str(jax.make_jaxpr(lambda x: layer(x))(x))
    assert jaxpr.count("all_to_all[") == 3, "tokens out, counts, results back"
    # plan counts them in compiled programs (XLA:TPU writes tuple-shaped and asynchronous ones too)
    assert all_to_alls("%a = bf16[2,4]{1,0} all-to-all(bf16[2,4]{1,0} %x)\n%b = (f32[2], u32[]) all-to-all-start("
                       "f32[2] %y)\n%c = f32[2] all-to-all-done(%b)\n%d = f32[2] add(%e, %f)") == 2
    assert abs(float(ep_value) - float(value)) < TOL * max(1.0, abs(float(value)))
    np.testing.assert_allclose(np.asarray(ep_x), np.asarray(g_x), atol=TOL)
    leaves = jax.tree.leaves(ep_params), jax.tree.leaves(g_params)
    assert len(leaves[0]) == 7  # the router and both projections' kernels, lora_a and lora_b
    for a, b in zip(*leaves):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=TOL, atol=TOL)

    # The experts through megablox (kernels/grouped_matmul/, Pallas interpreter) in the same shard_map, in 8-row
    # tiles that the groups straddle, the buffers' padding rows past the groups: ragged_dot's outputs and gradients
    # on one device. A batch the token axes do not divide runs every expert on each chip, in shard_map all the same.
    mb = SparseMoE(cfg.replace(moe_matmul="megablox"), rngs=nnx.Rngs(0))
    nnx.update(mb, nnx.state(layer))
    for e in mb.experts.values():
        e.tiling = (8, 16, 16)
    with jax.set_mesh(make_mesh(data=2, fsdp=2, tensor=2)):
        mb_value, (mb_params, mb_x) = grad(mb, x)
        jaxpr = str(jax.make_jaxpr(lambda x: mb(x))(x[:3]))
    assert "shard_map" in jaxpr and "all_to_all[" not in jaxpr and "pallas_call" in jaxpr
    assert abs(float(mb_value) - float(value)) < TOL * max(1.0, abs(float(value)))
    np.testing.assert_allclose(np.asarray(mb_x), np.asarray(g_x), atol=TOL)
    for a, b in zip(jax.tree.leaves(mb_params), leaves[1]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=TOL, atol=TOL)


# ---------------------------------------------------------------- the registry


def test_no_architecture_name_outside_the_registry():
    """No code outside the registry compares an architecture's name (configs of published checkpoints, data, may
    carry one)."""
    root = Path(__file__).resolve().parents[1] / "spatial_jax"
    q = r"""["'](qwen2_5_vl|qwen3_vl|qwen3_vl_moe)\w*["']"""
    names = re.compile(rf"(==|!=|\bin\b)\s*[(\[{{]?\s*{q}|{q}\s*(==|!=|\bin\b)|model_type\s*(==|!=|\bin\b)")
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "registry.py" and names.search(p.read_text())]
    assert offenders == [], offenders


def test_unknown_model_type_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported model_type 'llama'.*qwen2_5_vl"):
        config_from_hf({"model_type": "llama"})



def test_qwen2_5_image_processing_equals_transformers():
    """Qwen2.5-VL's images: 28-pixel multiples (patch 14, merge 2), its released min / max pixels and CLIP
    normalisation (preprocessor_config.json of Qwen2.5-VL-3B/7B-Instruct), 2-frame temporal patches: the registry's
    values (what rl.policy.image_config builds on) give what transformers' Qwen2VLImageProcessorPil does."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from spatial_jax.data.image_processing import ImageProcessingConfig, preprocess
    from spatial_jax.models.registry import architecture

    hf = Qwen2VLImageProcessorPil(patch_size=14, temporal_patch_size=2, merge_size=2,
                                  image_mean=[0.48145466, 0.4578275, 0.40821073],
                                  image_std=[0.26862954, 0.26130258, 0.27577711],
                                  size={"shortest_edge": 3136, "longest_edge": 12845056})
    ours_cfg = ImageProcessingConfig(patch_size=14, **architecture("qwen2_5_vl").image_processing)
    assert ours_cfg.factor == 28
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, size=hw + (3,), dtype=np.uint8)) for hw in ((37, 53), (90, 61))]
    out = hf(images=images, return_tensors="np")
    pixels, grids = preprocess(images, ours_cfg)
    np.testing.assert_array_equal(grids, out["image_grid_thw"])
    assert (grids[:, 1:] % 2 == 0).all() and grids[:, 0].tolist() == [1, 1]
    np.testing.assert_allclose(pixels, out["pixel_values"], atol=1e-6)


# ---------------------------------------------------------------- decoding


@pytest.mark.slow
def test_paged_engine_greedy_equals_transformers_generate(pair):
    """32 greedy tokens per row from the continuous-batching engine (paged KV, fewer slots than rows) equal
    transformers' generate on a left-padded batch with one and two images per row and a text-only row."""
    import dataclasses

    from spatial_jax.rollout import SamplingConfig
    from spatial_jax.rollout import engine as eng

    _, hf, ours = pair
    ids, mask, pixels, grids = image_batch(seed=4)
    ids = np.concatenate([ids, ids[:1]])
    mask = np.concatenate([mask, np.where(np.arange(ids.shape[1]) >= ids.shape[1] - 3, 1, 0)[None]])
    ids[2, mask[2] == 0] = 5  # a text-only row (transformers counts image tokens under padding too)
    n_new = 32
    cfg = dataclasses.replace(SamplingConfig(temperature=0.0, max_new_tokens=n_new), engine="paged", slots=2,
                              page_size=8, chunk=8, pages=12)
    out = eng.generate(ours, ids, mask, cfg=cfg, pixel_values=pixels, image_grid_thw=grids,
                       max_len=ids.shape[1] + n_new)
    types = np.where(ids == IMG, 1, 0) * mask
    with torch.no_grad():
        ref = hf.generate(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
            pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.from_numpy(grids),
            mm_token_type_ids=torch.from_numpy(types), do_sample=False, max_new_tokens=n_new,
            min_new_tokens=n_new, pad_token_id=0, eos_token_id=None, suppress_tokens=[IMG, VID])
    np.testing.assert_array_equal(np.asarray(out.tokens), ref[:, ids.shape[1]:].numpy())
