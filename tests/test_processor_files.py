"""The processor files an export writes (data/processor_files.py), read back by transformers: each architecture's
image processor, loaded by AutoImageProcessor from the folder, holds every setting of a non-default config and
preprocesses an image to the data layer's pixels; the video file holds the video config's own settings. The export
tests (test_export.py, test_qwen2_5_video.py) run the same files through a whole export; these take a second."""

import json

import numpy as np
import pytest

from spatial_jax.data.image_processing import ImageProcessingConfig, preprocess
from spatial_jax.data.processor_files import image_processor_config, video_processor_config, write_processor_configs
from spatial_jax.data.video_processing import VideoProcessingConfig
from spatial_jax.models.registry import architecture

# CLIP's normalisation and Qwen2.5-VL's patch, none of them the defaults, so a setting taken from elsewhere shows
IMAGE = ImageProcessingConfig(patch_size=14, temporal_patch_size=2, merge_size=2, min_pixels=3136, max_pixels=12544,
                              image_mean=(0.48145466, 0.4578275, 0.40821073),
                              image_std=(0.26862954, 0.26130258, 0.27577711))
VIDEO = VideoProcessingConfig(patch_size=14, temporal_patch_size=2, merge_size=2, min_pixels=1024, max_pixels=40960,
                              fps=1.5, min_frames=2, max_frames=64, cap_pixels_per_frame=True, max_video_tokens=300,
                              image_mean=(0.1, 0.2, 0.3), image_std=(0.4, 0.5, 0.6))


@pytest.mark.parametrize("model_type", ["qwen3_vl", "qwen2_5_vl"])
def test_transformers_reads_the_image_processor_as_the_data_layer_preprocesses(model_type, tmp_path):
    from transformers import AutoImageProcessor

    classes = architecture(model_type).processor_files
    write_processor_configs(tmp_path, IMAGE, VIDEO, classes)
    theirs = AutoImageProcessor.from_pretrained(tmp_path)
    assert theirs.__class__.__name__.startswith(classes["image_processor_type"])  # the PIL backend's "...Pil" too
    assert (theirs.size.shortest_edge, theirs.size.longest_edge) == (IMAGE.min_pixels, IMAGE.max_pixels)
    assert (theirs.patch_size, theirs.temporal_patch_size, theirs.merge_size) == (14, 2, 2)
    np.testing.assert_allclose(theirs.image_mean, IMAGE.image_mean, rtol=0)
    np.testing.assert_allclose(theirs.image_std, IMAGE.image_std, rtol=0)
    assert (theirs.do_resize, theirs.do_rescale, theirs.do_normalize, theirs.do_convert_rgb) == (True,) * 4
    assert theirs.rescale_factor == 1 / 255
    image = np.random.default_rng(0).integers(0, 256, (90, 130, 3), np.uint8)
    got = theirs(images=[image], return_tensors="np")
    ours, grid = preprocess([image], IMAGE)
    assert np.array_equal(got["image_grid_thw"], np.asarray(grid).reshape(-1, 3))
    np.testing.assert_allclose(got["pixel_values"], ours, atol=1e-5)  # float32 against transformers' own rounding
    text = (tmp_path / "preprocessor_config.json").read_text()
    assert json.loads(text) == image_processor_config(IMAGE, classes) == {
        "image_processor_type": classes["image_processor_type"], "processor_class": classes["processor_class"],
        "size": {"shortest_edge": 3136, "longest_edge": 12544}, "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2, "image_mean": list(IMAGE.image_mean), "image_std": list(IMAGE.image_std), "do_resize": True,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True}
    assert text == json.dumps(json.loads(text), indent=2) + "\n"  # as save_pretrained writes its JSON: indented


def test_the_video_file_holds_the_video_configs_own_settings(tmp_path):
    classes = architecture("qwen3_vl").processor_files
    write_processor_configs(tmp_path, IMAGE, VIDEO, classes)
    written = json.loads((tmp_path / "video_preprocessor_config.json").read_text())
    assert written == {  # the keys as Qwen3VLVideoProcessor's and Qwen2VLVideoProcessor's constructors name them
        "video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor",
        "size": {"shortest_edge": 1024, "longest_edge": 40960}, "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2, "image_mean": [0.1, 0.2, 0.3], "image_std": [0.4, 0.5, 0.6], "do_resize": True,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
        "do_sample_frames": True, "fps": 1.5, "min_frames": 2, "max_frames": 64, "cap_pixels_per_frame": True,
        "max_video_tokens": 300}
    assert written == video_processor_config(VIDEO, classes)
    text = (tmp_path / "video_preprocessor_config.json").read_text()
    assert text == json.dumps(written, indent=2) + "\n"


@pytest.mark.parametrize("classes", [
    {"processor_class": "P", "image_processor_type": "I"},
    {"processor_class": "P", "image_processor_type": "I", "video_processor_type": "V", "tokenizer_class": "T"},
    {"processor_class": "P", "image_processor_type": "", "video_processor_type": "V"},
    {"processor_class": "P", "image_processor_type": None, "video_processor_type": "V"}])
def test_a_class_map_without_exactly_the_three_names_is_refused(classes, tmp_path):
    with pytest.raises(ValueError) as e:
        write_processor_configs(tmp_path, IMAGE, VIDEO, classes)
    assert str(e.value) == ("processor classes need exactly ('processor_class', 'image_processor_type', "
                            f"'video_processor_type') as names, got {classes!r}")
    with pytest.raises(ValueError):
        video_processor_config(VIDEO, classes)
    assert not list(tmp_path.iterdir())
