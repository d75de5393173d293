"""One writer at a time for a run directory or an output file.

The lock is a file holding its holder's pid, locked with flock(2) while the holder runs and removed when it ends: the
kernel drops the flock when the holder dies, however it dies, so a second writer is refused only while the first is
alive (`Locked`, naming its pid) and otherwise takes over the file a dead holder left, saying whose it was. Where the
file system has no flock (some network mounts), the pid alone decides: a live process other than this one holds it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from pathlib import Path


class Locked(OSError):
    """Another live process holds the lock; the message names it and the lock file."""


def _recorded_pid(fd: int) -> int | None:
    raw = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    return int(raw) if raw.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
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
            print(f"spatial-jax: took over the lock {self.path} of process {holder}, which is no longer running",
                  file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def _take(self, fd: int) -> int | None:
        """Locks `fd`; returns the pid a dead holder left in it (None when it was free), or raises Locked."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return _recorded_pid(fd)
        except BlockingIOError:
            busy = True
        except OSError:  # no flock on this file system: the recorded pid decides
            busy = False
        holder = _recorded_pid(fd)
        if busy or (holder is not None and holder != os.getpid() and _alive(holder)):
            who = f"process {holder}" if holder is not None else "another process"
            raise Locked(f"{self.what} is in use by {who} (lock file {self.path}): wait for it to end, or stop it")
        return holder if holder != os.getpid() else None

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
