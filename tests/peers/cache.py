"""The cache the test peers and images are built into, shared by every process that builds.

Building a peer or an image takes minutes, so what is built is kept outside the repository,
under ``$XDG_CACHE_HOME/nodedra/peers/`` (default ``~/.cache``), one entry per recipe and
version of its sources, and every builder here (Go peers, nodedra's images, the VM's image,
busybox) uses it the same way: an entry is built under a lock of its own, so parallel test runs
build it once, and where its progress goes is a :class:`Log`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol


class PeerBuildError(RuntimeError):
    """The peers could neither be found nor built; the message says why and what to do."""


class Log(Protocol):
    """Where build progress goes: any text stream."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nodedra" / "peers"


@contextlib.contextmanager
def locked(path: Path, log: Log | None = None, what: str = "") -> Iterator[None]:
    """Serialise builds between processes (e.g. parallel test runs, or a build started in
    the background); says on ``log`` that it waits when another process holds the lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log is not None:
                print(f"[peers] waiting for another process building {what}", file=log, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prune_cache_entries(pattern: str, keep: Path, count: int, log: Log) -> None:
    """Keep ``keep`` and the newest others of the cache entries matching ``pattern``, ``count``
    in all: each change of a recipe makes a new entry of some hundreds of MB."""
    entries = sorted(
        (p for p in cache_root().glob(pattern) if p.is_dir() and p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in entries[count - 1 :]:
        print(f"[image] removing old cache entry {old}", file=log, flush=True)
        shutil.rmtree(old, ignore_errors=True)
