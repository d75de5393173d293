"""`spatial-jax pseudo-gt`: phrase extraction, box selection on hand-built detector outputs, tiny random Grounding
DINO and OWLv2 detectors end to end (built from configs, saved locally; nothing is downloaded), and resuming."""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pytest

from spatial_jax.cli import main
from spatial_jax.config import ConfigError
from spatial_jax.data.jsonl import read_jsonl
from spatial_jax.data.phrases import ChatExtractor, ExtractorError, extract_phrases
from spatial_jax.data.pseudo_gt import Detections, PseudoGTConfig, annotate, completed_ids, select_boxes
from spatial_jax.data.sample import DatasetError

# ---------------------------------------------------------------- phrase extraction


@pytest.mark.parametrize("question, options, phrases", [
    ("Where is the red circle relative to the blue square?", ["left", "right", "above", "below"],
     ["red circle", "blue square"]),
    ("Is the boy in orange clothes standing to the left of the gray vehicle?", ["Yes", "No"],
     ["boy in orange clothes", "gray vehicle"]),
    ("Which is closer to the camera: the woman's red umbrella or the traffic light?", ["the traffic light"],
     ["woman", "red umbrella", "traffic light"]),
    ("What is the distance in pixels between the centres of the car and the tree? Answer with a number.", [],
     ["car", "tree"]),
    ("From the perspective of the person on the bench, in which direction is the cup of coffee?",
     ["in front", "behind", "to the left", "farther away"], ["person", "bench", "cup of coffee"]),
    ("Which of these objects is the largest?", ["1", "2"], []),
])
def test_extract_phrases_keeps_objects_and_drops_relational_words(question, options, phrases):
    assert extract_phrases(question, options) == phrases


def test_chat_extractor_parses_and_cleans_a_reply_without_the_network():
    sent = []

    def post(url, body, headers):
        sent.append((url, body, headers))
        return {"choices": [{"message": {"content": '```json\n["Red Car", "left", "red car", "boy in orange '
                                                    'clothes"]\n```'}}]}

    extractor = ChatExtractor("http://localhost:1/v1/", "tiny", api_key="k", post=post)
    assert extractor("Is the red car left of the boy?", ["yes"]) == ["red car", "boy in orange clothes"]
    url, body, headers = sent[0]
    assert url == "http://localhost:1/v1/chat/completions" and body["model"] == "tiny"
    assert headers["Authorization"] == "Bearer k" and "red car" in body["messages"][1]["content"]
    with pytest.raises(ExtractorError, match="no JSON array"):
        ChatExtractor("http://x", "m", post=lambda *a: {"choices": []})("q")
    with pytest.raises(ExtractorError, match="array of strings"):
        ChatExtractor("http://x", "m", post=lambda *a: {"choices": [{"message": {"content": "[1, 2]"}}]})("q")


# ---------------------------------------------------------------- box selection


def _det(boxes, scores):
    return Detections(np.asarray(boxes, float), np.asarray(scores, float))


def test_select_boxes_top1_threshold_scaling_and_validity():
    # A 200 x 100 image: x scales by 5, y by 10.
    det = _det(
        [[20, 10, 60, 50], [40, 20, 100, 80], [0, 0, 10, 10], [100, 50, 200, 100]],
        [[0.50, 0.10, 0.0], [0.70, 0.20, 0.0], [0.10, 0.30, 0.0], [0.05, 0.10, 0.29999]],
    )
    boxes = select_boxes(det, ["cup", "dog", "cat"], (200, 100), threshold=0.3)
    assert [b.label for b in boxes] == ["cup", "dog"]  # cat's best is below 0.3
    cup, dog = boxes
    assert cup.bbox == (200.0, 200.0, 500.0, 800.0) and cup.validity == 0.7  # the 0.7 candidate, not the 0.5 one
    assert dog.bbox == (0.0, 0.0, 50.0, 100.0) and dog.validity == 0.3  # exactly at the threshold is kept
    assert select_boxes(det, ["cup", "dog", "cat"], (200, 100), threshold=0.7001) == ()
    assert [b.label for b in select_boxes(det, ["cup", "dog", "cat"], (200, 100), threshold=0.0)] == ["cup", "dog",
                                                                                                      "cat"]


def test_select_boxes_gives_each_candidate_to_its_best_phrase():
    # One box scores 0.9 for "man" and 0.8 for "person": it is the man's, so "person" takes its own 0.4 box.
    det = _det([[0, 0, 50, 50], [50, 50, 100, 100]], [[0.9, 0.8], [0.1, 0.4]])
    man, person = select_boxes(det, ["man", "person"], (100, 100), 0.3)
    assert man.bbox == (0.0, 0.0, 500.0, 500.0) and person.bbox == (500.0, 500.0, 1000.0, 1000.0)
    assert person.validity == 0.4


def test_select_boxes_clips_rounds_and_skips_degenerate_candidates():
    det = _det(
        [[-30, -10, 40.04, 120], [5, 5, 5.01, 50], [np.nan, 0, 10, 10], [60, 10, 55, 30]],
        [[0.5], [0.99], [0.98], [0.4]],
    )
    (box,) = select_boxes(det, ["tree"], (100, 100), 0.3)
    # The 0.99 candidate has no width once in integer coordinates, the 0.98 one is not finite.
    assert box.bbox == (0.0, 0.0, 400.0, 1000.0) and box.validity == 0.5
    (swapped,) = select_boxes(_det([[60, 10, 55, 30]], [[0.4]]), ["tree"], (100, 100), 0.3)
    assert swapped.bbox == (550.0, 100.0, 600.0, 300.0)  # corners given in either order
    assert select_boxes(_det(np.zeros((0, 4)), np.zeros((0, 1))), ["tree"], (100, 100), 0.3) == ()


def test_select_boxes_rejects_mismatched_shapes_and_sizes():
    with pytest.raises(ValueError, match="shape"):
        select_boxes(_det([[0, 0, 1, 1]], [[0.5, 0.5]]), ["a"], (10, 10), 0.3)
    with pytest.raises(ValueError, match="image size"):
        select_boxes(_det([[0, 0, 1, 1]], [[0.5]]), ["a"], (0, 10), 0.3)


def test_config_is_validated():
    with pytest.raises(ValueError, match="threshold must lie in"):
        PseudoGTConfig(threshold=1.5)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        PseudoGTConfig(batch_size=0)


# ---------------------------------------------------------------- datasets


QUESTIONS = [
    ("Where is the red circle relative to the blue square?", ["left", "right"]),
    ("Which object is closest to the green triangle?", ["red circle", "blue square"]),
    ("How many circles are there in the image?", ["1", "2", "3"]),
    ("Which is larger?", ["left", "right"]),  # no object: no detector call, no boxes
    ("Is the dog behind the person?", ["yes", "no"]),
]


def _dataset(root, n=5):
    from PIL import Image

    (root / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        question, options = QUESTIONS[i % len(QUESTIONS)]
        size = (48 + 8 * i, 40 + 4 * (i % 3))
        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(root / f"images/{i}.png")
        rows.append({"id": f"s{i}", "image": f"images/{i}.png", "question": question, "options": options,
                     "answer": "A"})
    path = root / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _check_rows(path, n):
    samples = read_jsonl(path)  # the output is a dataset whose image paths resolve
    assert [s.id for s in samples] == [f"s{i}" for i in range(n)]
    for s in samples:
        phrases = s.meta["pseudo_gt"]["phrases"]
        assert phrases == extract_phrases(s.question, s.options)
        labels = [b.label for b in s.gt_boxes]
        assert len(set(labels)) == len(labels) and set(labels) <= set(phrases)
        for b in s.gt_boxes:
            x1, y1, x2, y2 = b.bbox
            assert all(float(c).is_integer() for c in b.bbox) and 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000
            assert 0 <= b.validity <= 1
    return samples


# ---------------------------------------------------------------- tiny detectors


def _grounding_dino(folder):
    import torch
    from transformers import (
        BertConfig,
        BertTokenizer,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessorPil,
        GroundingDinoProcessor,
        SwinConfig,
    )

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "red", "blue", "green", "circle", "square",
             "triangle", "dog", "person"]
    words += list(string.ascii_lowercase) + ["##" + c for c in string.ascii_lowercase]
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(words)})
    processor = GroundingDinoProcessor(
        image_processor=GroundingDinoImageProcessorPil(size={"shortest_edge": 64, "longest_edge": 96}),
        tokenizer=tokenizer)
    config = GroundingDinoConfig(
        backbone_config=SwinConfig(image_size=64, patch_size=4, embed_dim=8, depths=[1, 1, 1, 1],
                                   num_heads=[1, 1, 1, 1], window_size=2, out_indices=[2, 3, 4]),
        text_config=BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=16, max_position_embeddings=64),
        d_model=32, num_queries=10, encoder_layers=1, decoder_layers=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
        encoder_attention_heads=2, decoder_attention_heads=2, num_feature_levels=4, encoder_n_points=1,
        decoder_n_points=1, max_text_len=32, disable_custom_kernels=True)
    torch.manual_seed(0)
    GroundingDinoForObjectDetection(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def _owlv2(folder):
    import torch
    from transformers import CLIPTokenizer, Owlv2Config, Owlv2ForObjectDetection, Owlv2ImageProcessorPil, Owlv2Processor

    # Character-level CLIP BPE (no merges). OWL masks a query whose first id is 0, so the specials come last.
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    words = chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"]
    vocab = {w: i for i, w in enumerate(words)}
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[])
    processor = Owlv2Processor(image_processor=Owlv2ImageProcessorPil(size={"height": 32, "width": 32}),
                               tokenizer=tokenizer)
    bos, eos = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    config = Owlv2Config(
        text_config=dict(vocab_size=len(vocab), hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=24, bos_token_id=bos, eos_token_id=eos,
                         pad_token_id=eos),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16)
    torch.manual_seed(0)
    Owlv2ForObjectDetection(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def detectors(tmp_path_factory):
    root = tmp_path_factory.mktemp("detectors")
    return {"grounding-dino": _grounding_dino(root / "gd"), "owlv2": _owlv2(root / "owl")}


@pytest.mark.parametrize("family", ["grounding-dino", "owlv2"])
def test_end_to_end_on_a_tiny_random_detector(tmp_path, detectors, family, capsys):
    data = _dataset(tmp_path / "data")
    out = tmp_path / "out" / "pseudo.jsonl"  # another folder: image paths are rewritten relative to it
    argv = ["pseudo-gt", "--input", str(data), "--output", str(out), "--detector", str(detectors[family]),
            "--threshold", "0", "--batch-size", "2", "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    samples = _check_rows(out, 5)
    # Threshold 0 keeps every phrase that owns a candidate; a random detector still gives some of them boxes.
    assert sum(len(s.gt_boxes) for s in samples) > 0
    assert samples[3].gt_boxes == () and samples[3].meta["pseudo_gt"]["phrases"] == []
    assert "written=5" in capsys.readouterr().out
    before = out.read_bytes()
    assert main(argv) == 0 and out.read_bytes() == before  # a finished run is not redone
    assert "written=0" in capsys.readouterr().out


@pytest.mark.parametrize("family", ["grounding-dino", "owlv2"])
def test_runner_boxes_match_transformers_post_processing(detectors, family):
    """The runner's pixel boxes are those of transformers' own post-processing (OWLv2: relative to the padded
    square image; Grounding DINO: to the image)."""
    import torch

    from spatial_jax.data.pseudo_gt import ZeroShotDetector

    detector = ZeroShotDetector(detectors[family], "cpu")
    image = np.random.default_rng(1).integers(0, 255, (40, 72, 3), dtype=np.uint8)
    phrases = ["red circle", "dog"]
    (det,) = detector([image], [phrases])
    proc, model = detector.processor, detector.model
    if family == "owlv2":
        inputs = proc(images=[image], text=[phrases], return_tensors="pt", truncation=True, max_length=24)
    else:
        inputs = proc(images=[image], text=["red circle. dog."], return_tensors="pt")
    with torch.no_grad():
        ref = proc.post_process_grounded_object_detection(model(**inputs), threshold=-1.0, target_sizes=[(40, 72)])[0]
    if family == "owlv2":  # each box's score and label are its best query's
        np.testing.assert_allclose(det.scores.max(axis=1), ref["scores"].numpy(), rtol=1e-5)
    np.testing.assert_allclose(det.boxes, ref["boxes"].numpy(), rtol=1e-5, atol=1e-3)
    assert det.scores.shape == (len(det.boxes), 2)


def test_a_folder_that_is_no_detector_is_a_config_error(tmp_path):
    from spatial_jax.data.pseudo_gt import ZeroShotDetector

    with pytest.raises(ConfigError, match="no such folder"):
        ZeroShotDetector(tmp_path / "missing")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ConfigError, match="not a supported zero-shot detector"):
        ZeroShotDetector(tmp_path / "bert")


# ---------------------------------------------------------------- resuming


class FakeDetector:
    """Deterministic boxes (one per phrase, scored 0.8) that fails on its `fail_on`-th call, as a kill would."""

    def __init__(self, fail_on: int | None = None):
        self.calls, self.fail_on = 0, fail_on

    def __call__(self, images, phrases):
        self.calls += 1
        if self.calls == self.fail_on:
            raise KeyboardInterrupt
        out = []
        for image, ps in zip(images, phrases):
            h, w = image.shape[:2]
            boxes = [[k, k, w / 2 + k, h / 2 + k] for k in range(len(ps))]
            out.append(Detections(np.array(boxes, float), 0.8 * np.eye(len(ps))))
        return out


def test_a_killed_run_resumes_without_duplicates(tmp_path):
    data = _dataset(tmp_path, n=9)
    samples = read_jsonl(data)
    ids = {s.id for s in samples}
    cfg = PseudoGTConfig(batch_size=2)
    clean = tmp_path / "clean.jsonl"
    annotate(samples, clean, FakeDetector(), cfg=cfg, progress=False)

    out = tmp_path / "resumed.jsonl"
    with pytest.raises(KeyboardInterrupt):  # killed during the third detector call: two batches are on disk
        annotate(samples, out, FakeDetector(fail_on=3), cfg=cfg, progress=False)
    assert len(out.read_text().splitlines()) == 4
    with open(out, "ab") as f:  # and the kill came in the middle of writing a line
        f.write(clean.read_bytes().splitlines(keepends=True)[4][:30])
    done = completed_ids(out, ids)
    assert done == {"s0", "s1", "s2", "s3"} and out.read_bytes().endswith(b"\n")
    stats = annotate(samples, out, FakeDetector(), cfg=cfg, done=done, progress=False)
    assert stats["already_done"] == 4 and stats["written"] == 5
    assert out.read_bytes() == clean.read_bytes()
    assert {s.id for s in _check_rows(out, 9)} == ids


def test_resuming_refuses_an_output_of_another_dataset(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "s0"}\n{"id": "elsewhere"}\n')
    with pytest.raises(DatasetError, match=r"out.jsonl:2: id 'elsewhere' is not in the input"):
        completed_ids(out, {"s0"})
    out.write_text('{"id": "s0"}\nnot json\n')
    with pytest.raises(DatasetError, match=r"out.jsonl:2: malformed JSON"):
        completed_ids(out, {"s0"})


@pytest.mark.parametrize("text", ["notes\nlast line, no newline", "one line, no newline", '{"a": 1}',
                                  '{"id": "elsewhere", "question": "q"}', '{"id": "s0"}\n{"id": "elsewhere"}'])
def test_an_unrelated_output_file_is_refused_and_left_whole(tmp_path, capsys, text):
    data = _dataset(tmp_path, n=2)
    out = tmp_path / "notes.txt"
    out.write_text(text)
    assert main(["pseudo-gt", "--input", str(data), "--detector", str(tmp_path), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spatial-jax pseudo-gt: ") and "holds rows this command did not write" in err
    assert err.count("\n") == 1 and out.read_text() == text


@pytest.mark.parametrize("rows", [None, 3])
def test_rows_of_the_input_itself_are_not_taken_as_done(tmp_path, capsys, rows):
    """Issue 44 finding 4: an output holding the input's ids (a copy of it, or its first 3 rows) is no earlier run's
    output: refused, not counted as done, and left whole."""
    data = _dataset(tmp_path, n=5)
    out = tmp_path / "out.jsonl"
    out.write_text("".join(data.read_text().splitlines(keepends=True)[:rows]))
    before = out.read_bytes()
    assert main(["pseudo-gt", "--input", str(data), "--detector", str(tmp_path), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--output {out} holds rows this command did not write" in err and "already_done" not in err
    assert out.read_bytes() == before and not Path(f"{out}.settings.json").exists()


def test_a_rerun_with_other_settings_is_refused_naming_them(tmp_path, detectors, capsys):
    """Issue 44 finding 4: the settings that decide the boxes are recorded beside the output; a rerun with a different
    threshold, input or detector is refused naming what differs, the output left whole; the same settings resume."""
    data = _dataset(tmp_path / "data", n=3)
    out = tmp_path / "out.jsonl"
    argv = ["pseudo-gt", "--input", str(data), "--output", str(out), "--detector", str(detectors["owlv2"]),
            "--device", "cpu", "--no-progress"]
    assert main([*argv, "--threshold", "0"]) == 0
    before = out.read_bytes()
    assert main([*argv, "--threshold", "0.5"]) == 2
    assert "threshold=0.0 (here 0.5)" in capsys.readouterr().err
    other = tmp_path / "data" / "in2.jsonl"
    other.write_text(data.read_text().replace("How many", "How many red"))
    argv[2] = str(other)
    assert main([*argv, "--threshold", "0"]) == 2
    assert "input_sha256=" in capsys.readouterr().err
    argv[2], argv[6] = str(data), str(detectors["grounding-dino"])
    assert main([*argv, "--threshold", "0"]) == 2
    assert "detector_sha256=" in capsys.readouterr().err
    assert out.read_bytes() == before
    argv[6] = str(detectors["owlv2"])
    assert main([*argv, "--threshold", "0"]) == 0 and out.read_bytes() == before
    assert "written=0" in capsys.readouterr().out


def test_cli_reports_bad_arguments_and_inputs(tmp_path, capsys):
    data = _dataset(tmp_path, n=2)
    base = ["pseudo-gt", "--input", str(data), "--detector", str(tmp_path)]
    assert main(base + ["--output", str(tmp_path / "o.jsonl"), "--threshold", "2"]) == 2
    assert "threshold must lie in [0, 1]" in capsys.readouterr().err
    assert main(base + ["--output", str(data)]) == 2
    assert "would overwrite its input" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"id": "x", "image": "nope.png", "question": "q"}\n')
    assert main(["pseudo-gt", "--input", str(tmp_path / "bad.jsonl"), "--output", str(tmp_path / "o.jsonl"),
                 "--detector", str(tmp_path)]) == 1
    assert "bad.jsonl:1: field 'image'" in capsys.readouterr().err


def test_an_image_over_the_pixel_cap_is_refused_from_its_header(tmp_path):
    """A 12,000 x 12,000 image (over data.max_image_pixels' default, as the training job refuses it) is a DatasetError
    naming the row before the detector sees it; the detector took minutes over one before."""
    from PIL import Image

    data = _dataset(tmp_path, n=2)
    Image.new("1", (12_000, 12_000)).save(tmp_path / "images" / "1.png")  # 1 bit a pixel: small to write
    samples = read_jsonl(data)
    detector = FakeDetector()
    with pytest.raises(DatasetError, match=r"images/1.png: 12000x12000 = 144000000 pixels, over "
                                           r"data.max_image_pixels = 89478485"):
        annotate(samples, tmp_path / "out.jsonl", detector, cfg=PseudoGTConfig(batch_size=1), progress=False)
    assert detector.calls == 1  # the first row's; none for the large one
    with pytest.raises(ValueError, match="max_image_pixels must be >= 1"):
        PseudoGTConfig(max_image_pixels=0)
