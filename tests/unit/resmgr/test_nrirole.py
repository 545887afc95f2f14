"""The NRI role: one instance of a node connects to the runtime, the other stands by."""

from __future__ import annotations

import threading
from pathlib import Path

from nodedra.lib.locks import FileLock
from nodedra.resmgr.nrirole import NRI_ROLE_LOCK, NRIRole


class Connection:
    """What the role drives: the NRI plugin's start and stop, the pinner's connection."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped = False
        self.connected = False
        self.detail = "not connected yet"

    def start(self) -> None:
        self.started.set()

    def stop(self) -> None:
        self.stopped = True


def role(tmp_path: Path, connection: Connection) -> NRIRole:
    return NRIRole(connection, connection, tmp_path)  # type: ignore[arg-type]


def test_the_instance_without_the_role_stands_by_and_takes_over_once_it_is_free(
    tmp_path: Path,
) -> None:
    other = FileLock(tmp_path / NRI_ROLE_LOCK)
    assert other.acquire(blocking=False)
    connection = Connection()
    standby = role(tmp_path, connection)
    standby.start()
    assert (standby.standing_by, standby.ready()) == (True, True), "the other one pins"
    assert standby.detail().startswith("standing by: another instance")
    assert not connection.started.is_set()
    other.release()  # the other instance stopped
    assert connection.started.wait(30), "no take-over"
    assert (standby.standing_by, standby.ready(), standby.detail()) == (
        False,
        False,
        "not connected yet",
    ), "connecting, not connected yet"
    standby.stop()
    assert connection.stopped
    assert other.acquire(blocking=False), "the role is given back on stopping"
    other.release()


def test_stopping_ends_the_wait_for_the_role(tmp_path: Path) -> None:
    other = FileLock(tmp_path / NRI_ROLE_LOCK)
    assert other.acquire(blocking=False)
    connection = Connection()
    standby = role(tmp_path, connection)
    standby.start()
    standby.stop()
    assert not connection.started.is_set()
    assert not connection.stopped, "never connected: nothing to stop"
    assert other.held
    other.release()
