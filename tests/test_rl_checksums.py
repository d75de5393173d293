"""A checkpoint step's checksums (rl/checkpoint.py) on plain files, without orbax: what write_checksums records, and
each way verify_checksums finds damage, in its exact words; an `item` checks that folder alone; a restore error is one
line."""

import hashlib
import json

import pytest

from spatial_jax.rl.checkpoint import CHECKSUMS, ChecksumMismatch, _reason, verify_checksums, write_checksums


@pytest.fixture
def step(tmp_path):
    d = tmp_path / "7"
    (d / "state").mkdir(parents=True)
    (d / "meta").mkdir()
    (d / "state" / "a").write_bytes(b"weights")
    (d / "meta" / "m").write_bytes(b"meta")
    write_checksums(d)
    return d


def _mismatch(step, item="") -> str:
    with pytest.raises(ChecksumMismatch) as err:
        verify_checksums(step, item)
    return str(err.value)


def test_write_checksums_records_every_file_but_itself(step):
    recorded = json.loads((step / CHECKSUMS).read_text(encoding="utf-8"))
    digest = {name: hashlib.sha256(data).hexdigest() for name, data in (("meta/m", b"meta"), ("state/a", b"weights"))}
    assert recorded == digest
    assert sorted(p.name for p in step.iterdir()) == [CHECKSUMS, "meta", "state"]  # no temporary left
    verify_checksums(step)
    write_checksums(step)  # written again (a step sealed twice): its own earlier checksums.json is not recorded
    assert json.loads((step / CHECKSUMS).read_text(encoding="utf-8")) == digest


def test_each_damage_in_its_words(step):
    old = hashlib.sha256(b"weights").hexdigest()
    (step / "state" / "a").write_bytes(b"weightz")
    new = hashlib.sha256(b"weightz").hexdigest()
    changed = f"{step / 'state' / 'a'} has changed since it was written"
    assert _mismatch(step) == f"{changed} (SHA-256 {old[:12]} -> {new[:12]})"
    verify_checksums(step, "meta")  # only the item's folder is checked
    assert _mismatch(step, "state").startswith(f"{step / 'state' / 'a'} has changed")
    (step / "state" / "a").unlink()
    assert _mismatch(step) == f"{step / 'state' / 'a'} is missing"
    (step / CHECKSUMS).write_text("{not json")
    assert _mismatch(step).startswith(f"{step / CHECKSUMS} does not read: Expecting property name")


def test_a_step_without_checksums_is_read_unchecked_with_one_warning(step, capsys):
    (step / CHECKSUMS).unlink()
    (step / "state" / "a").write_bytes(b"anything")
    verify_checksums(step)
    verify_checksums(step)
    assert capsys.readouterr().err == f"spatial-jax: {step} has no {CHECKSUMS} (a checkpoint from before checksums, " \
                                      "cut off right after its commit, or the file was deleted): read unchecked\n"


def test_reason_is_one_line():
    assert _reason(ValueError("first\nsecond")) == "ValueError: first"
    assert _reason(OSError("  \n")) == "OSError: "
    assert _reason(RuntimeError("x" * 400)) == "RuntimeError: " + "x" * 300


def test_set_aside_keeps_every_damaged_copy_and_newest_says_why(tmp_path):
    import jax
    import jax.numpy as jnp

    from spatial_jax.rl.checkpoint import Checkpointer, CheckpointError

    with Checkpointer(tmp_path, async_save=False) as ck:
        with pytest.raises(FileNotFoundError) as err:
            ck.restore_newest({"w": jnp.zeros(2)})
        assert str(err.value) == f"no checkpoint in {tmp_path / 'checkpoints'}"
        for n in range(3):  # step 2 written, found damaged and set aside, three times over
            ck.save(2, {"w": jnp.full(2, float(n))}, {"step": 2}, force=True)
            assert ck.set_aside(2).name == ("2" if n == 0 else f"2.{n}") and ck.all_steps() == []
        assert sorted(p.name for p in (tmp_path / "damaged_checkpoints").iterdir()) == ["2", "2.1", "2.2"]
        for step in (1, 2):
            ck.save(step, {"w": jnp.full(2, float(step))}, {"step": step}, force=True)
            (tmp_path / "checkpoints" / str(step) / "meta" / "metadata").write_text("")
        with pytest.raises(CheckpointError) as err:
            ck.restore_newest({"w": jnp.zeros(2)})
    first, second = (f"{tmp_path / 'checkpoints' / s}: " for s in "21")
    assert str(err.value).startswith(f"no checkpoint in {tmp_path / 'checkpoints'} reads back: {first}")
    assert f"; {second}" in str(err.value)  # each step's reason, newest first
    with Checkpointer(tmp_path, async_save=False) as ck:
        ck.save(3, {"w": jnp.arange(2, dtype=jnp.float32)}, {"step": 3}, force=True)
        step, state, meta, skipped = ck.restore_newest({"w": jax.ShapeDtypeStruct((2,), jnp.bfloat16)})
    # restored into the target given (its dtype here; its sharding on a mesh), not as saved
    assert (step, state["w"].dtype, state["w"].tolist(), meta, skipped) == (3, jnp.bfloat16, [0, 1], {"step": 3}, [])


def test_only_orbax_s_lost_futures_are_dropped():
    """The asyncio filter on log records: dropped only when asyncio's "<kind> exception was never retrieved" comes
    with a traceback through orbax (at any depth, not only its first frame); kept otherwise, and a record without
    exc_info never fails."""
    import logging
    import os
    import sys

    from spatial_jax.rl.checkpoint import _not_orbax_lost_task

    space = {}
    exec(compile("def write():\n    raise ValueError('no space')\n",
                 os.path.join(os.sep, "site-packages", "orbax", "w.py"), "exec"), space)
    try:
        space["write"]()  # the traceback's first frame is this test's, orbax's the next
    except ValueError:
        orbax = sys.exc_info()
    try:
        raise ValueError("elsewhere")
    except ValueError:
        elsewhere = sys.exc_info()

    def record(msg, exc_info):
        return logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1, msg, None, exc_info)

    assert not _not_orbax_lost_task(record("Task exception was never retrieved", orbax))
    assert not _not_orbax_lost_task(record("_GatheringFuture exception was never retrieved", orbax))
    assert _not_orbax_lost_task(record("Task exception was never retrieved", elsewhere))
    assert _not_orbax_lost_task(record("Task exception was never retrieved", None))
    assert _not_orbax_lost_task(record("Unclosed event loop", orbax))
    assert _not_orbax_lost_task(record("Unclosed event loop", None))


def test_a_lost_future_that_tensorstore_completed_is_dropped_by_its_error_alone():
    """A future tensorstore completes after orbax's loop stopped waiting holds its error with no traceback (CI saw
    such records at the exit of a full-disk run): dropped when the error is tensorstore's (its own text, taken from a
    real failed open here), kept for any other error, or the same text on another type."""
    import logging

    import tensorstore as ts

    from spatial_jax.rl.checkpoint import _not_orbax_lost_task

    try:
        ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": "/proc/no/such/dir"}}, create=True,
                dtype=ts.float32, shape=[4]).result()
    except ValueError as e:
        real = e.with_traceback(None)

    def record(error):
        return logging.LogRecord("asyncio", logging.ERROR, "base_events.py", 1, "Future exception was never retrieved",
                                 None, (type(error), error, None))

    assert not _not_orbax_lost_task(record(real))
    assert _not_orbax_lost_task(record(ValueError("no space left")))
    assert _not_orbax_lost_task(record(RuntimeError(str(real))))
    assert _not_orbax_lost_task(record(ValueError(f"see {real}")))
