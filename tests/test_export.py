"""Hugging Face export from weights sharded across processes: two CPU processes of 2 devices each hold a tiny policy
with adapters in both towers and scanned (stacked) layers on a 2x2 (data, fsdp) mesh spanning both, export it in
several safetensors files (layers cut from the stacked arrays, adapters merged), and transformers' logits on the files
equal the JAX policy's as the two processes computed them (float32, max abs 1e-4 over real tokens). The job's own
export at the end of a two-process run and `spatial-jax export` on it are tested on tests/test_multihost.py's cluster
run; here also the command's refusals."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spatial_jax.cli import main
from spatial_jax.models import get_rope_index, load_config

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4

# each process: join the cluster, build the same random policy on the global mesh, give its adapters weights that
# change the function, compute its logits on a two-row image batch (the first process keeps them), export it
PROCESS = """
import sys
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from spatial_jax import distributed
distributed.initialize()
from spatial_jax.models import LoRAConfig, ModelConfig, Qwen3VL, get_rope_index, prepare_vision_inputs
from spatial_jax.models.hf_io import save_pretrained
from spatial_jax.models.lora import lora_layers
from spatial_jax.models.sharding import make_mesh, state_shardings

lora = LoRAConfig(rank=4, alpha=8.0, dropout=0.0, vision_rank=2, vision_alpha=4.0)
cfg = ModelConfig.tiny(vocab_size=96, tie_word_embeddings=False, lora=lora).replace(scan_layers=True)
model = Qwen3VL(cfg, rngs=nnx.Rngs(2))
state = nnx.state(model)  # placed as sharding.shard_model does, with distributed.place for the dropout keys
nnx.update(model, jax.tree.map(lambda v, s: v.replace(distributed.place(v.get_value(), s.get_value())), state,
                               state_shardings(state, make_mesh(2, 2)), is_leaf=lambda x: isinstance(x, nnx.Variable)))
rng = np.random.default_rng(0)
for layer in lora_layers(model):
    if layer.rank:
        b = layer.lora_b[...]
        layer.lora_b[...] = jax.device_put(jnp.asarray(0.3 * rng.standard_normal(b.shape), b.dtype), b.sharding)
assert not all(x.is_fully_addressable for x in jax.tree.leaves(nnx.state(model)))  # sharded across the processes
ids, mask, grids = np.zeros((2, 10), np.int32), np.zeros((2, 10), np.int32), np.array([[1, 4, 4], [1, 2, 2]])
for b, row in enumerate([[3, cfg.vision_start_token_id] + [cfg.image_token_id] * 4 + [cfg.vision_end_token_id, 5, 6],
                         [7, 8, cfg.vision_start_token_id, cfg.image_token_id, cfg.vision_end_token_id, 9]]):
    ids[b, 10 - len(row):], mask[b, 10 - len(row):] = row, 1
pixels = rng.standard_normal((int(grids.prod(-1).sum()), cfg.vision.patch_dim)).astype(np.float32)
positions, _ = get_rope_index(ids, grids, mask, image_token_id=cfg.image_token_id,
                              spatial_merge_size=cfg.vision.spatial_merge_size)
vision = prepare_vision_inputs(pixels, grids, cfg.vision)
forward = nnx.jit(lambda m, *a: m(a[0], positions=a[1], attention_mask=a[2], vision=a[3])[0])
logits = distributed.to_host(forward(model, ids, jnp.asarray(positions), mask, vision))
if distributed.is_primary():
    np.savez(sys.argv[2], ids=ids, mask=mask, grids=grids, pixels=pixels, logits=logits)
save_pretrained(model, sys.argv[1], max_shard_bytes=40_000)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


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


def export_error(logits, path, ids, mask, pixels, grids) -> float:
    """Largest |logit| difference over real tokens between `logits` (the JAX policy's) and transformers' on the
    export at `path`."""
    cfg = load_config(path)
    positions, _ = get_rope_index(ids, grids, mask, image_token_id=cfg.image_token_id,
                                  spatial_merge_size=cfg.vision.spatial_merge_size)
    theirs = hf_logits_of(path, ids, mask, positions, pixels, grids, cfg.image_token_id)
    return float(np.abs(np.asarray(logits) - theirs)[np.asarray(mask) > 0].max())


class _TorchVideoOps:
    """A video processor's three torchvision calls done by the torch calls they make on uint8 / float32 frames
    (torchvision is not installed here; test_video.hf_video_processor): resize = torch's interpolate, normalize =
    sub / div by the fused mean and std, convert_to_rgb = identity on RGB frames."""

    def convert_to_rgb(self, video):
        return video

    def normalize(self, image, mean, std, inplace=False, **kwargs):
        return image.sub(torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)).div(
            torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1))

    def resize(self, *args, **kwargs):
        import transformers.image_processing_backends as backends
        from test_video import _torch_resize

        saved = backends.TorchvisionBackend.resize
        backends.TorchvisionBackend.resize = _torch_resize
        try:
            return super().resize(*args, **kwargs)
        finally:
            backends.TorchvisionBackend.resize = saved


def auto_processor(folder, monkeypatch):
    """transformers' AutoProcessor on `folder` as it loads with torchvision installed: the classes its files name
    (processor, image processor by the PIL backend, video processor by name), the video processor with
    _TorchVideoOps."""
    import transformers.models.auto.video_processing_auto as auto
    from test_video import _qwen2_video_processor_class
    from transformers import AutoProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.processing_utils import ProcessorMixin

    classes = {"Qwen2VLVideoProcessor": _qwen2_video_processor_class(), "Qwen3VLVideoProcessor": Qwen3VLVideoProcessor}

    def by_name(name):  # transformers' lookup gives None for every video processor without torchvision
        return type(name, (_TorchVideoOps, classes[name]), {}) if name in classes else None

    check = ProcessorMixin.check_argument_for_proper_class  # looks the video class up in torchvision's registry
    monkeypatch.setattr(auto, "video_processor_class_from_name", by_name)
    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class",
                        lambda self, name, arg: None if name == "video_processor" else check(self, name, arg))
    return AutoProcessor.from_pretrained(folder)


def check_export_processors(ws, out, monkeypatch, names):
    """`ws.export` to `out` loads in AutoProcessor as `names` (processor, image processor, video processor), with
    the run's min / max pixels, and the processor gives an image prompt and a video prompt the ids, pixel values and
    grids (and second_per_grid_ts where it gives them) of the data layer under the policy's image config and the
    video config it implies."""
    from test_video import choice_sample, clip

    from spatial_jax.data import pipeline as P
    from spatial_jax.data.prompts import THINK_BOXES, build_messages
    from spatial_jax.data.sample import Video
    from spatial_jax.data.video_processing import frame_grids

    ws.export(out)
    processor = auto_processor(out, monkeypatch)
    assert [type(x).__name__ for x in (processor, processor.image_processor, processor.video_processor)] == names
    image_cfg = ws.policy.image_cfg
    video_cfg = P.video_config(image_cfg, None)
    for proc, cfg in ((processor.image_processor, image_cfg), (processor.video_processor, video_cfg)):
        assert (proc.size.shortest_edge, proc.size.longest_edge) == (cfg.min_pixels, cfg.max_pixels)
    image = np.random.default_rng(0).integers(0, 256, (90, 130, 3), np.uint8)
    frames, fps = clip(9, seed=1), 4.0
    video = dict(videos=[frames], videos_kwargs=dict(video_metadata=[{"fps": fps, "total_num_frames": len(frames)}],
                                                     return_metadata=True))
    for sample, visual, kind in ((choice_sample("i", image=image), dict(images=[image]), "image"),
                                 (choice_sample("v", video=Video(frames=tuple(frames), fps=fps)), video, "video")):
        ours = P.encode_sample(sample, ws.tok, THINK_BOXES, "rl", image_cfg, video_cfg=video_cfg)
        text = ws.tok.hf.apply_chat_template(build_messages(sample, THINK_BOXES), tokenize=False,
                                             add_generation_prompt=True, enable_thinking=True)
        theirs = processor(text=[text], return_tensors="np", **visual)
        np.testing.assert_array_equal(ours.input_ids, theirs["input_ids"][0])
        grids = theirs[f"{kind}_grid_thw"]
        if kind == "video" and video_cfg.timing == "timestamps":  # the data layer's frame items
            grids = np.concatenate([frame_grids(g) for g in grids])
        np.testing.assert_array_equal(ours.image_grid_thw, grids)
        pixels = theirs["pixel_values" if kind == "image" else "pixel_values_videos"]
        np.testing.assert_allclose(ours.pixel_values, pixels, atol=1e-5)
        if "second_per_grid_ts" in theirs:
            np.testing.assert_array_equal(ours.second_per_grid, np.asarray(theirs["second_per_grid_ts"], np.float32))


@pytest.mark.slow
def test_two_processes_export_an_adapted_sharded_policy(tmp_path):
    port, out = _free_port(), tmp_path / "hf"
    logs = [tmp_path / f"process{i}.log" for i in range(2)]
    cluster = []
    try:
        for i, log in enumerate(logs):  # output to files: an unread pipe could stall a process mid-collective
            with open(log, "wb") as f:
                env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS="--xla_force_host_platform_device_count=2",
                           JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i))
                cluster.append(subprocess.Popen([sys.executable, "-c", PROCESS, str(out), str(tmp_path / "jax.npz")],
                                                cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env))
        for proc in cluster:
            proc.wait(timeout=300)
    finally:
        for proc in cluster:
            proc.kill()
    for proc, log in zip(cluster, logs):
        assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 2 and sorted(p.name for p in out.glob("*.safetensors")) == sorted(files)
    assert not any("lora" in name for name in index["weight_map"])
    assert "model.language_model.layers.1.mlp.down_proj.weight" in index["weight_map"]  # cut from a stacked array
    ours = np.load(tmp_path / "jax.npz")
    err = export_error(ours["logits"], out, ours["ids"], ours["mask"], ours["pixels"], ours["grids"])
    assert err < TOL


def test_export_command_refuses_what_is_not_a_run(tmp_path, capsys):
    assert main(["export", "--run-dir", str(tmp_path / "missing"), "--out", str(tmp_path / "hf")]) == 2
    assert "holds no config.json" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run_dir": str(run)}))
    assert main(["export", "--run-dir", str(run), "--out", str(tmp_path / "hf")]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_the_export_carries_the_processors_with_the_runs_pixel_budget(tmp_path):
    """Issue 36 item 28: preprocessor_config.json (and the video processor's) beside the weights, so transformers
    preprocesses an image as the policy was trained, with the run's own pixel bounds."""
    from transformers import AutoImageProcessor

    from spatial_jax import config as C
    from spatial_jax.data.image_processing import preprocess
    from spatial_jax.data.visuals import video_config
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.workspace import Workspace

    ws = Workspace(C.load(TrainConfig, None, [f"run_dir={tmp_path / 'run'}", "policy.min_pixels=1024",
                                              "policy.max_pixels=5000"]), record_config=False)
    out = ws.export(tmp_path / "hf")
    processor = AutoImageProcessor.from_pretrained(out)
    assert (processor.size.shortest_edge, processor.size.longest_edge) == (1024, 5000)
    image = np.random.default_rng(0).integers(0, 256, (90, 130, 3), np.uint8)
    theirs = processor(images=[image], return_tensors="np")
    ours, grid = preprocess([image], ws.policy.image_cfg)
    assert np.array_equal(theirs["image_grid_thw"], np.asarray(grid).reshape(-1, 3))
    np.testing.assert_allclose(theirs["pixel_values"], ours, atol=1e-5)
    video = json.loads((out / "video_preprocessor_config.json").read_text())
    expected = video_config(ws.policy.image_cfg, None)
    assert video["size"] == {"shortest_edge": expected.min_pixels, "longest_edge": expected.max_pixels}
    assert (video["fps"], video["min_frames"], video["max_frames"]) == (expected.fps, expected.min_frames,
                                                                         expected.max_frames)
    try:
        import torchvision  # noqa: F401  (transformers' video processors need it)
    except ImportError:
        return
    from transformers import AutoProcessor

    assert AutoProcessor.from_pretrained(out).image_processor.size.longest_edge == 5000


def test_the_export_is_written_in_the_dtype_asked(tmp_path):
    """save_pretrained(dtype=...) writes that dtype (float32 master weights exported as bfloat16), in every tensor's
    safetensors header and in config.json; the default is the parameter dtype."""
    import json
    import struct

    from flax import nnx

    from spatial_jax.data.tokenizer import build_tokenizer
    from spatial_jax.models import ModelConfig, Qwen3VL
    from spatial_jax.models.hf_io import save_pretrained

    tok = build_tokenizer(768)
    model = Qwen3VL(ModelConfig.tiny(tok.vocab_size, **tok.model_token_ids()), rngs=nnx.Rngs(0))

    def header_dtypes(folder):
        found = set()
        for shard in folder.glob("*.safetensors"):
            with open(shard, "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
            found |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
        return found

    save_pretrained(model, tmp_path / "half", dtype="bfloat16")
    assert header_dtypes(tmp_path / "half") == {"BF16"}
    assert json.loads((tmp_path / "half" / "config.json").read_text())["dtype"] == "bfloat16"
    save_pretrained(model, tmp_path / "full")
    assert header_dtypes(tmp_path / "full") == {"F32"}


@pytest.mark.parametrize("arch", ["qwen3_vl", "qwen3_vl_moe"])
def test_the_export_carries_qwen3_vl_processors(arch, tmp_path, monkeypatch):
    """Qwen3-VL's export (the tiny random policy) and Qwen3-VL-MoE's (a tiny transformers checkpoint) name Qwen3-VL's
    processors, as transformers maps both model types: AutoProcessor loads a Qwen3VLProcessor whose image and video
    processors (timestamped temporal patches) give an image and a video prompt the data layer's ids, pixel values and
    grids, with the run's min / max pixels."""
    from test_model_archs import hf_model
    from test_multi_image import tiny

    from spatial_jax.data.tokenizer import build_tokenizer
    from spatial_jax.rl.workspace import Workspace

    extra = []
    if arch != "qwen3_vl":
        tok = build_tokenizer()
        hf_model(arch, vocab_size=tok.vocab_size, ids=tok.model_token_ids()).save_pretrained(tmp_path / "ckpt")
        tok.save(tmp_path / "ckpt")
        extra = [f"policy.checkpoint={tmp_path / 'ckpt'}"]
    ws = Workspace(tiny(tmp_path / "run", *extra, "policy.min_pixels=1024", "policy.max_pixels=5000"),
                   record_config=False)
    assert ws.model.cfg.model_type == arch
    check_export_processors(ws, tmp_path / "hf", monkeypatch,
                            ["Qwen3VLProcessor", "Qwen2VLImageProcessorPil", "Qwen3VLVideoProcessor"])
