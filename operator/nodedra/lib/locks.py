"""A lock on a file that excludes other processes and our own other threads alike.

An open-file-description (OFD) fcntl lock: it belongs to the open file, not to the process,
so two threads of one process exclude each other as two processes do; and it conflicts with
the fcntl locks Go programs take (the kubeletplugin helper locks its serialize.lock so),
which flock() would not.
"""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path
from types import TracebackType

# struct flock on Linux: l_type, l_whence (short), l_start, l_len (off_t), l_pid (pid_t).
_FLOCK = "hhqqi4x"


class FileLock:
    """A write lock on the whole of ``path`` (created if missing, mode 0600)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock (waiting for it, unless not ``blocking``); whether we have it."""
        if self._fd is not None:
            raise RuntimeError(f"lock {self.path} is already held here")
        self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        whole_file = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if blocking else fcntl.F_OFD_SETLK, whole_file)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        """Give the lock back (closing the description releases it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    @property
    def held(self) -> bool:
        """Whether we hold the lock."""
        return self._fd is not None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def held_elsewhere(path: Path) -> bool:
    """Whether another open file description holds a lock on ``path``, which must exist.

    Unlike :meth:`FileLock.acquire`, this creates nothing: it is for looking at what may be
    the lock of a process that is gone (no lock, no holder) without leaving a file behind.
    """
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        whole_file = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, whole_file)
        return bool(struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK)
    finally:
        os.close(fd)
