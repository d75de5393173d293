"""SIGINT and SIGTERM as an exception, so a job stops where it can still finish a pending checkpoint and say where
it stopped in one line, instead of dying mid-write (SIGTERM's default) or with a traceback (SIGINT's).

Within `raising()`, the first of the two signals raises Interrupted in the main thread; a second one, while the job
cleans up, does what it would have done without us (a checkpoint cut short that way is never listed as a step).
Python drops an exception raised where nothing can receive it (a garbage-collection callback such as jax's, a
`__del__`) with an "Exception ignored" traceback, and the job would run on to its end with status 0: such a signal is
kept, not printed, and raised again at the next `check()` (each step of a stage) or where `raising()` ends.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_pending: list[Interrupted] = []  # the signal raising() caught, until its context ends


class Interrupted(KeyboardInterrupt):
    """The job got SIGINT or SIGTERM; `where` says where it stopped and how to go on (" at step 5; rerun to
    resume"). A KeyboardInterrupt, so no `except Exception` on its way swallows it."""

    def __init__(self, signum: int, where: str = ""):
        super().__init__(signum, where)
        self.signum, self.where = signum, where

    @property
    def status(self) -> int:
        """The shell's status for a process ended by the signal."""
        return 128 + self.signum

    def at(self, where: str) -> Interrupted:
        """The same signal, saying where."""
        return Interrupted(self.signum, where)

    def __str__(self) -> str:
        return f"interrupted{self.where}"


def _raising() -> Iterator[None]:
    """The first SIGINT or SIGTERM raises Interrupted; the handlers before are restored on exit. Outside the main
    thread (signals cannot be handled there) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}
    hook = sys.unraisablehook

    def restore() -> None:
        for s, was in before.items():
            signal.signal(s, signal.SIG_DFL if was is None else was)  # None: set outside Python, taken as default

    def handler(signum, frame):
        restore()
        _pending.append(Interrupted(signum))
        raise _pending[-1]

    def unraisable(info) -> None:
        if not isinstance(info.exc_value, Interrupted):  # ours is kept in _pending and raised by check()
            hook(info)

    for s in SIGNALS:
        signal.signal(s, handler)
    sys.unraisablehook = unraisable
    try:
        yield
        check()
    finally:
        restore()
        sys.unraisablehook = hook
        _pending.clear()


# applied here, not as a decorator, since mutmut (tools/mutation.sh) does not mutate a decorated function
raising = contextlib.contextmanager(_raising)


def check() -> None:
    """Raises the signal raising() caught where it could not be raised (see the module doc); nothing otherwise."""
    if _pending:
        raise _pending.pop()
