"""Checkpointer: round trip of nnx/optax/rng state and meta, resume from the latest step, retention,
an interrupted save's tmp directory ignored, a damaged checkpoint skipped and set aside, sharded restore on CPU
devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spatial_jax.rl.checkpoint import Checkpointer, CheckpointError


class Tiny(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(4, 6, rngs=rngs)
        self.lora_a = nnx.Param(jax.random.normal(rngs.params(), (6, 2)))
        self.scale = nnx.BatchStat(jnp.ones(2))


def make_state(seed):
    model = Tiny(nnx.Rngs(seed))
    params = nnx.state(model, nnx.Param)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    opt_state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt_state = tx.update(grads, opt_state, params)
    return {"params": params, "opt_state": opt_state, "rng": jax.random.key(seed), "step": jnp.int32(seed)}


def assert_tree_equal(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_resume_latest_and_meta(tmp_path):
    meta = {"step": 0, "data": {"epoch": 1, "position": 37}, "config": {"loss": {"kind": "gspo", "dual_clip": None}}}
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        assert ckpt.latest_step() is None
        for step in (1, 2, 3):
            assert ckpt.save(step, make_state(step), {**meta, "step": step})
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [2, 3]  # max_to_keep
    # A new process resumes from the latest step.
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        assert ckpt.latest_step() == 3
        target = make_state(0)
        state, got_meta = ckpt.restore(target)
        assert_tree_equal(state, make_state(3))
        assert got_meta == {**meta, "step": 3}
        assert isinstance(state["params"], nnx.State)
        assert jnp.issubdtype(state["rng"].dtype, jax.dtypes.prng_key)
        older, older_meta = ckpt.restore(jax.eval_shape(lambda: make_state(0)), step=2)
        assert_tree_equal(older, make_state(2))
        assert older_meta["step"] == 2
        with pytest.raises(FileNotFoundError, match="step 1"):
            ckpt.restore(target, step=1)


def test_save_interval_and_bad_meta(tmp_path):
    with Checkpointer(tmp_path, save_interval=5, async_save=False) as ckpt:
        state = {"w": jnp.arange(3.0)}
        assert not ckpt.save(3, state, {})
        assert ckpt.save(5, state, {})
        assert ckpt.save(7, state, {}, force=True)
        assert ckpt.all_steps() == [5, 7]
        with pytest.raises(ValueError, match="JSON"):
            ckpt.save(10, state, {"x": object()})
        with pytest.raises(TypeError, match="dict"):
            ckpt.save(10, state, [1])
    with Checkpointer(tmp_path / "empty") as empty, pytest.raises(FileNotFoundError):
        empty.restore({"w": jnp.zeros(3)})


def test_interrupted_save_is_ignored(tmp_path):
    state = {"w": jnp.arange(4.0)}
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(10, state, {"step": 10})
    # Simulate a process killed while writing step 20: orbax's tmp directory with partial content.
    tmp = tmp_path / "checkpoints" / "20.orbax-checkpoint-tmp-1732900000000000"
    (tmp / "state").mkdir(parents=True)
    (tmp / "state" / "partial").write_bytes(b"\x00" * 10)
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 10
        restored, meta = ckpt.restore({"w": jnp.zeros(4)})
        np.testing.assert_array_equal(np.asarray(restored["w"]), np.arange(4.0))
        assert meta == {"step": 10}
        assert not tmp.exists()  # cleaned up on open
        assert ckpt.save(20, {"w": jnp.ones(4)}, {"step": 20})
        ckpt.wait_until_finished()
        assert ckpt.latest_step() == 20
    with Checkpointer(tmp_path) as ckpt:
        restored, meta = ckpt.restore({"w": jnp.zeros(4)})
        assert meta == {"step": 20} and np.all(np.asarray(restored["w"]) == 1.0)


def test_a_damaged_checkpoint_is_skipped_and_set_aside(tmp_path):
    with Checkpointer(tmp_path, async_save=False) as ckpt:
        for step in (1, 2):
            ckpt.save(step, {"w": jnp.full(3, float(step))}, {"step": step})
    damaged = tmp_path / "checkpoints" / "2"
    (damaged / "meta" / "metadata").write_text("")  # what a disk or a careless hand can leave
    with Checkpointer(tmp_path) as ckpt:
        step, state, meta, skipped = ckpt.restore_newest({"w": jnp.zeros(3)})
        assert step == 1 and meta == {"step": 1} and np.all(np.asarray(state["w"]) == 1.0)
        assert len(skipped) == 1 and skipped[0].startswith(f"{damaged}: ChecksumMismatch"), skipped
        assert ckpt.read_newest_meta() == (1, {"step": 1}, skipped)
        assert ckpt.set_aside(2) == tmp_path / "damaged_checkpoints" / "2" and ckpt.all_steps() == [1]
        assert ckpt.save(2, {"w": jnp.full(3, 5.0)}, {"step": 2})  # the step can be written again
        ckpt.wait_until_finished()
        assert ckpt.restore_newest({"w": jnp.zeros(3)})[0] == 2
    for step in (1, 2):
        (tmp_path / "checkpoints" / str(step) / "meta" / "metadata").write_text("")
    with Checkpointer(tmp_path) as ckpt, pytest.raises(CheckpointError, match=r"checkpoints/2: .*checkpoints/1: "):
        ckpt.restore_newest({"w": jnp.zeros(3)})


def test_bytes_changed_in_place_are_damage(tmp_path):
    """A bit flipped inside the array data (size unchanged) reads back as other numbers without a word from orbax;
    the step's checksums catch it, and the newest intact step is used."""
    w = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)  # incompressible: stored as written
    with Checkpointer(tmp_path) as ckpt:  # asynchronous saves: the checksums follow each commit
        for step in (1, 2):
            ckpt.save(step, {"w": jnp.asarray(w * step)}, {"step": step})
    latest = tmp_path / "checkpoints" / "2"
    assert (latest / "checksums.json").is_file() and (tmp_path / "checkpoints" / "1" / "checksums.json").is_file()
    data_file = max((p for p in (latest / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    raw = bytearray(data_file.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    data_file.write_bytes(bytes(raw))
    with Checkpointer(tmp_path) as ckpt:
        step, state, meta, skipped = ckpt.restore_newest({"w": jnp.zeros(1 << 16)})
        assert step == 1 and meta == {"step": 1} and np.array_equal(np.asarray(state["w"]), w)
        assert len(skipped) == 1, skipped
        assert skipped[0].startswith(f"{latest}: ChecksumMismatch: {data_file} has changed since it was written")
        assert ckpt.read_newest_meta()[0] == 2  # the meta alone is intact: eval and resume checks may read it


def test_sharded_restore(tmp_path):
    devices = jax.devices()
    assert len(devices) >= 4, "tests/conftest.py provides 8 CPU devices"
    mesh2 = Mesh(np.array(devices[:2]), ("fsdp",))
    sharded = NamedSharding(mesh2, P("fsdp", None))
    w = jax.device_put(jnp.arange(32.0).reshape(8, 4), sharded)
    b = jax.device_put(jnp.arange(4.0), NamedSharding(mesh2, P()))
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"w": w, "b": b}, {"step": 1})
        ckpt.wait_until_finished()
        target = {"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=sharded),
                  "b": jax.ShapeDtypeStruct(b.shape, b.dtype, sharding=b.sharding)}
        state, _ = ckpt.restore(target)
        assert state["w"].sharding == sharded
        assert len(state["w"].addressable_shards) == 2 and state["w"].addressable_shards[0].data.shape == (4, 4)
        np.testing.assert_array_equal(np.asarray(state["w"]), np.arange(32.0).reshape(8, 4))
        # Resharding onto a different mesh on restore.
        mesh4 = Mesh(np.array(devices[:4]), ("fsdp",))
        four = NamedSharding(mesh4, P("fsdp", None))
        state4, _ = ckpt.restore({"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=four), "b": b})
        assert state4["w"].sharding == four and state4["w"].addressable_shards[0].data.shape == (2, 4)
        np.testing.assert_array_equal(np.asarray(state4["w"]), np.arange(32.0).reshape(8, 4))


@pytest.mark.parametrize(
    "message, reason",
    [
        # the shape tensorstore gives for a failed chunk write
        ("INTERNAL: Error writing \"a/b\": Failed to write 60285 bytes to file 6: No space left on device "
         "[os_error_code='28'] [source locations='x.cc:1']", "No space left on device"),
        # an error while opening a driver: the cause sits behind paths with colons, past the first 300 characters
        ("OUT_OF_RANGE: Error opening \"zarr\" driver: Error writing \"p/.zarray\" in OCDBT database at local file "
         f"\"/{'d' * 400}/\": {{\"kvstore\": {{\"path\": \"x\"}}}} [os_error_code=27]", "File too large"),
        # no code at all, the words late in the text
        (f"UNKNOWN: {'spec ' * 100} write failed: Disk quota exceeded", "Disk quota exceeded"),
    ],
)
def test_a_write_error_names_the_systems_reason(message, reason):
    from spatial_jax.rl.checkpoint import _write_error

    line = _write_error(RuntimeError(message))
    assert reason in line and "\n" not in line and len(line) < 320, line


@pytest.mark.parametrize("lost", ["Task", "_GatheringFuture"])
def test_asyncio_s_lost_task_errors_of_orbax_writes_are_dropped_and_no_others(capsys, lost):
    """Issue 44 finding 6: when one write of a save fails, orbax collects the first error and asyncio logs each other
    failed write's future ("Task exception was never retrieved", or a gather's "_GatheringFuture ...", seen in CI, a
    traceback each) whenever it is collected, at exit at the latest: those are dropped (the failure is one SaveFailed
    line); a lost future of anyone else's is still logged."""
    import asyncio
    import gc
    import logging
    import os
    import sys

    from spatial_jax.rl.checkpoint import _quiet_orbax_errors

    def failing(filename):
        space = {}
        exec(compile("async def write():\n    raise ValueError('RESOURCE_EXHAUSTED: No space left on device')\n",
                     filename, "exec"), space)
        return space["write"]

    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("asyncio").addHandler(handler)
    try:
        _quiet_orbax_errors()
        for where in (os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "w.py"), "elsewhere.py"):
            loop = asyncio.new_event_loop()
            future = loop.create_task(failing(where)())
            if lost == "_GatheringFuture":
                future = asyncio.gather(future)  # the gather takes the task's error; its own is never retrieved
            loop.run_until_complete(asyncio.sleep(0))
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()
            del future
            gc.collect()
    finally:
        logging.getLogger("asyncio").removeHandler(handler)
    err = capsys.readouterr().err
    assert err.count(f"{lost} exception was never retrieved") == 1, err
    assert err.count("exception was never retrieved") == 1 and "elsewhere.py" in err and "orbax" not in err, err
