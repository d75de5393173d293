"""Video samples equal transformers' Qwen3-VL: the video processor (frame sampling, resize, patches, grid), the
processor's timestamped prompt ids, and the logits of a video prompt (1e-4); JSONL rows with video frames.

Also the builders test_multi_image.py shares: a tiny random transformers Qwen3-VL whose vocabulary and special ids
are the project tokenizer's, transformers' video processor with torchvision's tensor ops done by the torch calls
torchvision makes (torchvision is not installed here), and samples of several images or a video."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_model_utils import forward, hf_model, max_err_real

from spatial_jax.data import pipeline as P
from spatial_jax.data import video_processing as V
from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.data.prompts import THINK_BOXES, build_messages
from spatial_jax.data.sample import Sample, Video
from spatial_jax.data.tokenizer import build_tokenizer
from spatial_jax.data.video_processing import VideoProcessingConfig

VARIANT = "tied_gqa2"  # vision patch 4, merge 2: a merged token covers 8 x 8 pixels
IMG_CFG = ImageProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=48 * 48)
VID_CFG = VideoProcessingConfig(patch_size=4, merge_size=2, min_pixels=64, max_pixels=6 * 24 * 24)


def hf_model_for(tok, seed: int = 0):
    """transformers' Qwen3VLForConditionalGeneration (float32, every parameter perturbed) with tok's ids."""
    return hf_model(VARIANT, seed, vocab_size=tok.vocab_size, token_ids=tok.model_token_ids())


def hf_video_processor(cfg: VideoProcessingConfig):
    """transformers' Qwen3VLVideoProcessor at cfg. Its three torchvision calls are replaced by what they run on a
    uint8 / float32 frame tensor: resize = torch's interpolate (bicubic, antialias, uint8 kept), normalize =
    sub / div by the fused mean and std, convert_to_rgb = identity on RGB frames."""
    import transformers.image_processing_backends as backends
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    class Processor(Qwen3VLVideoProcessor):
        def convert_to_rgb(self, video):
            return video

        def normalize(self, image, mean, std, inplace=False, **kwargs):
            return image.sub(torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)).div(
                torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1))

        def resize(self, videos, size, resample, factor, temporal_factor, cap_pixels_per_frame=None, **kwargs):
            saved = backends.TorchvisionBackend.resize
            backends.TorchvisionBackend.resize = _torch_resize
            try:
                return super().resize(videos, size, resample, factor, temporal_factor, cap_pixels_per_frame)
            finally:
                backends.TorchvisionBackend.resize = saved

    return Processor(size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
                     patch_size=cfg.patch_size, merge_size=cfg.merge_size, temporal_patch_size=cfg.temporal_patch_size,
                     fps=cfg.fps, min_frames=cfg.min_frames, max_frames=cfg.max_frames,
                     cap_pixels_per_frame=cfg.cap_pixels_per_frame)


def _torch_resize(self, image, size, resample=None, antialias=True, **kwargs):
    new = (size.height, size.width)
    if tuple(image.shape[-2:]) == new:
        return image
    x = image.reshape(-1, *image.shape[-3:])
    x = torch.nn.functional.interpolate(x, size=list(new), mode="bicubic", align_corners=False, antialias=antialias)
    return x.reshape(*image.shape[:-2], *new)


def hf_processor(tok, video_cfg: VideoProcessingConfig, image_cfg: ImageProcessingConfig):
    """transformers' Qwen3VLProcessor over the project tokenizer, the PIL image processor and the video one above."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    images = Qwen2VLImageProcessorPil(patch_size=image_cfg.patch_size, merge_size=image_cfg.merge_size,
                                      temporal_patch_size=image_cfg.temporal_patch_size,
                                      size={"shortest_edge": image_cfg.min_pixels,
                                            "longest_edge": image_cfg.max_pixels},
                                      image_mean=list(image_cfg.image_mean), image_std=list(image_cfg.image_std))
    class Processor(Qwen3VLProcessor):
        def check_argument_for_proper_class(self, name, arg):  # looks the video class up in torchvision's registry
            return None

    return Processor(image_processor=images, tokenizer=tok.hf, video_processor=hf_video_processor(video_cfg))


def clip(n: int = 7, h: int = 20, w: int = 28, seed: int = 0) -> np.ndarray:
    """A moving gradient with noise: RGB uint8 [n, h, w, 3] whose frames differ."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    frames = [np.stack([(xx * 9 + 20 * t) % 256, (yy * 11 + 7 * t) % 256, np.full_like(xx, 40 * t % 256)], -1)
              for t in range(n)]
    noise = rng.integers(0, 30, (n, h, w, 3))
    return np.clip(np.asarray(frames) + noise, 0, 255).astype(np.uint8)


def choice_sample(sid: str, **visual) -> Sample:
    reference = {"spatialcore": '{"bbox_2d": [1, 2, 30, 40], "label": "cup"}\nleft</think>A', "prosr": "left</think>A",
                 "spatialthinker": "<observe>x</observe><scene>{}</scene><think>y</think><answer>(A) left</answer>",
                 "allospatial": "Step5: Final Answer <Answer>A</Answer>"}
    return Sample(id=sid, image=visual.pop("image", None), question="Which side is the cup on?",
                  options=("left", "right"), answer="A", reference=reference, **visual)


def video_sample(sid: str = "v0", n: int = 7, fps: float = 3.0, seed: int = 0) -> Sample:
    return choice_sample(sid, video=Video(frames=tuple(clip(n, seed=seed)), fps=fps))


def multi_image_sample(sid: str = "m0", seed: int = 1) -> Sample:
    rng = np.random.default_rng(seed)
    images = (rng.integers(0, 256, (24, 32, 3), dtype=np.uint8), rng.integers(0, 256, (40, 16, 3), dtype=np.uint8),
              rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
    return choice_sample(sid, images=images)


# ---------------------------------------------------------------- tests

TOL = 1e-4


@pytest.mark.parametrize("n, h, w, fps, cap", [(9, 50, 70, 4.0, False), (30, 64, 96, 10.0, False),
                                               (5, 40, 40, 1.0, False), (3, 300, 200, 30.0, False),
                                               (40, 120, 90, 24.0, True)])
def test_video_preprocessing_equals_transformers(n, h, w, fps, cap):
    """Frame indices, pixel values (bit for bit) and grid at Qwen3-VL's released video config: odd frame counts
    (the last frame repeated), fewer frames than min_frames, upscaling, downscaling, the per-frame cap."""
    cfg = V.VideoProcessingConfig(cap_pixels_per_frame=cap)
    v = clip(n, h, w, seed=n)
    out = hf_video_processor(cfg)(videos=[v], video_metadata=[{"fps": fps, "total_num_frames": n}],
                                  return_tensors="np", return_metadata=True)
    idx = V.sample_indices(n, fps, cfg)
    np.testing.assert_array_equal(idx, out["video_metadata"][0].frames_indices)
    pixels, grid = V.preprocess_video(v[idx], cfg)
    np.testing.assert_array_equal(grid, out["video_grid_thw"][0])
    np.testing.assert_array_equal(pixels, out["pixel_values_videos"])


def test_timestamps_and_bad_videos():
    assert V.timestamps([0, 3, 6], 3.0) == [0.5, 2.0]  # the last frame fills the final group
    assert V.video_placeholder((2, 2, 2), [0.5, 2.0]).count("<|video_pad|>") == 2
    with pytest.raises(ValueError, match="at least 2 frames"):
        V.preprocess_video(clip(1), V.VideoProcessingConfig())
    with pytest.raises(ValueError, match="uint8"):
        V.preprocess_video(clip(4).astype(np.float32), V.VideoProcessingConfig())
    with pytest.raises(ValueError, match="aspect ratio"):
        V.preprocess_video(np.zeros((2, 2, 500, 3), np.uint8), V.VideoProcessingConfig())


def _qwen2_video_processor_class():
    """transformers' Qwen2VLVideoProcessor (Qwen2.5-VL's), imported with an empty stand-in for the torchvision
    module its file names at the top (only in annotations; torchvision is not installed here)."""
    import importlib
    import sys
    import types
    from unittest import mock

    for name in ("video_processing_utils", "processing_utils", "image_processing_utils", "video_utils"):
        importlib.import_module(f"transformers.{name}")  # before the stand-in: they test for torchvision
    names = ("torchvision", "torchvision.transforms", "torchvision.transforms.v2",
             "torchvision.transforms.v2.functional")
    with mock.patch.dict(sys.modules, {n: types.ModuleType(n) for n in names}):
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    return Qwen2VLVideoProcessor


def qwen2_videos_class(torch_resize=None):
    """Qwen2VLVideoProcessor with torchvision's ops done by the torch calls they make: frames kept as given, the
    normalisation in torch, and torch_resize (default _torch_resize) standing in for torchvision's resize."""
    import transformers.image_processing_backends as backends

    stand_in = _torch_resize if torch_resize is None else torch_resize

    class Videos(_qwen2_video_processor_class()):
        def convert_to_rgb(self, video):
            return video

        def normalize(self, image, mean, std, inplace=False, **kwargs):
            return image.sub(torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)).div(
                torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1))

        def resize(self, videos, size, resample, factor, temporal_factor=2, cap_pixels_per_frame=None,
                   max_video_tokens=None, **kwargs):
            saved = backends.TorchvisionBackend.resize
            backends.TorchvisionBackend.resize = stand_in
            try:
                return super().resize(videos, size, resample, factor, temporal_factor, cap_pixels_per_frame,
                                      max_video_tokens)
            finally:
                backends.TorchvisionBackend.resize = saved

    return Videos


def test_patched_frame_sampling_equals_qwen2_5_vl_processor():
    """Qwen2.5-VL's sampling (whole temporal patches, a float stride from frame 0, n + 1 frames where torch's
    arange rounds so) and its second_per_grid_ts, against transformers over clip lengths and frame rates."""
    from transformers.video_utils import VideoMetadata

    hf = _qwen2_video_processor_class()(do_sample_frames=True)
    extra = 0
    for cfg in (VideoProcessingConfig(fps=2.0), VideoProcessingConfig(fps=1.3, min_frames=3, max_frames=31)):
        for total in (2, 3, 9, 44, 65, 191, 4321):
            for fps in (1.0, 23.976, 30.0):
                meta = VideoMetadata(total_num_frames=total, fps=fps)
                ref = hf.sample_frames(meta, fps=cfg.fps, min_frames=cfg.min_frames, max_frames=cfg.max_frames,
                                       temporal_patch_size=2).numpy()
                got = V.sample_indices_patched(total, fps, cfg)
                np.testing.assert_array_equal(got, ref)
                extra += len(got) % 2
                meta.frames_indices = ref.tolist()
                assert V.second_per_grid(len(got), total, fps) == pytest.approx(2 / meta.sampled_fps, rel=1e-12)
    assert extra > 0, "some case keeps the odd extra frame"
    with pytest.raises(ValueError, match="at least 2 frames"):
        V.sample_indices_patched(1, 30.0, VideoProcessingConfig())


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    from spatial_jax.models.hf_io import from_pretrained

    tok = build_tokenizer()
    hf = hf_model_for(tok)
    path = tmp_path_factory.mktemp("mm_model")
    hf.save_pretrained(path)
    return tok, hf, from_pretrained(path)


def hf_inputs(tok, sample, frames, fps):
    """transformers' processor on the chat template's text and the video (its own frame sampling)."""
    text = tok.hf.apply_chat_template(build_messages(sample, THINK_BOXES), tokenize=False,
                                      add_generation_prompt=True, enable_thinking=True)
    return hf_processor(tok, VID_CFG, IMG_CFG)(
        text=[text], videos=[frames], return_tensors="pt",
        videos_kwargs=dict(video_metadata=[{"fps": fps, "total_num_frames": len(frames)}], return_metadata=True))


def test_video_prompt_ids_and_logits_equal_transformers(models):
    """The pipeline's prompt (timestamps, one vision block per frame group, no block around them) and
    patches equal transformers' processor's; the model, given the video as frame items, gives transformers'
    logits with pixel_values_videos / video_grid_thw (max abs error over all tokens < 1e-4)."""
    tok, hf, ours = models
    sample = video_sample(n=7, fps=3.0)
    ex = P.encode_sample(sample, tok, THINK_BOXES, "rl", IMG_CFG, video_cfg=VID_CFG)
    ref = hf_inputs(tok, sample, clip(7), 3.0)
    np.testing.assert_array_equal(ex.input_ids, ref["input_ids"][0].numpy())
    np.testing.assert_array_equal(ex.pixel_values, ref["pixel_values_videos"].numpy())
    t, h, w = ref["video_grid_thw"][0].tolist()
    np.testing.assert_array_equal(ex.image_grid_thw, [[1, h, w]] * t)
    assert "<1.7 seconds>" in tok.decode(ex.input_ids)
    with torch.no_grad():
        want = hf(**{k: v for k, v in ref.items() if k != "video_metadata"}).logits.numpy()
    ids, mask = ex.input_ids[None], np.ones((1, len(ex.input_ids)), np.int32)
    pos, _ = ours.get_rope_index(ids, ex.image_grid_thw, mask)
    ref_pos, _ = hf.model.get_rope_index(ref["input_ids"], mm_token_type_ids=ref["mm_token_type_ids"],
                                         video_grid_thw=ref["video_grid_thw"])
    np.testing.assert_array_equal(pos, ref_pos.numpy())
    got = forward(ours, ids, mask, ex.pixel_values, ex.image_grid_thw, positions=pos)
    assert max_err_real(got, want, mask) < TOL


def test_video_rows_from_jsonl(tmp_path):
    """A JSONL row naming frame files (with their own frame indices) loads and encodes; a missing frame file is
    named with the row's file:line."""
    import json

    from PIL import Image

    from spatial_jax.data.jsonl import read_jsonl
    from spatial_jax.data.sample import DatasetError

    for k, f in enumerate(clip(4)):
        Image.fromarray(f).save(tmp_path / f"f{k}.png")
    row = {"id": "v", "video": {"frames": [f"f{k}.png" for k in range(4)], "fps": 2, "frame_indices": [0, 4, 8, 12]},
           "question": "q?", "options": ["a", "b"], "answer": "B"}
    (tmp_path / "d.jsonl").write_text(json.dumps(row) + "\n")
    s = read_jsonl(tmp_path / "d.jsonl")[0]
    ex = P.encode_sample(s, build_tokenizer(), THINK_BOXES, "rl", IMG_CFG, video_cfg=VID_CFG)
    assert len(ex.image_grid_thw) == 2 and "<1.0 seconds>" in build_tokenizer().decode(ex.input_ids)  # (0+2)/2
    assert s.to_json()["video"]["frame_indices"] == [0, 4, 8, 12]
    row["video"]["frames"][2] = "gone.png"
    (tmp_path / "d.jsonl").write_text("\n" + json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match=r"d\.jsonl:2: field 'video.frames\[2\]': '.*gone\.png' does not exist"):
        read_jsonl(tmp_path / "d.jsonl")


def test_video_file_decodes_as_transformers_pyav_reader(tmp_path):
    """An mp4 sample: frames, sampled indices and fps equal transformers' PyAV reader with the processor's sampling,
    and the sample encodes (timestamps from the file's rate); a damaged file is a DatasetError naming the row."""
    av = pytest.importorskip("av")
    from transformers.video_utils import read_video_pyav

    from spatial_jax.data.sample import DatasetError

    path = tmp_path / "clip.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=6)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        for f in clip(13, 24, 32):
            out.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        out.mux(stream.encode())
    frames, idx, fps = V.read_video_file(str(path), lambda total, rate: V.sample_indices(total, rate, VID_CFG))
    ref, meta = read_video_pyav(str(path), hf_video_processor(VID_CFG).sample_frames)
    assert fps == meta.fps == 6.0
    np.testing.assert_array_equal(idx, V.sample_indices(13, 6.0, VID_CFG))
    np.testing.assert_array_equal(frames, ref)
    sample = choice_sample("f", video=Video(path=str(path)))
    ex = P.encode_sample(sample, build_tokenizer(), THINK_BOXES, "rl", IMG_CFG, video_cfg=VID_CFG)
    text = build_tokenizer().decode(ex.input_ids)  # frames 0, 4 | 8, 12 at 6 fps
    assert len(ex.image_grid_thw) == 2 and "<0.3 seconds>" in text and "<1.7 seconds>" in text
    path.write_bytes(b"not a video")
    with pytest.raises(DatasetError, match=r"sample f: video .*clip\.mp4"):
        P.encode_sample(sample, build_tokenizer(), THINK_BOXES, "rl", IMG_CFG, video_cfg=VID_CFG)
