"""Hugging Face export: weights sharded over a mesh, adapters merged, streamed into several safetensors files, load in
transformers with the JAX policy's logits (float32, max abs 1e-4 over real tokens); `spatial-jax export` refuses what
is not a run. The export of a two-process run (weights sharded across processes) and the command on a real run are
tested on the cluster run of tests/test_multihost.py."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from test_model_lora import tiny_image_batch
from test_model_utils import forward, max_err_real

from spatial_jax.cli import main
from spatial_jax.models import LoRAConfig, ModelConfig, create_model
from spatial_jax.models.hf_io import save_pretrained
from spatial_jax.models.lora import lora_layers
from spatial_jax.models.sharding import make_mesh

TOL = 1e-4


def hf_logits_of(path, ids, mask, positions, pixels, grids, image_token_id) -> np.ndarray:
    """transformers' logits from the checkpoint at `path`, with our M-RoPE positions."""
    from transformers import Qwen3VLForConditionalGeneration

    hf = Qwen3VLForConditionalGeneration.from_pretrained(path).float().eval()
    with torch.no_grad():
        return hf(input_ids=torch.from_numpy(np.asarray(ids, np.int64)),
                  attention_mask=torch.from_numpy(np.asarray(mask, np.int64)),
                  position_ids=torch.from_numpy(np.asarray(positions, np.int64)),
                  pixel_values=torch.from_numpy(np.asarray(pixels, np.float32)),
                  image_grid_thw=torch.from_numpy(np.asarray(grids, np.int64)),
                  mm_token_type_ids=torch.from_numpy((np.asarray(ids) == image_token_id).astype(np.int64))
                  ).logits.numpy()


def export_error(model, path, ids, mask, pixels, grids) -> float:
    """Largest |logit| difference over real tokens between `model` and transformers on its export at `path`."""
    positions, _ = model.get_rope_index(ids, grids, mask)
    ours = forward(model, ids, mask, pixels, grids, positions=positions)
    theirs = hf_logits_of(path, ids, mask, positions, pixels, grids, model.cfg.image_token_id)
    return max_err_real(ours, theirs, mask)


def test_sharded_adapted_model_exports_in_pieces(tmp_path):
    # stacked (scanned) layers: each layer's tensor is cut from the stacked array; unstacked ones are the simple case
    lora = LoRAConfig(rank=4, alpha=8.0, dropout=0.0, vision_rank=2, vision_alpha=4.0)
    cfg = ModelConfig.tiny(vocab_size=96, tie_word_embeddings=False, lora=lora).replace(scan_layers=True)
    model = create_model(cfg, seed=2, mesh=make_mesh(2, 2, 2))
    rng = np.random.default_rng(0)
    for layer in lora_layers(model):  # adapters that change the function, in both towers
        if layer.rank:
            b = layer.lora_b[...]
            layer.lora_b[...] = jax.device_put(jnp.asarray(0.3 * rng.standard_normal(b.shape), b.dtype), b.sharding)
    assert any(not x.is_fully_replicated for x in jax.tree.leaves(nnx.state(model, nnx.Param)))  # sharded for real
    save_pretrained(model, tmp_path, max_shard_bytes=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 2 and all((tmp_path / f).exists() for f in files)
    names = set(index["weight_map"])
    assert not any("lora" in n for n in names)
    assert "model.language_model.layers.1.mlp.down_proj.weight" in names  # per layer, also from stacked weights
    ids, mask, pixels, grids = tiny_image_batch(cfg, seed=1)
    assert export_error(model, tmp_path, ids, mask, pixels, grids) < TOL


def test_export_command_refuses_what_is_not_a_run(tmp_path, capsys):
    assert main(["export", "--run-dir", str(tmp_path / "missing"), "--out", str(tmp_path / "hf")]) == 2
    assert "holds no config.json" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run_dir": str(run)}))
    assert main(["export", "--run-dir", str(run), "--out", str(tmp_path / "hf")]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
