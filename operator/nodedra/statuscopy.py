"""What ``/status`` serves: a copy of the CPU map, taken after the books change.

The map is read under the resource manager's lock, which kubelet requests and runtime
events wait for. If each reader of ``/status`` took it, a few people (or one script in a
loop) would make the kubelet wait: sixteen readers holding it a few milliseconds each once
put the kubelet's lock waits in the tens of milliseconds. So readers never take it (they
still cost the CPU it takes to answer them: ``docs/cpu-map.md``). One
thread keeps a copy: it wakes when anyone has given the lock back since its last copy
(every change holds the lock), takes the lock only at a moment nobody holds it or waits for
it, copies what it needs, and builds the JSON outside it; it does so at most every
``INTERVAL`` seconds, however much happens. A reader gets the last copy, which says when it
was taken.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from nodedra.status import HoldingsSource, cpu_map
from nodedra.topology import Topology

log = logging.getLogger(__name__)

INTERVAL = 0.5
"""Seconds between two copies at least: what a person reading the map may find it behind."""
RETRY = 0.005
"""Seconds between looks for a moment the lock is free, while it is busy."""


class ManagerLike(HoldingsSource, Protocol):
    """What the copy watches (the resource manager)."""

    holds: int
    released: threading.Event


class StatusCopy:
    """The last CPU map taken, as the JSON ``/status`` answers; refreshed by a thread."""

    def __init__(
        self,
        manager: ManagerLike,
        topology: Topology,
        node: str,
        extras: Callable[[], Mapping[str, Any]] = dict,
    ) -> None:
        self._manager = manager
        self._topology = topology
        self._node = node
        self._extras = extras
        """More of the node's state, kept by others (the quiet CPUs), added to each copy."""
        self._body: bytes | None = None
        self._copied = -1
        """The manager's ``holds`` when the copy was taken (its own hold included)."""
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-copy", daemon=True)

    def body(self) -> bytes | None:
        """The JSON of the last copy; None before the first. Takes no lock."""
        return self._body

    def start(self) -> None:
        """Take copies from now on (once the manager has started: its books are read)."""
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._manager.released.set()  # wake it if it waits for a change
        if self._thread.is_alive():
            self._thread.join()

    def invalidate(self) -> None:
        """What ``extras`` says changed: take a new copy soon."""
        self._copied = -1
        self._manager.released.set()

    def refresh(self) -> bool:
        """Take a copy now if the lock is free and something held it since; whether taken."""
        holds = self._manager.holds
        if holds == self._copied:
            return True  # nothing changed: the copy is current
        data = cpu_map(self._manager, self._topology, self._node)
        if data is None:
            return False
        # The copy's own hold counts: it is current until someone else takes the lock.
        self._copied = holds + 1
        data.update(self._extras())
        data["as_of"] = datetime.now(UTC).isoformat(timespec="milliseconds")
        self._body = json.dumps(data, sort_keys=True).encode()
        return True

    def _run(self) -> None:
        released = self._manager.released
        while not self._stopping.is_set():
            released.clear()  # before looking: a release after this wakes the wait below
            if self._manager.holds == self._copied:
                released.wait()
                continue
            try:
                taken = self.refresh()
            except Exception:  # a bug: the last copy stays served, and the log says why
                log.exception("copying the CPU map for /status failed")
                taken = True
            self._stopping.wait(INTERVAL if taken else RETRY)
