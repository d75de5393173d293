"""One writer at a time for a run directory or an output file.

The lock is a file naming its holder (pid, host, and the process's start time from /proc/<pid>/stat), locked with
flock(2) while the holder runs and removed when it ends: the kernel drops the flock when the holder dies, however it
dies, so a second writer is refused while the first is alive (`Locked`, naming its pid) and otherwise takes over the
file a dead holder left, saying whose it was. The recorded holder is checked too, since a free flock does not prove
it dead (a file system without flock, some network mounts, another host): a process of this host with that pid and
start time is alive (a pid reused by a later process is not it), and a holder on another host is taken as alive.
A lock file of an earlier version holds the pid alone: its holder counts as alive while any process has that pid.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
from pathlib import Path
from typing import NamedTuple


class Locked(OSError):
    """Another live process holds the lock; the message names it and the lock file."""


class Holder(NamedTuple):
    """Who a lock file names: a pid, and since this version its host and start time (None in an older file)."""

    pid: int
    host: str | None = None
    start: int | None = None

    def __str__(self) -> str:
        return f"process {self.pid}" + (f" on host {self.host}" if self.host not in (None, HOST) else "")


HOST = socket.gethostname()


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/<pid>/stat field 22), None when no such process (or
    no /proc): with the pid, it names one process, never a later one given the same pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])  # fields after the name, which may hold spaces


def me() -> Holder:
    return Holder(os.getpid(), HOST, start_time(os.getpid()))


def _recorded(fd: int) -> Holder | None:
    words = os.pread(fd, 512, 0).decode("ascii", errors="replace").split()
    if not words or not words[0].isdigit():
        return None
    start = int(words[2]) if len(words) > 2 and words[2].isdigit() else None
    return Holder(int(words[0]), words[1] if len(words) > 1 else None, start)


def _alive(holder: Holder) -> bool:
    if holder.host is not None and holder.host != HOST:
        return True  # its processes cannot be seen from here: never taken over
    if holder.start is not None and os.path.isdir("/proc"):
        return start_time(holder.pid) == holder.start
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class PidLock:
    """`with PidLock(path, what):` holds the lock at `path` for `what` (words for the refusal: "run directory X")."""

    def __init__(self, path: str | Path, what: str):
        self.path, self.what = Path(path), what
        self._fd: int | None = None
        self._made: list[Path] = []  # folders made for the lock file, leaf first: removed with it when left empty

    def __enter__(self) -> PidLock:
        self._made = []
        for folder in (self.path.parent, *self.path.parent.parents):
            if folder.exists():
                break
            self._made.append(folder)
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                    return self  # a folder this process cannot write in, it writes nothing in: nothing to guard
                raise
            try:
                holder = self._take(fd)
            except BaseException:
                os.close(fd)
                raise
            if self._still_there(fd):
                break
            os.close(fd)  # the holder removed the file while we waited for it: lock the one at the path now
        if holder is not None:
            print(f"spatial-jax: took over the lock {self.path} of {holder}, which is no longer running",
                  file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        mine = me()
        os.pwrite(fd, f"{mine.pid} {mine.host} {mine.start if mine.start is not None else '-'}\n".encode(), 0)
        self._fd = fd
        return self

    def _take(self, fd: int) -> Holder | None:
        """Locks `fd`; returns the dead holder it names (None when it was free or names this process), or raises
        Locked."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            busy = False
        except BlockingIOError:
            busy = True
        except OSError:  # no flock on this file system: the recorded holder decides
            busy = False
        holder = _recorded(fd)
        if not busy and holder is not None and holder.pid == os.getpid() and holder.host in (None, HOST):
            return None
        if busy or (holder is not None and _alive(holder)):
            who = str(holder) if holder is not None else "another process"
            if not busy and holder is not None and holder.start is None and holder.host is None:
                who += " (an older lock file, naming no start time: if that process is no job, remove the file)"
            raise Locked(f"{self.what} is in use by {who} (lock file {self.path}): wait for it to end, or stop it")
        return holder

    def _still_there(self, fd: int) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        own = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # removed while still held: whoever opened it meanwhile locks anew
            os.close(self._fd)
            self._fd = None
        for folder in self._made:  # a job refused at its start leaves no run directory behind
            try:
                folder.rmdir()
            except OSError:  # not empty: the job's own files
                break
