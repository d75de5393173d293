"""SIGINT and SIGTERM as an exception, so a job stops where it can still finish a pending checkpoint and say where
it stopped in one line, instead of dying mid-write (SIGTERM's default) or with a traceback (SIGINT's).

Within `raising()`, the first of the two signals raises Interrupted in the main thread; a second one, while the job
cleans up, does what it would have done without us (a checkpoint cut short that way is never listed as a step).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


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


@contextlib.contextmanager
def raising() -> Iterator[None]:
    """The first SIGINT or SIGTERM raises Interrupted; the handlers before are restored on exit. Outside the main
    thread (signals cannot be handled there) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}

    def restore() -> None:
        for s, was in before.items():
            signal.signal(s, signal.SIG_DFL if was is None else was)  # None: set outside Python, taken as default

    def handler(signum, frame):
        restore()
        raise Interrupted(signum)

    for s in SIGNALS:
        signal.signal(s, handler)
    try:
        yield
    finally:
        restore()
