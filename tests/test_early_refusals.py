"""Issue 55 items 3-7: settings and paths that used to train on nothing, write into a run, print a traceback, hang,
or fail after every compile are refused in one line before any compile or write."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spatial_jax.cli import main


def _one_line(argv, capsys, status, *needles):
    assert main(argv) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def test_an_empty_rejection_interval_is_refused(tmp_path, capsys):
    """Item 3: one bound of 0.5 keeps [2, 0.5], nothing; the run trained on no token with status 0."""
    run = tmp_path / "run"
    _one_line(["train", f"run_dir={run}", "rl.old_logp=trainer", "rl.correction.mis=token",
               "rl.correction.mis_upper=0.5"], capsys, 2, "configuration error", "rl.correction.mis_upper",
              "would be empty")
    assert not run.exists()


def _run_dir(tmp_path):
    run = tmp_path / "run"
    (run / "rl" / "checkpoints" / "3").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"run_dir": str(run)}))
    return run


@pytest.mark.parametrize("inside", ["rl/checkpoints", "rl/checkpoints/3", "rl/checkpoints/4", "hf"])
def test_export_into_the_run_directory_is_refused(inside, tmp_path, capsys):
    """Item 4: into the checkpoints, the step being exported, a new step folder, or any folder of the run."""
    run = _run_dir(tmp_path)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    _one_line(["export", "--run-dir", str(run), "--out", str(run / inside)], capsys, 2, "--out",
              "lies inside the run directory")
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_export_beside_the_run_directory_is_not_inside_it(tmp_path, capsys):
    """A sibling whose name starts with the run's is outside it: the refusal that follows is the missing checkpoint."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run_dir": str(run)}))
    _one_line(["export", "--run-dir", str(run), "--out", str(tmp_path / "run_hf")], capsys, 2, "holds no checkpoint")


@pytest.mark.parametrize("spec", ["mix:1*synthetic:train:4|1*synthetic:train:0",
                                  "mix:1e308*synthetic:train:4|1e-308*synthetic:train:4",
                                  "mix:5e-324*synthetic:train:4|1*synthetic:train:4"])
def test_a_mixture_with_an_empty_or_vanishing_part_is_one_line(spec, capsys):
    """Item 5: grain's ValueError / OverflowError tracebacks became one line naming the part."""
    err = _one_line(["data", "check", spec], capsys, 1, "spatial-jax data", "mixture part")
    assert ("holds no rows" in err) == spec.endswith(":0")


def test_a_mixture_of_huge_equal_weights_reads(capsys):
    assert main(["data", "check", "mix:1e308*synthetic:train:4|1e308*synthetic:train:4"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["rows"] == 8


@pytest.mark.parametrize("entry", [{"filename": None}, {"filename": ""}, "x.arrow", {"filename": "../x.arrow"}])
def test_an_hf_disk_state_naming_no_file_is_one_line(entry, tmp_path, capsys):
    """Item 5: `"filename": null` raised TypeError; a name leaving the folder is refused too."""
    (tmp_path / "x.arrow").write_bytes(b"")
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"_data_files": [entry]}))
    _one_line(["data", "check", f"hf-disk:{folder}"], capsys, 1, "state.json")


@pytest.mark.parametrize("spec", ["{fifo}", "verl:{fifo}", "easyr1:{folder}"])
def test_a_named_pipe_is_refused_not_read(spec, tmp_path):
    """Item 6: a FIFO as a JSONL path, as a layout's file, or inside a layout's folder blocked until killed; run as a
    child so that a hang fails the test instead of stopping the suite."""
    folder = tmp_path / "copy"
    folder.mkdir()
    os.mkfifo(folder / "train.jsonl")
    spec = spec.format(fifo=folder / "train.jsonl", folder=folder)
    try:
        done = subprocess.run([sys.executable, "-m", "spatial_jax.cli", "data", "check", spec], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"data check {spec} hung on a named pipe")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "named pipe" in done.stderr or "a device or a pipe" in done.stderr, done.stderr


def test_plan_json_in_a_folder_that_cannot_take_it_is_refused_before_compiling(tmp_path, capsys, monkeypatch):
    """Item 7: refused only after every program had compiled (minutes to an hour)."""
    import spatial_jax.rl.plan

    def no_compile(*args, **kwargs):
        raise AssertionError("planning started")

    monkeypatch.setattr(spatial_jax.rl.plan, "plan", no_compile)
    _one_line(["plan", "--topology", "cpu:1", "--json", str(tmp_path / "missing" / "plan.json")], capsys, 2,
              "--json", "does not exist")
    blocked = tmp_path / "file"
    blocked.write_text("")
    _one_line(["plan", "--topology", "cpu:1", "--json", str(blocked / "plan.json")], capsys, 2, "--json")


def _rows(tmp_path, question_words):
    """A JSONL of three picture questions (PNG files beside it), the third with `question_words` words."""
    from PIL import Image

    (tmp_path / "images").mkdir()
    rows = []
    for i in range(3):
        Image.new("RGB", (64, 48), (40 * i, 90, 160)).save(tmp_path / "images" / f"{i}.png")
        question = "Where is the cup?" if i < 2 else " ".join(["left"] * question_words)
        rows.append({"id": f"q{i}", "image": f"images/{i}.png", "question": question, "options": ["left", "right"],
                     "answer": "A"})
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_an_over_long_row_is_refused_before_anything_compiles(tmp_path, capsys, monkeypatch):
    """Item 2: a row longer than the largest bucket, among good ones, let a short run finish (never drawn) and
    killed a long one at the step that drew it, naming only its id. Now every row is encoded first, and the refusal
    names the file and line, before the policy is built."""
    import spatial_jax.rl.workspace

    def not_built(*args, **kwargs):
        raise AssertionError("the policy was built")

    monkeypatch.setattr(spatial_jax.rl.workspace, "build_policy", not_built)
    path = _rows(tmp_path, 600)
    err = _one_line(["train", f"run_dir={tmp_path / 'run'}", "sft.steps=0", "rl.steps=2", f"data.train={path}",
                     "eval.after_rl=false", "data.bucket_lengths=[256,512]"], capsys, 1, f"data.train: {path}:3: ",
                    "do not fit the largest of data.bucket_lengths, 512")
    assert "tokens (prompt and pictures;" in err
    assert not (tmp_path / "run").exists()


def test_rows_that_fit_pass_the_preflight(tmp_path):
    from spatial_jax import config as C
    from spatial_jax.data.sample import DatasetError
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.policy import policy_encoding
    from spatial_jax.rl.train import open_inputs

    path = _rows(tmp_path, 40)

    def preflight(buckets):
        cfg = C.load(TrainConfig, None, [f"run_dir={tmp_path / 'run'}", "sft.steps=0", f"data.train={path}",
                                         "eval.after_rl=false", f"data.bucket_lengths={buckets}"])
        tok, image_cfg = policy_encoding(cfg.policy)
        open_inputs(cfg, (tok, cfg.plugin.prompt, image_cfg))

    preflight("[256,512]")
    # the two short rows fit 220 tokens, the third (36 words more) does not
    with pytest.raises(DatasetError, match=r"train.jsonl:3: 239 tokens \(prompt and pictures; 239 in the prompt\) "
                                           r"do not fit the largest of data.bucket_lengths, 220"):
        preflight("[220]")


def test_data_check_counts_tokens_as_the_jobs_preflight_does(tmp_path, capsys):
    """Item 2 in `data check`: every row encoded with the job's tokenizer, prompt and buckets (key=value overrides as
    train takes them), the longest row's tokens reported, an over-long row named by file and line; --sft encodes the
    SFT target too, so a row without a reference completion fails there and not in the RL encoding."""
    path = _rows(tmp_path, 40)

    def check(*args):
        flags = [a for a in args if a.startswith("--")]
        rc = main(["data", "check", *flags, str(path), *(a for a in args if a not in flags)])
        out, err = capsys.readouterr()
        return rc, json.loads(out.splitlines()[0]), out.splitlines()[1:], err

    rc, counts, fails, _ = check("data.bucket_lengths=[256,512]")
    assert rc == 0 and counts["tokens"] == {"longest": 239, "largest_bucket": 512, "mode": "rl"} and not fails
    rc, counts, fails, err = check("data.bucket_lengths=[220]")
    assert rc == 1 and counts["failed"] == 1 and counts["tokens"]["longest"] < 220
    assert fails == [f"FAIL {path}:3: 239 tokens (prompt and pictures; 239 in the prompt) do not fit the largest of "
                     "data.bucket_lengths, 220: add a longer bucket or drop the row"]
    rc, counts, fails, _ = check("--sft", "data.bucket_lengths=[256,512]")
    assert rc == 1 and counts["failed"] == 3 and all("SFT needs a reference completion" in f for f in fails)
    rc, counts, fails, _ = check("method=prosr", "data.bucket_lengths=[256,512]")  # the method's own prompt
    assert rc == 0 and counts["tokens"]["longest"] != 239
    assert main(["data", "check", str(path), "data.nope=1"]) == 2
    assert "unknown config key(s) ['data.nope']" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "data"])
def test_a_checkpoint_that_is_not_a_folder_is_one_line_not_a_hub_lookup(command, tmp_path, capsys):
    """A policy.checkpoint with no config.json was taken by transformers for a Hub repository: offline, it retried
    the network for minutes, then raised a traceback (a tokenizer it could not convert)."""
    (tmp_path / "empty").mkdir()
    for path, why in ((tmp_path / "none", "no such folder"), (tmp_path / "empty", "no config.json in it")):
        argv = (["train", f"run_dir={tmp_path / 'run'}"] if command == "train"
                else ["data", "check", "synthetic:train:2"]) + [f"policy.checkpoint={path}"]
        _one_line(argv, capsys, 2, f"policy.checkpoint '{path}' is not a checkpoint folder", why)
    assert not (tmp_path / "run").exists()
