"""A multi-host run, two processes on this machine: the same job as one process on the same 2x2 (data, fsdp) mesh.

Two CPU processes of 2 devices each join one JAX cluster through JAX_COORDINATOR_ADDRESS (as `spatial-jax train`
does on a GPU cluster or TPU pod), run an SFT cold start and GRPO steps with evaluation, and must end with the
parameters of a single process holding all 4 devices (to 1e-5: the reductions may group differently), with one set of
files written (only the first process writes logs and reports). Each process reads, decodes (from its own decoding
copy, on its own devices) and scores only its half of every batch (counted in the metrics), and evaluates half of the
held-out samples: the evaluation's figures are the single process's. Every RL step's old log-probs are those of the
weights it trains (the ratio is 1 before its update): the copy was made again after the previous update. The reward
is SpatialCORE's with a dense test term (spatial_jax/testing/dense_methods.py), so the RL steps move the weights and
the comparison is not between no-ops.
The job's Hugging Face export, written from weights sharded across the two processes, loads in transformers with the
JAX policy's logits (1e-4), and `spatial-jax export` on the run writes the same tensors.
"""

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import pytest
from test_export import TOL, export_error
from test_model_utils import forward

import spatial_jax.methods
from spatial_jax import config as C
from spatial_jax.cli import main
from spatial_jax.data.pipeline import eval_iterator
from spatial_jax.models.hf_io import _CheckpointReader
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.workspace import Workspace
from spatial_jax.rollout.hosts import HostShare
from spatial_jax.testing import dense_methods

ROOT = Path(__file__).resolve().parents[1]
JOB = [
    "sft.steps=2", "sft.batch_size=4", "rl.steps=2", "rl.prompts_per_step=2", "rl.group_size=2",
    "rl.sampling.max_new_tokens=12", "eval.after_sft=false", "eval.after_rl=true", "eval.max_samples=4",
    "eval.batch_size=4", "eval.max_new_tokens=12", "data.train=synthetic:train:16", "data.eval=synthetic:heldout:4",
    "tensorboard=false", "progress=false", "data.bucket_lengths=[256,512]", "mesh.data=2", "mesh.fsdp=2", "seed=5",
    "method=dense_spatialcore", "rl.optim.warmup_ratio=0.0",  # the first update moves: a stale copy would show
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env(devices: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env.update(extra)
    return env


@pytest.fixture
def dense():
    with dense_methods.registered(spatial_jax.methods):
        yield


def _params(run_dir: Path, stage: str = "rl"):
    """The trainable weights of `stage`'s last checkpoint."""
    from spatial_jax.rl.checkpoint import Checkpointer
    from spatial_jax.rl.optim import make_optimizer
    from spatial_jax.rl.workspace import Workspace

    job = Workspace(C.load(TrainConfig, None, [f"run_dir={run_dir}", *JOB]))
    tx = make_optimizer(job.optim_config(stage))
    with Checkpointer(run_dir / stage) as ck:
        step, state, _, _ = ck.restore_newest(job.state(tx.init(job.trainable)))
    assert step == 2
    return jax.tree.map(np.asarray, state["params"])


def _two_processes(command: list[str], run_dir: Path, alongside: Callable[[], None] = lambda: None,
                   devices: int = 2) -> list[str]:
    """`command run_dir=...` on a cluster of two processes of `devices` devices each (`alongside()` runs meanwhile);
    both must succeed. Returns their outputs."""
    port = _free_port()
    logs = [run_dir.parent / f"{run_dir.name}.process{i}.log" for i in range(2)]
    cluster = []
    try:
        for i, log in enumerate(logs):  # output to files: an unread pipe could stall a process mid-collective
            with open(log, "wb") as out:
                cluster.append(subprocess.Popen(
                    [*command, f"run_dir={run_dir}"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                    env=_env(devices, JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
                             JAX_PROCESS_ID=str(i)),
                ))
        alongside()
        for proc in cluster:
            proc.wait(timeout=600)
    finally:
        for proc in cluster:
            proc.kill()
    outputs = [log.read_text(errors="replace") for log in logs]
    for proc, out in zip(cluster, outputs):
        assert proc.returncode == 0, out[-3000:]
    return outputs


@pytest.mark.slow
def test_two_processes_train_like_one(dense, tmp_path):
    command = [sys.executable, "-c", dense_methods.RUNNER, "train", *JOB]

    def single():
        done = subprocess.run([*command, f"run_dir={tmp_path / 'single'}"], cwd=ROOT, env=_env(4),
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

    outputs = _two_processes(command, tmp_path / "cluster", single)
    # only the first process prints the summary and writes the run's files
    assert "after_rl:" in outputs[0] and "after_rl:" not in outputs[1]
    for stage in ("sft", "rl"):
        steps = [json.loads(line)["step"] for line in (tmp_path / "cluster" / stage / "metrics.jsonl").open()]
        assert steps == [1, 2]
    summary = json.loads((tmp_path / "cluster" / "summary.json").read_text())
    assert summary["after_rl"]["accuracy"]["n"] == 4

    rl_rows = [json.loads(line) for line in (tmp_path / "cluster" / "rl" / "metrics.jsonl").open()]
    assert all(row["loss/grad_norm"] > 1e-3 for row in rl_rows)  # not rounding noise (~1e-7) of a constant reward
    # each process read one of the 2 prompts of a step and scored its 2 rollouts; one process alone reads both
    single_rows = [json.loads(line) for line in (tmp_path / "single" / "rl" / "metrics.jsonl").open()]
    for rows, prompts in ((rl_rows, 1), (single_rows, 2)):
        for row in rows:
            assert row["host/prompts_read_min"] == row["host/prompts_read_max"] == prompts
            assert row["host/rows_decoded_min"] == row["host/rows_decoded_max"] == 2 * prompts
            assert row["host/rollouts_scored_min"] == row["host/rollouts_scored_max"] == 2 * prompts
            # one update per batch: the sampler's log-probs are the trained weights' own, so ratio 1 (to rounding)
            assert abs(row["loss/ratio_mean"] - 1) < 1e-5 and abs(row["loss/ratio_max"] - 1) < 1e-5
    single_summary = json.loads((tmp_path / "single" / "summary.json").read_text())
    for key in ("accuracy", "reward", "well_formed"):
        assert summary["after_rl"][key]["mean"] == pytest.approx(single_summary["after_rl"][key]["mean"], abs=1e-5)
    cluster_eval, single_eval = (json.loads((tmp_path / run / "eval_rl.json").read_text())["rows"]
                                 for run in ("cluster", "single"))
    assert [r["id"] for r in cluster_eval] == [r["id"] for r in single_eval]
    assert [r["completion"] for r in cluster_eval] == [r["completion"] for r in single_eval]

    cluster_params, single_params = _params(tmp_path / "cluster"), _params(tmp_path / "single")
    diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), cluster_params, single_params)
    moved = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), single_params, _params(tmp_path / "single", "sft"))
    assert max(jax.tree.leaves(moved)) > 1e-4  # the RL stage trained: the comparison is not between two no-ops
    assert max(jax.tree.leaves(diffs)) <= 1e-5

    # the export at the end of the job, gathered from both processes' shards, is the trained policy for transformers
    job = Workspace(C.load(TrainConfig, None, [f"run_dir={tmp_path / 'cluster'}", *JOB]))
    assert job.load_latest() == "rl"
    batch = next(eval_iterator(job.cfg.data, job.tok, job.method.prompt, 2, image_cfg=job.policy.image_cfg))
    hf = tmp_path / "cluster" / "hf"
    assert summary["hf_checkpoint"] == str(hf) and (hf / "tokenizer.json").exists()
    ids, mask, pixels, grids = batch.input_ids, batch.attention_mask, batch.pixel_values, batch.image_grid_thw
    assert export_error(forward(job.model, ids, mask, pixels, grids), hf, ids, mask, pixels, grids) < TOL
    # on demand: the command on the finished run writes the same tensors, in bfloat16 when asked
    assert main(["export", "--run-dir", str(tmp_path / "cluster"), "--out", str(tmp_path / "again"),
                 "--dtype", "bfloat16"]) == 0
    ours, again = _CheckpointReader(hf), _CheckpointReader(tmp_path / "again")
    assert ours.names() == again.names()
    for name in ours.names():
        np.testing.assert_allclose(again.get(name).astype(np.float32), ours.get(name), rtol=1e-2, atol=1e-6)



@pytest.mark.slow
def test_two_processes_roll_out_with_tools(dense, tmp_path):
    """AlloSpatial's multi-turn tool rollouts on two processes: each reads, decodes (running its rows' tool calls)
    and scores its own prompt, and the update trains on both processes' rollouts."""
    job = ["sft.steps=0", "rl.steps=1", "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=8",
           "rl.max_tool_turns=1", "rl.max_tool_tokens=64", "rl.optim.warmup_ratio=0.0", "eval.after_rl=false",
           "export_hf=false", "data.train=synthetic:train:4", "data.bucket_lengths=[512]", "mesh.data=2",
           "tensorboard=false", "progress=false", "method=dense_allospatial"]
    _two_processes([sys.executable, "-c", dense_methods.RUNNER, "train", *job], tmp_path / "tools", devices=1)
    (row,) = [json.loads(line) for line in (tmp_path / "tools" / "rl" / "metrics.jsonl").open()]
    assert row["host/prompts_read_max"] == row["host/rows_decoded_max"] / 2 == 1
    assert row["host/rows_decoded_min"] == row["host/rollouts_scored_min"] == 2
    assert "tool_calls_mean" in row and row["loss/grad_norm"] > 1e-3
    assert abs(row["loss/ratio_mean"] - 1) < 1e-5 and abs(row["loss/ratio_max"] - 1) < 1e-5


def test_each_process_reads_its_block_of_the_batches_one_process_reads():
    """HostShare's iterators, for processes 0 and 1 of 2, read blocks that make up the batches of one process (across
    an epoch boundary, and from a restored position), without any cluster."""
    from spatial_jax.data.image_processing import ImageProcessingConfig
    from spatial_jax.data.pipeline import DataConfig, train_iterator
    from spatial_jax.data.tokenizer import build_tokenizer
    from spatial_jax.rollout.hosts import HostShare

    tok, fmt = build_tokenizer(), spatial_jax.methods.get_method("spatialcore").prompt
    data = DataConfig(train="synthetic:train:6", bucket_lengths=(256, 512), seed=4)
    whole = train_iterator(data, tok, fmt, 4, mode="rl")
    blocks = [HostShare(i, 2).iterator(data, tok, fmt, 4, "rl", ImageProcessingConfig()) for i in range(2)]
    for _ in range(3):  # 6 samples in batches of 4: the second batch spans two epochs
        batch, parts = next(whole), [next(it) for it in blocks]
        assert [len(p.records) for p in parts] == [2, 2]
        assert [r.id for p in parts for r in p.records] == [r.id for r in batch.records]
        width = batch.input_ids.shape[1]
        for p, rows in zip(parts, (slice(0, 2), slice(2, 4))):
            np.testing.assert_array_equal(p.input_ids[:, -p.input_ids.shape[1]:], batch.input_ids[rows, width -
                                          p.input_ids.shape[1]:])
    state = blocks[1].get_state()
    assert state == whole.get_state()  # positions count batches: a run resumes on another number of processes
    again = HostShare(1, 2).iterator(data, tok, fmt, 4, "rl", ImageProcessingConfig())
    again.set_state(state)
    assert [r.id for r in next(again).records] == [r.id for r in next(whole).records][2:]
    with pytest.raises(ValueError, match="do not split"):
        HostShare(0, 3).iterator(data, tok, fmt, 4, "rl", ImageProcessingConfig())


def _as_two_processes(monkeypatch, work):
    """Runs work(HostShare(p, 2)) for p = 0, 1 in two threads whose allgather_rows meet like two processes'."""
    import threading

    from spatial_jax import distributed
    from spatial_jax.rollout import hosts as hosts_module
    from spatial_jax.rollout.hosts import HostShare

    barrier, slots = threading.Barrier(2, timeout=30), [None, None]

    def allgather_rows(x):
        p = int(threading.current_thread().name)
        slots[p] = np.asarray(x)
        barrier.wait()
        out = np.concatenate(slots, axis=0)
        barrier.wait()
        return out

    monkeypatch.setattr(hosts_module, "allgather_rows", allgather_rows)
    monkeypatch.setattr(distributed, "allgather_rows", allgather_rows)  # under allgather_bytes (`everyone`)
    results = [None, None]

    def run(p):
        results[p] = work(HostShare(p, 2, pad_id=7))

    threads = [threading.Thread(target=run, args=(p,), name=str(p)) for p in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_processes_assemble_the_whole_batch_of_rollouts_from_their_own(monkeypatch):
    """Two processes' multi-turn rollouts of different prompt and completion widths become the whole batch's arrays on
    both: prompts left-padded, completions right-padded, images in rollout order; texts stay where they were scored."""
    from spatial_jax.rollout.multiturn import MultiTurnCompletions

    def block(p: int, prompt: int, width: int, counts) -> MultiTurnCompletions:
        rows = np.arange(2)[:, None] + 10 * p + 1
        grids = np.array([[1, 2, 2 + 2 * p]] * int(sum(counts)), np.int32)
        pixels = np.full((int(grids.prod(-1).sum()), 3), p, np.float32)
        ids, comp = rows.repeat(prompt, 1), rows.repeat(width, 1)
        return MultiTurnCompletions(
            prompt_ids=ids, prompt_mask=np.ones_like(ids), pixel_values=pixels, image_grid_thw=grids, tokens=comp,
            logprobs=-comp * 1.0, entropies=comp * 1.0, mask=np.ones_like(comp), texts=("a", "b"), offsets=((), ()),
            image_counts=np.asarray(counts, np.int32), context_mask=np.ones_like(comp),
            num_tool_calls=np.array([p, 0], np.int32), num_tool_pictures=np.zeros(2, np.int32),
            second_per_grid=np.arange(len(grids), dtype=np.float32) + p)

    blocks = [block(0, 3, 8, [1, 2]), block(1, 5, 4, [1, 1])]
    out = _as_two_processes(monkeypatch, lambda hosts: hosts.assemble(blocks[hosts.index]))
    for whole in out:
        assert type(whole) is MultiTurnCompletions and whole.texts == ()
        padded = np.concatenate([np.full((2, 2), 7), blocks[0].prompt_ids], 1)  # left, with the pad id
        np.testing.assert_array_equal(whole.prompt_ids[:2], padded)
        np.testing.assert_array_equal(whole.prompt_mask[:2, :2], 0)
        np.testing.assert_array_equal(whole.prompt_ids[2:], blocks[1].prompt_ids)
        np.testing.assert_array_equal(whole.tokens[2:], np.concatenate([blocks[1].tokens, np.full((2, 4), 7)], 1))
        np.testing.assert_array_equal(whole.mask[2:, 4:], 0)
        np.testing.assert_array_equal(whole.logprobs[:2], blocks[0].logprobs)
        np.testing.assert_array_equal(whole.image_counts, [1, 2, 1, 1])
        np.testing.assert_array_equal(whole.num_tool_calls, [0, 0, 1, 0])
        np.testing.assert_array_equal(whole.pixel_values, np.concatenate([b.pixel_values for b in blocks]))
        np.testing.assert_array_equal(whole.image_grid_thw, np.concatenate([b.image_grid_thw for b in blocks]))
        np.testing.assert_array_equal(whole.second_per_grid, [0, 1, 2, 1, 2])
    everyone = _as_two_processes(monkeypatch, lambda hosts: hosts.everyone({"rows": [hosts.index] * (hosts.index + 1)}))
    assert everyone == [[{"rows": [0]}, {"rows": [1, 1]}]] * 2
    assert [HostShare(p, 2).row_ids(3, 2).tolist() for p in range(2)] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]


EVAL = [sys.executable, "-c", "import sys; from spatial_jax.cli import main; sys.exit(main(sys.argv[1:]))", "eval",
        "--benchmark", "spatialab", "--initial", "--no-progress"]
EVAL_SETTINGS = ["eval.max_new_tokens=8", "eval.batch_size=4", "mesh.data=2"]


@pytest.mark.slow
def test_two_processes_share_the_questions_of_an_evaluation_and_write_one_table(tmp_path):
    """`spatial-jax eval --benchmark` on two processes: each answers its share of the questions (2 and 1 of 3), and
    the first writes the table one process writes, to the response."""
    from test_bench_loaders import write_copy

    copy = write_copy("spatialab", tmp_path / "spatialab")
    command = [*EVAL, "--data", str(copy)]
    done = subprocess.run([*command, f"--output={tmp_path / 'single.json'}", *EVAL_SETTINGS,
                           f"run_dir={tmp_path / 'single'}"], cwd=ROOT, env=_env(2), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = _two_processes([*command, f"--output={tmp_path / 'cluster.json'}", *EVAL_SETTINGS],
                             tmp_path / "cluster", devices=1)
    assert "process 0 of 2 answers 2 of the 3 spatialab questions" in outputs[0]
    assert "process 1 of 2 answers 1 of the 3 spatialab questions" in outputs[1]
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("single", "cluster"))
    assert two["benchmarks"] == one["benchmarks"] and len(one["benchmarks"]["spatialab"]["rows"]) == 3
    # each process answered only its own questions: the first wrote all three to the cache, once each
    cached = [json.loads(line)["id"] for line in next((tmp_path / "cluster" / "eval_cache").glob("*/*.jsonl"))
              .read_text().splitlines()]
    assert sorted(cached) == sorted(r["id"] for r in one["benchmarks"]["spatialab"]["rows"])
