"""`spatial-jax score` run in-process: JSONL in, scored JSONL + summary out; bad lines, methods, keys, backends."""

import json

import pytest

from spatial_jax.cli import main
from spatial_jax.testing import rollouts as synthetic


def write(path, objs, extra_lines=()):
    lines = [json.dumps(o) for o in objs] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def read(path):
    return [json.loads(line) for line in open(path)]


@pytest.fixture()
def rollouts():
    return [synthetic.to_json(ro) for ro in synthetic.rollouts(8, seed=11, group_size=4, with_blank=True)]


def test_score_spatialcore_with_groups(tmp_path, rollouts, capsys):
    rollouts[-1].pop("group")
    out = tmp_path / "scored.jsonl"
    rc = main(["score", "--method", "spatialcore", "--input", write(tmp_path / "in.jsonl", rollouts),
               "--output", str(out)])
    assert rc == 0
    rows = read(out)
    assert [r["id"] for r in rows] == [o["id"] for o in rollouts]
    for key in ("reward", "r_ans", "format", "r_spatial", "precision", "recall", "mean_H", "n_pred"):
        assert all(key in r for r in rows)
    assert all("advantage" in r for r in rows[:-1]) and "advantage" not in rows[-1]
    first = [r["advantage"] for r in rows[:4]]
    assert abs(sum(first)) < 1e-6
    summary = capsys.readouterr().out
    assert "scored 8" in summary and "malformed lines 0" in summary and "parse failures" in summary


def test_malformed_lines_are_reported_and_skipped(tmp_path, rollouts, capsys):
    bad = ["{not json", json.dumps({"id": "x"}), json.dumps({"completion": "a", "token_entropies": [1.0],
                                                              "token_offsets": []}), ""]
    path = write(tmp_path / "in.jsonl", rollouts[:2], bad)
    rc = main(["score", "--method", "spatialcore", "--input", path])
    captured = capsys.readouterr()
    assert rc == 0
    assert f"{path}:3:" in captured.err and f"{path}:4:" in captured.err and f"{path}:5:" in captured.err
    assert "malformed lines 3" in captured.out
    scored = [json.loads(line) for line in captured.out.splitlines() if line.startswith("{")]
    assert len(scored) == 2


def test_prosr_torch_backend_matches_default_and_overrides(tmp_path, rollouts, capsys):
    path = write(tmp_path / "in.jsonl", rollouts)
    results = {}
    for backend in ("default", "torch"):
        out = tmp_path / f"{backend}.jsonl"
        assert main(["score", "--method", "prosr", "--input", path, "--output", str(out), "--backend", backend,
                     "rewards.prosr.tau_cf=0.2", "rewards.prosr.resample_len=32"]) == 0
        results[backend] = read(out)
    for a, b in zip(results["default"], results["torch"]):
        assert a.keys() == b.keys()
        for k, v in a.items():
            if isinstance(v, float):
                assert v == pytest.approx(b[k], abs=1e-6)
    assert "backend torch" in capsys.readouterr().out


def test_override_changes_the_score(tmp_path, rollouts):
    path = write(tmp_path / "in.jsonl", rollouts)
    means = []
    for beta in ("0.1", "1.0"):
        out = tmp_path / f"b{beta}.jsonl"
        assert main(["score", "--method", "spatialcore", "--input", path, "--output", str(out),
                     f"rewards.spatialcore.beta={beta}"]) == 0
        means.append(sum(r["precision"] for r in read(out)))
    assert means[1] > means[0]  # beta = 1 removes the confidence discount


@pytest.mark.parametrize("argv,needle", [
    (["--method", "nope"], "unknown method"),
    (["--method", "spatialcore", "rewards.spatialcore.bogus_key=1"], "bogus_key"),
    (["--method", "spatialcore", "rewards.spatialcore.beta=high"], "beta"),
    (["--method", "spatialcore", "beta=0.5"], "rewards.spatialcore.<name>=value"),
    (["--method", "spatialcore", "rewards.prosr.tau_cf=0.5"], "rewards.spatialcore.<name>=value"),
    (["--method", "spatialcore", "--backend", "cuda"], "unknown backend"),
    (["--method", "spatialcore", "novalue"], "key=value"),
])
def test_configuration_errors_exit_2(tmp_path, rollouts, capsys, argv, needle):
    path = write(tmp_path / "in.jsonl", rollouts[:1])
    assert main(["score", "--input", path] + argv) == 2
    assert needle in capsys.readouterr().err


def test_missing_input_file(tmp_path, capsys):
    assert main(["score", "--method", "spatialcore", "--input", str(tmp_path / "none.jsonl")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_registry_resolves_every_method():
    from spatial_jax.methods import METHODS

    assert sorted(METHODS) == ["allospatial", "prosr", "spatialcore", "spatialthinker"]
    for name, method in METHODS.items():
        cfg = method.config()
        assert type(cfg) is method.config_cls
        assert callable(method.score_batch) and callable(method.reference_score_batch), name
        assert method.score_batch([], cfg) == [] and list(method.reference_score_batch([], cfg)) == []


def test_records_reject_negative_offsets_and_absurd_entropies():
    from spatial_jax.records import RecordError, Rollout

    base = {"id": "r", "completion": "ab</think>B", "token_entropies": [0.1, 0.2], "token_offsets": [[0, 1], [1, 2]]}
    assert Rollout.from_json(base).trace.offsets == ((0, 1), (1, 2))
    with pytest.raises(RecordError, match=r"token_offsets\[0\]"):
        Rollout.from_json({**base, "token_offsets": [[-3, 1], [1, 2]]})  # would slice the text from its end
    with pytest.raises(RecordError, match=r"token_entropies\[1\]"):
        Rollout.from_json({**base, "token_entropies": [0.1, 1e308]})  # would overflow ProSR's segment sums
    assert Rollout.from_json({**base, "token_entropies": [None, -1e-7]}).trace.entropies[1] == 0.0  # rounding


def test_hostile_json_lines_are_malformed_lines(tmp_path, rollouts, capsys):
    """A line nested 100,000 deep or an integer over 4,300 digits is one malformed line, not the loss of the file."""
    hostile = ["[" * 100_000 + "]" * 100_000, '{"id": ' + "9" * 5000 + ', "completion": "x"}']
    path = write(tmp_path / "in.jsonl", rollouts[:2], hostile + [json.dumps(rollouts[2])])
    rc = main(["score", "--method", "spatialcore", "--input", path])
    captured = capsys.readouterr()
    assert rc == 0
    assert f"{path}:3: malformed JSON" in captured.err and f"{path}:4: malformed JSON" in captured.err
    assert "scored 3" in captured.out and "malformed lines 2" in captured.out


def test_byte_order_mark_is_accepted(tmp_path, rollouts, capsys):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(o) for o in rollouts[:2]).encode() + b"\n")
    assert main(["score", "--method", "spatialcore", "--input", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "scored 2" in captured.out and "malformed lines 0" in captured.out


@pytest.mark.parametrize("output, needle", [
    ("nodir/x.jsonl", "does not exist"),
    (".", "Is a directory"),
])
def test_unwritable_output_fails_before_scoring(tmp_path, rollouts, capsys, monkeypatch, output, needle):
    import spatial_jax.eval.offline_score as offline

    def never(*args, **kwargs):
        raise AssertionError("scored although the output cannot be written")

    monkeypatch.setattr(offline, "score_rollouts", never)
    path = write(tmp_path / "in.jsonl", rollouts[:2])
    rc = main(["score", "--method", "spatialcore", "--input", path, "--output", str(tmp_path / output)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "cannot write" in err and needle in err and "Traceback" not in err


def test_full_disk_output_is_reported(tmp_path, rollouts, capsys):
    import os

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    path = write(tmp_path / "in.jsonl", rollouts[:2])
    assert main(["score", "--method", "spatialcore", "--input", path, "--output", "/dev/full"]) == 1
    assert "cannot write /dev/full" in capsys.readouterr().err


def test_output_equal_to_input_is_refused(tmp_path, rollouts, capsys):
    path = write(tmp_path / "in.jsonl", rollouts[:2])
    before = open(path).read()
    (tmp_path / "link.jsonl").symlink_to(path)
    for output in (path, str(tmp_path / "link.jsonl")):
        assert main(["score", "--method", "spatialcore", "--input", path, "--output", output]) == 2
        assert "would overwrite its input" in capsys.readouterr().err
    assert open(path).read() == before


TRACE = {"id": "r", "completion": "ab</think>B", "token_entropies": [0.1, 0.2], "token_offsets": [[0, 1], [1, 2]]}


@pytest.mark.parametrize("edit, field", [
    ({"token_offsets": [[0, 1], [1, 12]]}, r"token_offsets\[1\]"),  # ends past the 11-character completion
    ({"token_offsets": [[0, 11], [0, 11]]}, r"token_offsets\[1\]"),  # every token claims the whole text
    ({"token_offsets": [[0, 2], [1, 3]]}, r"token_offsets\[1\]"),  # overlaps its predecessor
    ({"token_offsets": [[1, 2], [0, 1]]}, r"token_offsets\[1\]"),  # goes backwards
    ({"token_offsets": [[2, 1], [2, 3]]}, r"token_offsets\[0\]"),  # ends before it starts
    ({"token_entropies": [0.1, -0.5]}, r"token_entropies\[1\]"),
    ({"token_entropies": [float("inf"), 0.2]}, r"token_entropies\[0\]"),
    ({"token_entropies": [float("nan"), 0.2]}, r"token_entropies\[0\]"),
    ({"blank": {"completion": "a", "token_entropies": [0.1], "token_offsets": [[0, 2]]}},
     r"blank.token_offsets\[0\]"),
])
def test_impossible_token_traces_are_refused(edit, field):
    from spatial_jax.records import RecordError, Rollout

    with pytest.raises(RecordError, match=field):
        Rollout.from_json({**TRACE, **edit})


def test_token_traces_real_tokenizers_emit_are_accepted():
    """Zero-width tokens (special tokens, the first bytes of a split character) and Hugging Face's repetition of a
    split character's one-character span are what tokenizers emit; rounding noise below 0 reads as 0."""
    from spatial_jax.records import Rollout

    ro = Rollout.from_json({**TRACE, "token_entropies": [0.1, 0.0, 0.2, -1e-6, 0.3],
                            "token_offsets": [[0, 1], [1, 1], [1, 2], [1, 2], [11, 11]]})
    assert ro.trace.offsets == ((0, 1), (1, 1), (1, 2), (1, 2), (11, 11))
    assert ro.trace.entropies[3] == 0.0
    assert Rollout.from_json({**TRACE, "token_offsets": [[0, 1], [2, 4]]}).trace.offsets[1] == (2, 4)  # a gap


def test_impossible_traces_are_malformed_lines(tmp_path, rollouts, capsys):
    """ProSR scored offsets past the text and negative entropies at its maximum 1.2; now they are bad records."""
    good = rollouts[0]
    n = len(good["completion"])
    bad = [{**good, "id": "past-end", "token_offsets": [[n, n + 5]] * len(good["token_offsets"])},
           {**good, "id": "negative", "token_entropies": [-3.0] * len(good["token_entropies"])}]
    path = write(tmp_path / "in.jsonl", [good] + bad)
    assert main(["score", "--method", "prosr", "--input", path]) == 0
    captured = capsys.readouterr()
    assert f"{path}:2: bad record: field 'token_offsets[0]'" in captured.err
    assert f"{path}:3: bad record: field 'token_entropies[0]'" in captured.err
    assert "scored 1" in captured.out and "malformed lines 2" in captured.out


@pytest.mark.parametrize("field", ["gt_boxes", "completion"])
def test_a_line_with_too_many_boxes_is_a_named_bad_record(field, tmp_path, capsys):
    """20,000 boxes on one line took minutes to match; past MAX_BOXES the line is refused, naming the field."""
    from spatial_jax.records import MAX_BOXES

    boxes = [{"bbox_2d": [i % 900, 10, i % 900 + 50, 60], "label": f"o{i}"} for i in range(MAX_BOXES + 1)]
    row = {"id": "x", "question": "Q?", "options": ["a", "b"], "answer": "A", "completion": "<think></think>A"}
    if field == "gt_boxes":
        row["gt_boxes"] = boxes
    else:
        row["completion"] = "<think>\n" + "\n".join(json.dumps(b) for b in boxes) + "\n</think>A"
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert main(["score", "--method", "spatialcore", "--input", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"{path}:1: bad record: field '{field}' holds {MAX_BOXES + 1} boxes, more than the {MAX_BOXES}" in err
