"""Records and JSONL (errors name path:line), the grain pipeline (shapes, padding, image tokens, SFT masks,
determinism, resume) and the gen-data command."""

import dataclasses
import json

import numpy as np
import pytest

from spatial_jax.data import pipeline as P
from spatial_jax.data import synthetic
from spatial_jax.data.image_processing import ImageProcessingConfig, num_image_tokens
from spatial_jax.data.jsonl import read_jsonl, write_jsonl
from spatial_jax.data.prompts import HARNESS, SCENE_GRAPH, THINK_BOXES
from spatial_jax.data.sample import DatasetError, Sample
from spatial_jax.data.tokenizer import build_tokenizer

IMG = ImageProcessingConfig(min_pixels=32 * 32, max_pixels=96 * 96)
CFG = synthetic.SyntheticConfig(width=64, height=64)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def source():
    return synthetic.generate(CFG, "train", 24)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds")
    samples = synthetic.generate(CFG, "heldout", 5)
    write_jsonl(samples, out / "heldout.jsonl")
    return out / "heldout.jsonl", samples


def test_jsonl_round_trip(written):
    path, samples = written
    back = read_jsonl(path)
    assert [s.to_json("x") for s in back] == [s.to_json("x") for s in samples]
    for a, b in zip(back, samples):
        assert np.array_equal(a.load_image(), b.image)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: "{not json", "malformed JSON"),
        (lambda r: {k: v for k, v in r.items() if k != "question"}, "missing field 'question'"),
        (lambda r: {**r, "options": "A,B"}, "'options' must be a list"),
        (lambda r: {**r, "image": "images/none.png"}, "does not exist"),
        # issue 36 item 25: what is there but no file is named as such, not as missing
        (lambda r: {**r, "image": "images"}, "images' is a folder, not a file"),
        (lambda r: {**r, "image": "/dev/zero"}, "'/dev/zero' is not a regular file"),
        (lambda r: {**{k: v for k, v in r.items() if k != "image"}, "video": {"frames": ["/dev/zero"], "fps": 1}},
         "video.frames\\[0\\].*not a regular file"),
        (lambda r: {**r, "answer": "E"}, "does not name one of the 4 options"),
        (lambda r: {**r, "gt_boxes": [{"bbox_2d": [1, 2, 3], "label": "x"}]}, "gt_boxes\\[0\\].bbox_2d"),
        (lambda r: {**r, "gt_boxes": [{"bbox_2d": [1, 2, 3, 4], "label": "x", "validity": 2}]}, "validity"),
        (lambda r: {**r, "id": "heldout-000000"}, "already used on line 1"),
        (lambda r: {**r, "image_size": [64]}, "image_size"),
        (lambda r: [1, 2], "expected a JSON object"),
    ],
)
def test_jsonl_errors_name_file_and_line(written, tmp_path, edit, message):
    path, _ = written
    rows = _rows(path)
    bad = edit(rows[1])
    lines = [json.dumps(rows[0]), bad if isinstance(bad, str) else json.dumps(bad), json.dumps(rows[2])]
    target = path.parent / "bad.jsonl"
    target.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=message) as err:
        read_jsonl(target)
    assert str(err.value).startswith(f"{target}:2: ")
    assert isinstance(err.value, ValueError)


def test_gold_forms_resolve_to_letters():
    base = {"id": "q", "image": "x.png", "question": "?", "options": ["a", "b", "c"]}
    for raw, letter in [("B", "B"), ("B. b", "B"), ("(C) c", "C"), (0, "A")]:
        assert Sample.from_json({**base, "answer": raw}, check_image=False).answer == letter
    with pytest.raises(DatasetError, match="letter"):
        Sample.from_json({**base, "answer": "Because"}, check_image=False)
    s = Sample.from_json({**base, "options": [], "answer": "12.5"}, check_image=False)
    assert s.answer_type == "number" and s.answer == 12.5 and s.answer_text == "12.5"


def _check_batch(batch, tok, bs, sft=False):
    b, width = batch.input_ids.shape
    assert b == bs and width in P.DataConfig().bucket_lengths
    assert batch.input_ids.dtype == np.int32 and batch.attention_mask.shape == (b, width)
    assert batch.image_grid_thw.shape == (b, 3)
    assert batch.pixel_values.shape == (int(batch.image_grid_thw.prod(-1).sum()), 3 * 2 * 16 * 16)
    n_img = num_image_tokens(batch.image_grid_thw, IMG.merge_size)
    for i in range(b):
        m = batch.attention_mask[i]
        n = int(m.sum())
        assert np.all(m[: width - n] == 0) and np.all(m[width - n :] == 1), "left padding"
        assert np.all(batch.input_ids[i, : width - n] == tok.pad_id)
        row = batch.input_ids[i, width - n :]
        assert row[0] == tok.im_start_id
        assert int((row == tok.image_pad_id).sum()) == n_img[i]
        if not sft:
            assert batch.prompt_lengths[i] == n
            assert tok.decode(row).endswith("<|im_start|>assistant\n<think>\n")
    assert len(batch.records) == b


def test_batches_shapes_and_contents(tok, source):
    cfg = P.DataConfig(bucket_lengths=(64, 256, 512, 1024, 2048, 4096))
    ds = P.make_dataset(source, tok, cfg, THINK_BOXES, 4, image_cfg=IMG)
    batch = ds[0]
    _check_batch(batch, tok, 4)
    longest = int(batch.attention_mask.sum(-1).max())
    assert batch.input_ids.shape[1] == min(b for b in cfg.bucket_lengths if b >= longest)
    assert batch.loss_mask is None


def test_sft_loss_mask_covers_the_reference(tok, source):
    batch = P.make_dataset(source, tok, P.DataConfig(), SCENE_GRAPH, 3, mode="sft", image_cfg=IMG)[1]
    for i, rec in enumerate(batch.records):
        target = batch.input_ids[i][batch.loss_mask[i] == 1]
        assert tok.decode(target) == rec.reference["spatialthinker"] + "<|im_end|>"
        width = batch.input_ids.shape[1]
        start = width - int(batch.attention_mask[i].sum())
        prompt = tok.decode(batch.input_ids[i, start : start + batch.prompt_lengths[i]])
        assert prompt.endswith("<|im_start|>assistant\n") and "Image size: (64 x 64)" in prompt


def test_missing_image_size_is_read_from_the_image(tok, source):
    import dataclasses

    bare = dataclasses.replace(source[0], image_size=None)
    ex = P.encode_sample(bare, tok, SCENE_GRAPH, "rl", IMG)
    assert ex.sample.image_size == (64, 64) and "Image size: (64 x 64)" in tok.decode(ex.input_ids)
    assert ex.prompt_length == len(ex.input_ids)


def _ids(batches):
    return [(tuple(r.id for r in b.records), b.input_ids.tobytes()) for b in batches]


def test_deterministic_order_and_resume(tok, source):
    cfg = P.DataConfig(seed=3)
    first = P.make_iterator(source, tok, cfg, THINK_BOXES, 4, image_cfg=IMG)
    run = [next(first) for _ in range(8)]  # 32 rows: crosses into the second epoch of 24 samples
    again = P.make_iterator(source, tok, cfg, THINK_BOXES, 4, image_cfg=IMG)
    assert _ids(run) == _ids([next(again) for _ in range(8)])
    epoch1 = [r.id for b in run[:6] for r in b.records]
    assert sorted(epoch1) == sorted(s.id for s in source), "one epoch visits every sample once"
    assert epoch1 != [s.id for s in source]
    other = P.make_iterator(source, tok, P.DataConfig(seed=4), THINK_BOXES, 4, image_cfg=IMG)
    assert _ids([next(other) for _ in range(2)]) != _ids(run[:2])

    it = P.make_iterator(source, tok, cfg, THINK_BOXES, 4, image_cfg=IMG)
    for _ in range(5):
        next(it)
    state = it.get_state()
    assert json.loads(json.dumps(state)) == state
    expected = next(it)
    resumed = P.make_iterator(source, tok, cfg, THINK_BOXES, 4, image_cfg=IMG)
    resumed.set_state(state)
    got = next(resumed)
    assert _ids([got]) == _ids([expected]) == _ids(run[5:6])
    assert np.array_equal(got.pixel_values, expected.pixel_values)


def test_finite_epochs_and_overlong_rows(tok, source):
    batches = list(P.make_iterator(source[:7], tok, P.DataConfig(), THINK_BOXES, 5, num_epochs=1,
                                   drop_remainder=False, shuffle=False, image_cfg=IMG))
    assert [len(b.records) for b in batches] == [5, 2]
    assert [r.id for b in batches for r in b.records] == [s.id for s in source[:7]]
    short = P.DataConfig(bucket_lengths=(64,))
    with pytest.raises(DatasetError, match="largest bucket \\(64\\)"):
        P.make_dataset(source, tok, short, THINK_BOXES, 2, image_cfg=IMG)[0]
    with pytest.raises(DatasetError, match="empty"):
        P.make_dataset([], tok, short, THINK_BOXES, 2, image_cfg=IMG)
    with pytest.raises(ValueError, match="increasing"):
        P.DataConfig(bucket_lengths=(512, 256))
    with pytest.raises(ValueError, match="mode"):
        P.make_dataset(source, tok, short, THINK_BOXES, 2, mode="grpo")


def test_open_source_and_gen_data_cli(tok, tmp_path):
    from spatial_jax.cli import main

    rc = main(["gen-data", "--out", str(tmp_path), "--num-train", "6", "--num-eval", "2", "--seed", "5",
               "--image-size", "64x48", "--corrupt-fraction", "0.4"])
    assert rc == 0
    train = P.open_source(str(tmp_path / "train.jsonl"))
    held = P.open_source(str(tmp_path / "heldout.jsonl"))
    assert len(train) == 6 and len(held) == 2
    assert train[0].load_image().shape == (48, 64, 3) and train[0].image_size == (64, 48)
    direct = synthetic.make_sample(synthetic.SyntheticConfig(width=64, height=48, seed=5, corrupt_fraction=0.4),
                                   "train", 0)
    assert train[0].to_json("x") == direct.to_json("x")
    syn_src = P.open_source("synthetic:heldout:3", CFG)
    assert len(syn_src) == 3 and syn_src[2].id == "heldout-000002"
    batch = P.make_dataset(train, tok, P.DataConfig(), THINK_BOXES, 2, image_cfg=IMG)[0]
    _check_batch(batch, tok, 2)
    assert main(["gen-data", "--out", str(tmp_path), "--corrupt-fraction", "2"]) == 2
    with pytest.raises(DatasetError, match="synthetic:<train\\|heldout>"):
        P.open_source("synthetic:train")


def test_blank_batch_keeps_prompts(tok, source):
    batch = P.make_dataset(source, tok, P.DataConfig(), THINK_BOXES, 2, image_cfg=IMG)[0]
    for fill, value in (("mean", None), ("black", -1.0), ("white", 1.0)):
        blank = P.blank_batch(batch, fill, IMG)
        assert np.array_equal(blank.input_ids, batch.input_ids) and blank.records == batch.records
        assert blank.pixel_values.shape == batch.pixel_values.shape
        per_channel = blank.pixel_values.reshape(-1, 3, 2 * 16 * 16)
        assert np.allclose(per_channel, per_channel[:, :, :1], atol=1e-6), "a blank image is one colour"
        if value is not None:
            assert np.allclose(blank.pixel_values, value, atol=1e-6)
        else:
            image = batch.records[0].image
            expect = (np.round(image.reshape(-1, 3).mean(0)) / 255 - 0.5) / 0.5
            assert np.allclose(per_channel[0, :, 0], expect, atol=1e-5)
    with pytest.raises(ValueError, match="fill"):
        P.blank_image(source[0].image, "grey")


def test_data_config_and_iterators(tok):
    from spatial_jax.config import ConfigError, load

    data = load(P.DataConfig, overrides=["train=synthetic:train:6", "eval=synthetic:heldout:5", "synthetic.width=64",
                                         "synthetic.height=64", "bucket_lengths=[512,1024]"])
    assert data.synthetic.width == 64 and data.bucket_lengths == (512, 1024)
    it = P.train_iterator(data, tok, THINK_BOXES, 4, image_cfg=IMG)
    first = next(it)
    assert first.input_ids.shape == (4, 512)
    batches = list(P.eval_iterator(data, tok, HARNESS, 2, image_cfg=IMG))
    assert [r.id for b in batches for r in b.records] == [f"heldout-{i:06d}" for i in range(5)]
    # the SFT cold start reads its own source when one is set, RL keeps data.train
    split = dataclasses.replace(data, sft_train="synthetic:heldout:4")
    sft_ids = {r.id for r in next(P.train_iterator(split, tok, THINK_BOXES, 4, mode="sft", image_cfg=IMG)).records}
    rl_ids = {r.id for r in next(P.train_iterator(split, tok, THINK_BOXES, 4, image_cfg=IMG)).records}
    assert all(i.startswith("heldout-") for i in sft_ids) and all(i.startswith("train-") for i in rl_ids)
    with pytest.raises(ConfigError):
        load(P.DataConfig, overrides=["bucket_lengths=[512,256]"])
    with pytest.raises(ConfigError):
        load(P.DataConfig, overrides=["synthetic.corrupt_fraction=3"])


def test_gen_data_writes_the_main_jobs_world(tmp_path, capsys, monkeypatch):
    """Issue 36 "Also": the main job's data outside the job. gen-data with its config writes the questions and
    images the job draws (its grid, anchor and biased annotator), as many as it draws unless told; key=value sets
    any other setting of the world."""
    import spatial_jax.data.jsonl as jsonl
    from spatial_jax.cli import main
    from spatial_jax.cli.job_config import MAIN_JOB, load_job

    job = load_job(str(MAIN_JOB), [])
    assert main(["gen-data", "--config", str(MAIN_JOB), "--out", str(tmp_path / "d"), "--num-train", "6",
                 "--num-eval", "2"]) == 0
    for split, spec in (("train", job.data.train), ("heldout", job.data.eval)):
        written = P.open_source(str(tmp_path / "d" / f"{split}.jsonl"))
        drawn = P.open_source(spec, job.data.synthetic)
        assert [s.to_json("x") for s in written] == [drawn[i].to_json("x") for i in range(len(written))]
        assert all(np.array_equal(s.load_image(), drawn[i].image) for i, s in enumerate(written))
    assert json.loads((tmp_path / "d" / "config.json").read_text())["mirror_colors"] == ["green"]
    assert main(["gen-data", "--out", str(tmp_path / "f"), "--num-train", "1", "--num-eval", "1", "grid=2",
                 "anchor=blue", "mirror_colors=[\"green\"]", "mirror_rate=0.7", "--min-objects", "2",
                 "--max-objects", "2"]) == 0
    assert json.loads((tmp_path / "f" / "config.json").read_text())["grid"] == 2
    capsys.readouterr()
    assert main(["gen-data", "--out", str(tmp_path / "g"), "grid=99"]) == 2
    assert "grid must lie in" in capsys.readouterr().err
    counted = {}  # the job's 4,000 training questions, counted without drawing them
    monkeypatch.setattr(jsonl, "write_jsonl", lambda samples, path, *a: counted.setdefault(path.stem, len(samples)))
    (tmp_path / "e").mkdir()
    assert main(["gen-data", "--config", str(MAIN_JOB), "--out", str(tmp_path / "e"), "--num-eval", "0"]) == 0
    assert counted == {"train": 4000, "heldout": 0}
