"""Bad input to the data side: hostile JSONL lines, byte-order marks, broken / huge / extreme / 16-bit images, and
gen-data's arguments. Each gets a DatasetError (or exit status 2) that names the file, line and image, never a crash."""

import json
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from spatial_jax.data import pipeline as P
from spatial_jax.data import synthetic
from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.data.jsonl import read_jsonl, write_jsonl
from spatial_jax.data.prompts import THINK_BOXES
from spatial_jax.data.sample import DatasetError
from spatial_jax.data.tokenizer import build_tokenizer

IMG = ImageProcessingConfig(min_pixels=32 * 32, max_pixels=96 * 96)
CFG = synthetic.SyntheticConfig(width=64, height=64)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture()
def dataset(tmp_path):
    """A 3-row JSONL dataset and its rows (dicts), images under images/."""
    path = tmp_path / "data.jsonl"
    write_jsonl(synthetic.generate(CFG, "heldout", 3), path)
    return path, [json.loads(line) for line in path.read_text().splitlines()]


def _write(path, lines):
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")


@pytest.mark.parametrize("hostile, message", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"id": ' + "9" * 5000 + "}", "4300 digits"),
])
def test_hostile_json_line_is_a_dataset_error(dataset, hostile, message):
    path, rows = dataset
    _write(path, [rows[0], hostile, rows[2]])
    with pytest.raises(DatasetError, match=message) as err:
        read_jsonl(path)
    assert str(err.value).startswith(f"{path}:2: malformed JSON")


def test_byte_order_mark_and_line_separators_inside_strings(dataset):
    path, rows = dataset
    rows[1]["question"] = "left\u2028or\u0085right?"  # write_jsonl leaves these raw; they end no JSONL line
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode())
    back = read_jsonl(path)
    assert [s.id for s in back] == [r["id"] for r in rows] and back[1].question == "left\u2028or\u0085right?"


def test_invalid_utf8_names_its_line(dataset):
    path, rows = dataset
    path.write_bytes(json.dumps(rows[0]).encode() + b"\n" + json.dumps(rows[1]).encode()[:-2] + b'\xff"}\n')
    with pytest.raises(DatasetError, match="not UTF-8") as err:
        read_jsonl(path)
    assert str(err.value).startswith(f"{path}:2: ")


def _png_header_only(path, width, height):
    """A PNG that declares width x height and holds no pixel data: what a decompression bomb shows before decoding."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IEND", b""))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _bomb(path):
    _png_header_only(path, 20000, 20000)


def _not_an_image(path):
    path.write_bytes(b"GIF89a, or so it says")


def _long_thin(path):
    Image.fromarray(np.full((2, 4000, 3), 128, np.uint8)).save(path)


def _missing(path):
    path.unlink()


@pytest.mark.parametrize("damage, what", [
    (_truncate, "truncated"),
    (_bomb, "400000000 pixels"),
    (_not_an_image, "cannot identify"),
    (_long_thin, "aspect ratio"),
    (_missing, "No such file"),
])
def test_broken_images_name_the_image_and_the_line(tok, dataset, damage, what):
    path, rows = dataset
    image = path.parent / rows[1]["image"]
    damage(image)
    source = read_jsonl(path, check_images=False)
    data = P.DataConfig()
    expected = f"{path}:2: image {image}: "
    with pytest.raises(DatasetError, match=what) as err:
        P.make_dataset(source, tok, data, THINK_BOXES, 3, shuffle=False, image_cfg=IMG)[0]
    assert str(err.value).startswith(expected), str(err.value)
    it = P.make_iterator(source, tok, data, THINK_BOXES, 3, shuffle=False, image_cfg=IMG)
    with pytest.raises(DatasetError, match=what) as err:
        next(it)
    assert str(err.value).startswith(expected), str(err.value)


def test_pixel_limit_is_configured(tok, dataset):
    path, rows = dataset
    source = read_jsonl(path)
    small = P.DataConfig(max_image_pixels=64 * 64 - 1)
    with pytest.raises(DatasetError, match=r"4096 pixels, over data.max_image_pixels = 4095") as err:
        P.make_dataset(source, tok, small, THINK_BOXES, 1, shuffle=False, image_cfg=IMG)[0]
    assert str(err.value).startswith(f"{path}:1: image {path.parent / rows[0]['image']}: ")
    assert len(P.make_dataset(source, tok, P.DataConfig(max_image_pixels=64 * 64), THINK_BOXES, 1,
                              shuffle=False, image_cfg=IMG)[0].records) == 1
    assert P.DataConfig().max_image_pixels == 89_478_485  # PIL's own default limit


def test_data_config_validates_with_the_config_idiom():
    from spatial_jax.config import ConfigError

    for override, message in [("max_image_pixels=0", "data.max_image_pixels must be >= 1, got 0"),
                              ("read_threads=-1", "data.read_threads must be >= 0, got -1"),
                              ("seed=-2", "data.seed must lie in [0, 4294967295], got -2"),
                              ("bucket_lengths=[512,256]", "data.bucket_lengths must be strictly increasing"),
                              ("train=", "data.train must name a JSONL file")]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
            _load_nested(override)


def _load_nested(override):
    """DataConfig as it sits in a run's config: under `data.`, so errors carry the dotted key."""
    import dataclasses

    from spatial_jax.config import load

    @dataclasses.dataclass(frozen=True)
    class Run:
        data: P.DataConfig = dataclasses.field(default_factory=P.DataConfig)

    return load(Run, overrides=[f"data.{override}"])


def test_sixteen_bit_grey_is_scaled_not_saturated(dataset):
    path, rows = dataset
    image = path.parent / rows[0]["image"]
    grey = np.array([[0, 257, 32896, 65535], [128, 1000, 40000, 65280]], np.uint16)
    Image.fromarray(grey).save(image)
    with Image.open(image) as im:
        assert im.mode.startswith("I")  # PIL reads 16-bit grey as a 32-bit or 16-bit integer image
    rgb = read_jsonl(path)[0].load_image()
    assert rgb.dtype == np.uint8 and rgb.shape == (2, 4, 3)
    expected = np.round(grey / 257).astype(np.uint8)
    assert np.array_equal(rgb, np.repeat(expected[:, :, None], 3, axis=-1))


def test_gen_data_bad_arguments_exit_2(tmp_path, capsys):
    from spatial_jax.cli import main

    file = tmp_path / "taken"
    file.write_text("x")
    for argv, needle in [(["--image-size", "100000"], "width must lie in [32, 4096], got 100000"),
                         (["--seed", "-1"], "seed must be >= 0, got -1"),
                         (["--out", str(file)], "is a file, not a folder")]:
        out = ["--out", str(tmp_path / "out")] if "--out" not in argv else []
        assert main(["gen-data", "--num-train", "1", "--num-eval", "1"] + out + argv) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err
    assert file.read_text() == "x"


def test_synthetic_config_validates_with_the_config_idiom():
    from spatial_jax.config import ConfigError, load

    for override, message in [("synthetic.height=5000", "synthetic.height must lie in [32, 4096], got 5000"),
                              ("synthetic.max_objects=1", "synthetic.max_objects must lie in"),
                              ("synthetic.box_noise=-1", "synthetic.box_noise must be >= 0"),
                              ("synthetic.displace_iou=1", "synthetic.displace_iou must lie in (0, 1)"),
                              ("synthetic.seed=-1", "synthetic.seed must be >= 0")]:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            load(P.DataConfig, overrides=[override])
