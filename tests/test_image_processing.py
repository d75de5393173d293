"""Parity of spatial_jax.data.image_processing with Hugging Face's Qwen2VLImageProcessorPil at Qwen3-VL's defaults.

Both sides resize with PIL bicubic on uint8 and normalise in float32, so the expected difference is exactly 0;
the tolerance is set at 1e-6 (absolute, on normalised values in [-1, 1]) to allow for float32 reordering only.
"""

import numpy as np
import pytest
from PIL import Image

from spatial_jax.data.image_processing import ImageProcessingConfig, num_image_tokens, preprocess, smart_resize

TOL = 1e-6

hf_ip = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")


def hf_processor(cfg: ImageProcessingConfig):
    """The class Qwen3-VL's AutoImageProcessor resolves to here, built with explicit kwargs (no hub download)."""
    return hf_ip.Qwen2VLImageProcessorPil(
        patch_size=cfg.patch_size,
        temporal_patch_size=cfg.temporal_patch_size,
        merge_size=cfg.merge_size,
        image_mean=list(cfg.image_mean),
        image_std=list(cfg.image_std),
        size={"shortest_edge": cfg.min_pixels, "longest_edge": cfg.max_pixels},
    )


def rand_image(h, w, seed, channels=3):
    rng = np.random.default_rng(seed)
    shape = (h, w) if channels == 1 else (h, w, channels)
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


def hf_out(images, cfg):
    out = hf_processor(cfg)(images=images, return_tensors="np")
    return np.asarray(out["pixel_values"]), np.asarray(out["image_grid_thw"])


DEFAULT = ImageProcessingConfig()
# A smaller pixel budget keeps images tiny while exercising both the upscale and the downscale branch.
SMALL = ImageProcessingConfig(min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 24)


@pytest.mark.parametrize(
    "cfg,hw",
    [
        (DEFAULT, (256, 256)),  # exactly min_pixels: no rescaling of the budget
        (DEFAULT, (37, 53)),  # tiny and odd: upscaled to reach min_pixels
        (DEFAULT, (1, 1)),  # a single pixel
        (SMALL, (127, 301)),  # odd sizes, downscaled to max_pixels
        (SMALL, (64, 96)),  # already a multiple of the factor
        (SMALL, (5, 900)),  # extreme (but allowed) aspect ratio
        (SMALL, (1000, 7)),
    ],
)
def test_matches_hf_single_image(cfg, hw):
    img = rand_image(*hw, seed=hw[0] * 1000 + hw[1])
    ours_pv, ours_grid = preprocess([Image.fromarray(img)], cfg)
    ref_pv, ref_grid = hf_out([Image.fromarray(img)], cfg)
    np.testing.assert_array_equal(ours_grid, ref_grid)
    assert ours_pv.dtype == np.float32 and ours_pv.shape == ref_pv.shape
    assert np.abs(ours_pv - ref_pv).max() <= TOL
    assert ours_pv.shape[1] == 3 * cfg.temporal_patch_size * cfg.patch_size**2


def test_matches_hf_batch_of_mixed_inputs():
    """Several sizes and input kinds in one call: PIL RGB, numpy HWC, grey, RGBA (composited onto white)."""
    cfg = SMALL
    rgb = rand_image(70, 45, 1)
    grey = rand_image(33, 81, 2, channels=1)
    rgba = rand_image(90, 90, 3, channels=4)
    ours_pv, ours_grid = preprocess([Image.fromarray(rgb), rgb, Image.fromarray(grey), Image.fromarray(rgba)], cfg)
    ref_pv, ref_grid = hf_out(
        [Image.fromarray(rgb), Image.fromarray(rgb), Image.fromarray(grey), Image.fromarray(rgba)], cfg
    )
    np.testing.assert_array_equal(ours_grid, ref_grid)
    assert np.abs(ours_pv - ref_pv).max() <= TOL
    # numpy RGBA follows HF's numpy rule (alpha blend, rounded) and must match HF given the same array.
    ours_np, _ = preprocess([rgba], cfg)
    ref_np, _ = hf_out([rgba], cfg)
    assert np.abs(ours_np - ref_np).max() <= TOL


@pytest.mark.parametrize("hw", [(1, 201), (402, 2)])
def test_extreme_aspect_ratio_errors_like_hf(hw):
    img = Image.fromarray(rand_image(*hw, seed=0))
    with pytest.raises(ValueError, match="aspect ratio"):
        hf_out([img], SMALL)
    with pytest.raises(ValueError, match="aspect ratio"):
        preprocess([img], SMALL)


def test_smart_resize_properties_and_hf_equality():
    rng = np.random.default_rng(0)
    for _ in range(300):
        h, w = (int(v) for v in rng.integers(1, 5000, size=2))
        if max(h, w) / min(h, w) > 200:
            continue
        for cfg in (DEFAULT, SMALL):
            ours = smart_resize(h, w, cfg.factor, cfg.min_pixels, cfg.max_pixels)
            assert ours == hf_ip.smart_resize(h, w, cfg.factor, cfg.min_pixels, cfg.max_pixels)
            assert ours[0] % cfg.factor == 0 and ours[1] % cfg.factor == 0
            assert ours[0] * ours[1] <= cfg.max_pixels or min(ours) == cfg.factor


def test_patch_layout_merge_windows_are_contiguous():
    """Each run of merge_size^2 patches is one 2x2 window, row-major inside; the frame is repeated over time."""
    cfg = ImageProcessingConfig(patch_size=2, merge_size=2, temporal_patch_size=2, min_pixels=16, max_pixels=64)
    img = np.zeros((8, 8, 3), dtype=np.uint8)
    for r in range(4):
        for c in range(4):
            img[2 * r : 2 * r + 2, 2 * c : 2 * c + 2] = 10 * r + c  # patch (r, c) holds one value
    pv, grid = preprocess([img], cfg)
    assert grid.tolist() == [[1, 4, 4]]
    values = np.round((pv[:, 0] * 0.5 + 0.5) * 255).astype(int)
    expected = [0, 1, 10, 11, 2, 3, 12, 13, 20, 21, 30, 31, 22, 23, 32, 33]
    assert values.tolist() == expected
    per_patch = pv.reshape(16, 3, 2, 4)
    np.testing.assert_array_equal(per_patch[:, :, 0], per_patch[:, :, 1])


def test_num_image_tokens():
    assert num_image_tokens(np.array([[1, 16, 16], [1, 4, 6]]), 2).tolist() == [64, 6]
    _, grid = preprocess([rand_image(300, 500, 4)], DEFAULT)
    assert int(num_image_tokens(grid, DEFAULT.merge_size)[0]) == int(np.prod(grid[0])) // 4


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="at least one image"):
        preprocess([])
    with pytest.raises(TypeError, match="uint8"):
        preprocess([np.zeros((32, 32, 3), dtype=np.float32)])
    with pytest.raises(ValueError, match="numpy images must be"):
        preprocess([np.zeros((32, 32, 5), dtype=np.uint8)])
    with pytest.raises(TypeError, match="PIL image or a numpy array"):
        preprocess(["not an image"])
    with pytest.raises(ValueError, match="min_pixels"):
        ImageProcessingConfig(min_pixels=100, max_pixels=10)
