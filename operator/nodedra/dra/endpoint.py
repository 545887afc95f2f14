"""Where the plugin's sockets live, who owns them, and the lock shared across instances.

The kubelet finds a plugin by its registration socket in the registry directory and talks
DRA to the socket that registration names. During a rolling update two instances of the
driver run side by side: each names its sockets after its own pod UID, so neither can
unlink the other's (which would make the kubelet deregister the driver), and both
serialize kubelet requests through a lock file they share.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nodedra.lib.locks import FileLock

KUBELET_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
KUBELET_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
SERIALIZE_LOCK = "serialize.lock"
MAX_SOCKET_PATH = 107
"""Bytes in a Unix socket's path (sun_path holds 108, with the terminating NUL)."""


@dataclass(frozen=True)
class SocketPaths:
    """The files of one plugin instance."""

    registration: Path
    dra: Path
    lock: Path | None
    """The lock file shared with other instances; None when only one instance runs."""


def default_plugin_data_dir(driver: str) -> Path:
    """The directory of ``driver``'s DRA socket when none is configured."""
    return KUBELET_PLUGINS_DIR / driver


def socket_paths(
    driver: str,
    registrar_dir: Path | None,
    plugin_data_dir: Path,
    rolling_update_uid: str | None,
) -> SocketPaths:
    """The sockets of ``driver``: per instance when ``rolling_update_uid`` is given."""
    registry = registrar_dir or KUBELET_REGISTRY_DIR
    data = plugin_data_dir
    if rolling_update_uid:
        return SocketPaths(
            registration=registry / f"{driver}-{rolling_update_uid}-reg.sock",
            dra=data / f"dra-{rolling_update_uid}.sock",
            lock=data / SERIALIZE_LOCK,
        )
    return SocketPaths(registry / f"{driver}-reg.sock", data / "dra.sock", None)


def private_socket_path(path: Path) -> Path:
    """A name to bind ``path``'s socket at before it is moved into place.

    The leading dot keeps the kubelet's plugin watcher from looking at it; the name is
    short because a socket's path may not be longer than ``MAX_SOCKET_PATH``.
    """
    return path.with_name(f".nodedra-{secrets.token_hex(4)}.sock")


def check_socket_path(path: Path) -> None:
    """Refuse a socket path the kernel cannot bind, with a message that says what to do."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(
            f"socket path {path} is longer than the {MAX_SOCKET_PATH} bytes a Unix socket "
            "may have: choose shorter registry or plugin data directories"
        )


@dataclass(frozen=True)
class SocketFile:
    """A socket we bound, identified by its inode so we never unlink someone else's."""

    path: Path
    device: int
    inode: int

    @classmethod
    def move_into_place(cls, bound: Path, path: Path) -> SocketFile:
        """Make the socket bound at ``bound`` root's only and move it to ``path``.

        gRPC unlinks the path it bound when it shuts down, whatever is at that path by
        then; binding at a private name and renaming leaves it nothing to unlink but that
        name, so whether ``path`` goes is decided by :meth:`remove` alone. The rename is
        atomic: the kubelet sees a complete, usable socket or none.
        """
        os.chmod(bound, 0o600)
        os.rename(bound, path)
        info = os.stat(path)
        return cls(path, info.st_dev, info.st_ino)

    def is_ours(self) -> bool:
        """Whether ``path`` still is the socket we bound."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (info.st_dev, info.st_ino) == (self.device, self.inode)

    def remove(self) -> None:
        """Unlink the socket if it is still ours; another instance's stays."""
        if self.is_ours():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


class InstanceLock:
    """The lock shared by the driver's instances, held while any request of ours runs.

    It excludes other instances (processes, or other plugins in this one), and it
    conflicts with the lock that instances built on the Go kubeletplugin helper take on the
    same file. Our own requests share it: the first to come takes the file lock, the others
    join, the last to go gives it back; among themselves the owner's lock orders them,
    which lets requests that come together be committed together. Without a path (one
    instance only) it is no lock at all.
    """

    def __init__(self, path: Path | None) -> None:
        self._file = FileLock(path) if path is not None else None
        self._users = 0
        self._taking = False
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock (with our other requests) for the duration of the block."""
        if self._file is None:
            yield
            return
        self._join()
        try:
            yield
        finally:
            with self._changed:
                self._users -= 1
                if self._users == 0:
                    self._file.release()

    def _join(self) -> None:
        assert self._file is not None
        with self._changed:
            while self._taking:  # another of ours is waiting for the other instance
                self._changed.wait()
            if self._users > 0:
                self._users += 1
                return
            self._taking = True
        try:
            self._file.acquire()
        finally:
            with self._changed:
                self._taking = False
                self._users += 1 if self._file.held else 0
                self._changed.notify_all()
