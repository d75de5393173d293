"""Training checkpoints with orbax: one array pytree (params/adapters, optimizer state, rng key) plus a JSON meta dict.

Layout: <run_dir>/checkpoints/<step>/{state, meta}. Orbax writes each step into `<step>.orbax-checkpoint-tmp-*`
and renames it when complete, so a run killed mid-save leaves only a tmp directory, which is never listed as a
step and is deleted when the next Checkpointer opens the run. Once a step is committed, the first process writes
the SHA-256 of each of its files to <step>/checksums.json (when the next save starts, or on wait / close), and
`restore` checks them first: bytes changed in place, which orbax would read back as other numbers, are damage too (a
step without the file, from before checksums, a kill right after its commit or a deleted file, is read unchecked with
a one-line warning: refusing it would refuse the resume after such a kill). A checkpoint
damaged after the fact (a cut, missing or changed file) is skipped by `restore_newest` / `read_newest_meta`, which
fall back to the newest one that reads back, and can be moved out of the way with `set_aside`.

A reader (`Checkpointer(..., reader=True)`: eval, export, a resume's checks) opens the steps read-only: orbax's manager,
opened to write, deletes every `*.orbax-checkpoint-tmp*` directory it finds, which would pull the step a training job
is saving in the same run directory from under it.

A save that fails (a full disk) raises SaveFailed, one line naming the step and the file-system error, when the
next save starts or on wait / close; orbax's own logging of that error, a traceback per thread, and asyncio's of the
same error in each of the save's other writes ("Task exception was never retrieved", or "_GatheringFuture ..."), are
dropped.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from spatial_jax.digests import file_hashes, sha256

_STATE = "state"
_META = "meta"
CHECKSUMS = "checksums.json"
DAMAGED = "damaged_checkpoints"  # sibling of checkpoints/, where set_aside moves unreadable steps


class CheckpointError(OSError):
    """A stage has checkpoints but none of them reads back; the message names each one and its error."""


class ChecksumMismatch(OSError):
    """A checkpoint file whose bytes are not those written (or that is gone)."""


class SaveFailed(OSError):
    """A checkpoint could not be written (its partial files are removed); the message names the step and why."""


def _not_orbax_error(record: logging.LogRecord) -> bool:
    return not (record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname)


_LOST = re.compile(r"\w+ exception was never retrieved")  # asyncio's words for any kind of future
# tensorstore's errors: a ValueError whose text starts with an absl status code
_TENSORSTORE = re.compile(r"(CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|"
                          r"PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE|"
                          r"UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED): ")


def _not_orbax_lost_task(record: logging.LogRecord) -> bool:
    """False for asyncio's "<Task|Future|_GatheringFuture> exception was never retrieved" of orbax's: when one write of
    a save fails (a full disk), orbax's gather raises the first error and never collects the others' (nor, at times,
    the gather's own), which asyncio logs, a traceback each, when the future is collected (any time later, at exit at
    the latest). A future tensorstore completed itself, once orbax's loop had stopped waiting, holds the error with no
    traceback at all (seen in about 1 run in 30 on a full disk): that one is known by the error's own form."""
    if not _LOST.match(str(record.msg)) or not record.exc_info:
        return True
    _, error, tb = record.exc_info
    if tb is None:
        return not (type(error) is ValueError and _TENSORSTORE.match(str(error)))
    while tb is not None:
        if f"{os.sep}orbax{os.sep}" in tb.tb_frame.f_code.co_filename:
            return False
        tb = tb.tb_next
    return True


def _closed_loop_hook(previous):
    def hook(unraisable) -> None:
        e = unraisable.exc_value
        if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
            return  # tensorstore reporting more failed writes to orbax's event loop, closed by the first failure
        previous(unraisable)

    hook.quiets_closed_loop = True
    return hook


def _quiet_orbax_errors() -> None:
    """Drops the errors orbax logs from its save threads (absl's logger), and tensorstore's tracebacks of the same
    failure once orbax's event loop is closed: the error is raised again on the next save, wait or close, where it
    becomes one SaveFailed line."""
    for name, drop in (("absl", _not_orbax_error), ("asyncio", _not_orbax_lost_task)):
        logger = logging.getLogger(name)
        if drop not in logger.filters:
            logger.addFilter(drop)
    if not getattr(sys.unraisablehook, "quiets_closed_loop", False):
        sys.unraisablehook = _closed_loop_hook(sys.unraisablehook)


def write_checksums(step_dir: Path) -> None:
    """<step_dir>/checksums.json: the SHA-256 of each file of the committed step, written whole (temp + rename)."""
    tmp = step_dir / f".{CHECKSUMS}.tmp"
    tmp.write_text(json.dumps(file_hashes(step_dir, skip=CHECKSUMS), indent=0, sort_keys=True), encoding="utf-8")
    os.replace(tmp, step_dir / CHECKSUMS)


_UNCHECKED: set[Path] = set()  # steps read without checksums, each said once


def verify_checksums(step_dir: Path, item: str = "") -> None:
    """ChecksumMismatch naming the first file of the step (of its `item` folder alone, when given) whose bytes differ
    from its recorded SHA-256."""
    try:
        recorded = json.loads((step_dir / CHECKSUMS).read_text(encoding="utf-8"))
    except FileNotFoundError:  # written before checksums, killed between the commit and the checksums, or deleted
        if step_dir not in _UNCHECKED:
            _UNCHECKED.add(step_dir)
            print(f"spatial-jax: {step_dir} has no {CHECKSUMS} (a checkpoint from before checksums, cut off right "
                  "after its commit, or the file was deleted): read unchecked", file=sys.stderr, flush=True)
        return
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ChecksumMismatch(f"{step_dir / CHECKSUMS} does not read: {e}") from None
    for name, digest in sorted(recorded.items()):
        if item and not name.startswith(f"{item}/"):
            continue
        try:
            actual = sha256(step_dir / name)
        except FileNotFoundError:
            raise ChecksumMismatch(f"{step_dir / name} is missing") from None
        if actual != digest:
            raise ChecksumMismatch(f"{step_dir / name} has changed since it was written (SHA-256 {digest[:12]} -> "
                                   f"{actual[:12]})")


def _reason(e: BaseException) -> str:
    """One line for a restore error (tensorstore's run to pages of spec)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


# tensorstore's words for a failed write, among paths and specs: "Failed to write 60285 bytes to file 6: No space
# left on device [os_error_code='28']". Where the words around the code take another shape (an error while opening a
# driver nests the cause behind more paths), the code alone still names the cause.
_OS_ERROR = re.compile(r"[^\":]*: [^\":\[]*\[os_error_code='?\d+'?\]")
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)'?")
# The system's reasons a write fails, looked for by their words when tensorstore gives no code.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO)


def _write_error(e: BaseException) -> str:
    """One line for a save error: the system's words, without the paths and specs tensorstore puts around them."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = " ".join(str(e).split())
    found = _OS_ERROR.search(text)
    if found:
        return found.group(0).strip()
    code = _OS_ERROR_CODE.search(text)
    if code:
        return f"{os.strerror(int(code.group(1)))} (errno {code.group(1)}): {text[:200]}"
    named = next((os.strerror(c) for c in _WRITE_ERRNOS if os.strerror(c) in text), None)
    return f"{named}: {text[:200]}" if named else text[:300]


def abstract_like(target: Any) -> Any:
    """jax.ShapeDtypeStruct pytree (with each array's sharding) describing how to restore into `target`.

    Leaves may already be ShapeDtypeStructs (e.g. from jax.eval_shape with shardings attached): kept as they are.
    """

    def leaf(x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        return ocp.utils.to_shape_dtype_struct(x)

    return jax.tree.map(leaf, target)


class Checkpointer:
    """Saves and restores (state pytree, meta dict) per training step.

    run_dir: the run's directory; checkpoints go to run_dir/checkpoints.
    max_to_keep: newest checkpoints kept (None keeps all).
    save_interval: `save` writes only when step % save_interval == 0 (or force=True).
    async_save: write in a background thread (call wait_until_finished before reading or exiting).
    reader: read committed steps only, changing nothing on disk (no tmp directory removed, no folder created), so a
    training job writing the same run directory meanwhile is never disturbed.
    """

    def __init__(self, run_dir: str | Path, max_to_keep: int | None = 3, save_interval: int = 1,
                 async_save: bool = True, reader: bool = False):
        if save_interval < 1:
            raise ValueError(f"save_interval must be >= 1, got {save_interval}")
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        self.directory = Path(run_dir).absolute() / "checkpoints"
        self.save_interval = save_interval
        self._unsealed: int | None = None  # a step saved by this process whose checksums are not written yet
        self._pending: int | None = None  # a step whose save was started and is not known to be committed yet
        _quiet_orbax_errors()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            save_interval_steps=1,  # the interval is applied in save(): orbax would also save the first step
            cleanup_tmp_directories=not reader,
            enable_async_checkpointing=async_save and not reader,
            create=not reader,
            read_only=reader,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=(_STATE, _META))

    def save(self, step: int, state: Any, meta: dict[str, Any], force: bool = False) -> bool:
        """Saves `state` (pytree of jax/numpy arrays, typed PRNG keys allowed) and `meta` (JSON-serialisable dict).

        Returns True if a checkpoint for `step` was started (False when step is off the save interval).
        """
        if not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
        try:
            json.dumps(meta, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"meta must be JSON-serialisable (plain numbers, strings, lists, dicts): {e}") from e
        if not self.due(step, force):
            return False
        self._seal()  # orbax waits for the previous save here anyway
        self._pending = int(step)
        with self._failing_as(int(step)):
            started = self._manager.save(
                int(step),
                args=ocp.args.Composite(**{_STATE: ocp.args.StandardSave(state), _META: ocp.args.JsonSave(meta)}),
                force=force,
            )
        if started and jax.process_index() == 0:
            self._unsealed = int(step)
        return started

    def due(self, step: int, force: bool = False) -> bool:
        """Whether `save(step, ..., force)` writes a checkpoint."""
        return force or step % self.save_interval == 0

    @contextlib.contextmanager
    def _failing_as(self, step: int):
        """Any error of orbax's writing `step` becomes SaveFailed, once its partial files are removed."""
        try:
            yield
        except (OSError, ValueError) as e:  # the file system's, and tensorstore's (ValueError) for the same
            self._pending = self._unsealed = None
            for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
                shutil.rmtree(partial, ignore_errors=True)  # what a full disk needs back
            newest = self._manager.latest_step()
            kept = f"the newest checkpoint is step {newest}" if newest is not None else "there is no checkpoint yet"
            raise SaveFailed(f"checkpoint step {step} could not be written in {self.directory} ({_write_error(e)}); "
                             f"{kept}") from None

    def _seal(self) -> None:
        """Waits for a pending save and writes the checksums of the step it committed."""
        if self._pending is not None:
            with self._failing_as(self._pending):
                self._manager.wait_until_finished()
        self._pending = None
        step, self._unsealed = self._unsealed, None
        if step is not None and self.step_path(step).is_dir():
            write_checksums(self.step_path(step))

    def latest_step(self) -> int | None:
        """Newest completed checkpoint step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """All completed checkpoint steps, ascending."""
        return sorted(self._manager.all_steps())

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restores (state, meta) of `step` (default: the latest).

        target: a pytree with the structure of the saved state whose leaves are arrays or jax.ShapeDtypeStructs;
        each restored leaf takes that leaf's shape, dtype and sharding (so sharded state comes back sharded,
        resharded if the target's sharding differs from the saved one). ChecksumMismatch when a file of the step has
        changed since it was written.
        """
        step = self._existing_step(step)
        verify_checksums(self.step_path(step))
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                **{_STATE: ocp.args.StandardRestore(abstract_like(target)), _META: ocp.args.JsonRestore()}
            ),
        )
        return restored[_STATE], dict(restored[_META])

    def read_meta(self, step: int | None = None) -> dict[str, Any]:
        """The meta dict of `step` (default: the latest) alone, without reading (or checking) the state."""
        step = self._existing_step(step)
        verify_checksums(self.step_path(step), _META)
        restored = self._manager.restore(step, args=ocp.args.Composite(**{_META: ocp.args.JsonRestore()}))
        return dict(restored[_META])

    def _existing_step(self, step: int | None) -> int:
        """`step` (default: the latest) once pending saves are committed; FileNotFoundError if it is not there."""
        self._seal()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        elif step not in self._manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; have {self.all_steps()}")
        return int(step)

    def step_path(self, step: int) -> Path:
        return self.directory / str(step)

    def restore_newest(self, target: Any) -> tuple[int, Any, dict[str, Any], list[str]]:
        """Restores the newest checkpoint that reads back whole, trying older ones when it does not.

        Returns (step, state, meta, skipped): `skipped` has one "path: error" line per newer checkpoint that failed.
        FileNotFoundError when there is no checkpoint; CheckpointError when none reads back.
        """
        return self._newest(lambda step: self.restore(target, step))

    def read_newest_meta(self) -> tuple[int, dict[str, Any], list[str]]:
        """(step, meta, skipped) of the newest checkpoint whose meta reads back; errors as restore_newest."""
        step, _, meta, skipped = self._newest(lambda step: (None, self.read_meta(step)))
        return step, meta, skipped

    def _newest(self, read) -> tuple:
        self._seal()
        skipped = []
        for step in reversed(self.all_steps()):
            try:
                state, meta = read(step)
            except Exception as e:  # a damaged checkpoint fails in orbax's, tensorstore's or json's own ways
                skipped.append(f"{self.step_path(step)}: {_reason(e)}")
                continue
            return step, state, meta, skipped
        if not skipped:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        raise CheckpointError(f"no checkpoint in {self.directory} reads back: " + "; ".join(skipped))

    def set_aside(self, step: int) -> Path:
        """Moves an unreadable checkpoint out of the run's steps (to ../damaged_checkpoints/, kept for a look), so
        the run can write that step again; returns where it went."""
        self._seal()
        folder = self.directory.parent / DAMAGED
        folder.mkdir(exist_ok=True)
        dst = folder / str(step)
        n = 1
        while dst.exists():
            dst, n = folder / f"{step}.{n}", n + 1
        os.replace(self.step_path(step), dst)
        self.reload()
        return dst

    def reload(self) -> None:
        """Lists the steps on disk again (after another process moved some)."""
        self._manager.reload()

    def wait_until_finished(self) -> None:
        """Blocks until any background save has been committed (and its checksums written)."""
        self._seal()

    def close(self) -> None:
        """Waits for pending saves (and writes their checksums) and releases the manager's resources."""
        try:
            self._seal()
        finally:
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if kind is None:
            self.close()
            return
        # leaving on an error: the pending save is still committed, but the error in flight is the one to report
        with contextlib.suppress(Exception):
            self.close()
