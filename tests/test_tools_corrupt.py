"""`spatial-jax corrupt`: the A.3 corruption test hits the requested number of boxes exactly, displaces below the IoU
bound, relabels from the same sample, and is a function of its seed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from spatial_jax.cli import main
from spatial_jax.data.corrupt import KINDS, CorruptConfig, corrupt, displace, iou
from spatial_jax.data.jsonl import read_jsonl, write_jsonl
from spatial_jax.data.sample import Sample
from spatial_jax.records import GTBox


def _dataset(n: int, seed: int = 0) -> list[Sample]:
    """n samples with 0-5 boxes each (some samples with a single label, some with repeated labels)."""
    rng = np.random.default_rng(seed)
    names = ["cup", "dog", "red car", "Red  Car", "tree", "person"]
    samples = []
    for i in range(n):
        boxes = []
        for _ in range(int(rng.integers(0, 6))):
            x1, y1 = (int(c) for c in rng.integers(0, 900, size=2))
            w, h = (int(c) for c in rng.integers(5, 1000 - max(x1, y1) + 1, size=2))
            boxes.append(GTBox((float(x1), float(y1), float(min(1000, x1 + w)), float(min(1000, y1 + h))),
                               names[int(rng.integers(len(names)))], round(float(rng.uniform(0, 1)), 3)))
        samples.append(Sample(id=f"s{i}", image=f"images/{i}.png", question="q?", options=("a", "b"), answer="A",
                              gt_boxes=tuple(boxes)))
    return samples


def _records(samples):
    return [(s, r) for s in samples for r in s.meta.get("corruption", [])]


@pytest.mark.parametrize("n", [1, 2, 7, 25, 120])
@pytest.mark.parametrize("fraction", [0.0, 0.4, 0.5, 1.0])
def test_exactly_the_requested_share_of_boxes_is_corrupted(n, fraction):
    samples = _dataset(n, seed=n)
    total = sum(len(s.gt_boxes) for s in samples)
    out, report = corrupt(samples, CorruptConfig(fraction=fraction, seed=3))
    expected = int(np.floor(fraction * total + 0.5))
    records = _records(out)
    assert len(records) == report["corrupted"] == expected == sum(report["by_kind"].values())
    assert report["boxes"] == total
    assert len({(s.id, r["index"]) for s, r in records}) == expected  # no box is corrupted twice
    removed = sum(r["kind"] == "removed" for _, r in records)
    assert sum(len(s.gt_boxes) for s in out) == total - removed == report["boxes_after"]
    assert [s.id for s in out] == [s.id for s in samples]
    untouched = [(a, b) for a, b in zip(samples, out) if "corruption" not in b.meta]
    assert all(a is b for a, b in untouched) and report["samples_changed"] == len(samples) - len(untouched)


def test_half_rounds_up():
    samples = _dataset(40)
    boxes = [b for s in samples for b in s.gt_boxes]
    five = [dataclasses.replace(samples[0], gt_boxes=tuple(boxes[:5]))]
    assert corrupt(five, CorruptConfig(fraction=0.5))[1]["corrupted"] == 3  # 2.5 -> 3
    assert corrupt(five, CorruptConfig(fraction=0.1))[1]["corrupted"] == 1  # 0.5 -> 1


def test_each_kind_does_what_it_says():
    samples = _dataset(200)
    out, report = corrupt(samples, CorruptConfig(fraction=0.4, seed=1))
    by_id = {s.id: s for s in samples}
    seen = set()
    for s, r in _records(out):
        original = by_id[s.id].gt_boxes[r["index"]]
        assert r["label"] == original.label and r["box"] == list(original.bbox)
        # The box's place in the output: its index less the boxes removed before it.
        removed_before = sum(q["kind"] == "removed" and q["index"] < r["index"] for q in s.meta["corruption"])
        now = None if r["kind"] == "removed" else s.gt_boxes[r["index"] - removed_before]
        if r["kind"] == "displaced":
            x1, y1, x2, y2 = now.bbox
            assert iou(now.bbox, original.bbox) < 0.6 and r["iou"] < 0.6
            assert 0 <= x1 < x2 <= 1000 and 0 <= y1 < y2 <= 1000 and list(now.bbox) == r["new_box"]
            assert now.label == original.label and now.validity == original.validity
        elif r["kind"] == "relabelled":
            valid = {b.label for b in by_id[s.id].gt_boxes if b.validity > 0}
            assert r["new_label"] in valid and now.label == r["new_label"]
            assert " ".join(r["new_label"].lower().split()) != " ".join(original.label.lower().split())
            assert now.bbox == original.bbox
        if "instead_of" in r:  # no other label in that sample: another kind
            assert r["kind"] in ("removed", "displaced") and r["instead_of"] == "relabelled"
            others = {" ".join(b.label.lower().split()) for b in by_id[s.id].gt_boxes if b.validity > 0}
            assert others <= {" ".join(original.label.lower().split())}
        seen.add(r["kind"])
    assert seen == set(KINDS) and report["relabel_fallbacks"] > 0


def test_a_sample_with_one_label_is_never_relabelled():
    s = Sample(id="x", image="i.png", question="q", options=("a",), answer="A",
               gt_boxes=(GTBox((0.0, 0.0, 1000.0, 1000.0), "sky"), GTBox((10.0, 10.0, 50.0, 50.0), "SKY")))
    kinds = set()
    for seed in range(20):
        out, _ = corrupt([s], CorruptConfig(fraction=1.0, seed=seed))
        kinds |= {r["kind"] for r in out[0].meta["corruption"]}
    assert kinds == {"removed", "displaced"}


def test_displacement_bounds_hold_for_any_box_and_bound():
    rng = np.random.default_rng(0)
    for bound in (0.6, 0.3, 0.05):
        for box in [(0, 0, 1000, 1000), (0, 0, 1000, 2), (100.5, 100.5, 900.5, 900.5), (5, 5, 5, 5), (990, 0, 1000, 9)]:
            moved = displace(rng, box, bound)
            assert iou(moved, box) < bound and 0 <= moved[0] < moved[2] <= 1000 and 0 <= moved[1] < moved[3] <= 1000


def test_same_seed_same_output_and_another_seed_another():
    samples = _dataset(30)
    a = corrupt(samples, CorruptConfig(seed=5))
    b = corrupt(samples, CorruptConfig(seed=5))
    c = corrupt(samples, CorruptConfig(seed=6))
    rows = lambda res: [s.to_json() for s in res[0]]
    assert rows(a) == rows(b) and a[1] == b[1]
    assert rows(a) != rows(c)


def test_earlier_corruption_records_are_kept():
    s = Sample(id="x", image="i.png", question="q", options=("a",), answer="A",
               gt_boxes=(GTBox((0.0, 0.0, 10.0, 10.0), "cup"),), meta={"corruption": [{"kind": "none"}]})
    out, _ = corrupt([s], CorruptConfig(fraction=1.0))
    assert out[0].meta["corruption"][0] == {"kind": "none"} and len(out[0].meta["corruption"]) == 2


def test_config_is_validated():
    with pytest.raises(ValueError, match="fraction must lie in"):
        CorruptConfig(fraction=1.2)
    with pytest.raises(ValueError, match="displace_iou must lie in"):
        CorruptConfig(displace_iou=1.0)


def test_cli_writes_the_dataset_and_the_report(tmp_path, capsys):
    data = tmp_path / "data" / "in.jsonl"
    write_jsonl(_dataset(12), data)
    out = tmp_path / "out" / "corrupt.jsonl"
    argv = ["corrupt", "--input", str(data), "--output", str(out), "--seed", "2"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    samples = read_jsonl(out, check_images=False)
    assert len(_records(samples)) == report["corrupted"] == round(0.4 * report["boxes"])
    # Image paths are rewritten relative to the output's folder, so they still name the input's images.
    assert Path(samples[0].image).resolve() == (tmp_path / "data" / "images" / "0.png").resolve()
    first = out.read_bytes()
    assert main(argv + ["--report", str(tmp_path / "r.json")]) == 0 and out.read_bytes() == first
    assert json.loads((tmp_path / "r.json").read_text()) == report
    assert main(["corrupt", "--input", str(data), "--output", str(out), "--fraction", "2"]) == 2
    assert "fraction must lie in [0, 1]" in capsys.readouterr().err


def test_relabels_never_take_the_label_of_an_invalid_box():
    """A box of validity 0 is no object of the scene: its label is never given to another box (and a sample whose
    only other label is such a box's falls back to the other kinds)."""
    s = Sample(id="x", image="i.png", question="q", options=("a",), answer="A",
               gt_boxes=(GTBox((0.0, 0.0, 500.0, 500.0), "cup", 1.0), GTBox((500.0, 500.0, 900.0, 900.0), "dog", 0.5),
                         GTBox((100.0, 600.0, 300.0, 900.0), "ghost", 0.0)))
    new_labels = set()
    for seed in range(40):
        out, _ = corrupt([s], CorruptConfig(fraction=1.0, seed=seed))
        new_labels |= {r["new_label"] for r in out[0].meta["corruption"] if r["kind"] == "relabelled"}
    assert new_labels == {"cup", "dog"}
    only_ghost = dataclasses.replace(s, gt_boxes=s.gt_boxes[::2])  # cup, and the invalid ghost
    for seed in range(20):
        out, _ = corrupt([only_ghost], CorruptConfig(fraction=1.0, seed=seed))
        assert all(r["label"] == "ghost" for r in out[0].meta["corruption"] if r["kind"] == "relabelled")
