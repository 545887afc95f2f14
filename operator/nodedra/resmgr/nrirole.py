"""Which instance of nodedra on a node talks to the container runtime (rolling updates).

Two instances connected at once would both set the cpuset of every container, which the
runtime refuses. So the instance that holds the role lock (``nri.lock`` in the plugin data
directory) connects, and the other stands by until the lock is free: during a rolling
update the old one pins until it stops, and the new one takes over then.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from nodedra.lib.locks import FileLock
from nodedra.nri import NRIPlugin

from .containers import ContainerPinner

log = logging.getLogger(__name__)

NRI_ROLE_LOCK = "nri.lock"
"""Held by the one instance of a node that is connected to the runtime (rolling updates)."""


class NRIRole:
    """Connects ``nri`` to the runtime once this instance holds the role lock."""

    def __init__(self, nri: NRIPlugin, containers: ContainerPinner, data_dir: Path) -> None:
        self._nri = nri
        self._containers = containers
        self._lock = FileLock(data_dir / NRI_ROLE_LOCK)
        self._waiter: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def standing_by(self) -> bool:
        """Whether another instance pins the node's containers (this one does not connect)."""
        return not self._lock.held

    def ready(self) -> bool:
        """Whether containers are pinned now: connected, or another instance is."""
        return self._containers.connected or self.standing_by

    def detail(self) -> str:
        """The runtime connection in words."""
        if self.standing_by:
            return "standing by: another instance of nodedra on this node pins containers"
        return self._containers.detail

    def start(self) -> None:
        """Connect to the runtime, or stand by while another instance of the node is."""
        if self._lock.acquire(blocking=False):
            self._nri.start()
            return
        log.info("another instance of nodedra pins this node's containers: standing by")
        self._waiter = threading.Thread(target=self._take_over, name="nri-standby")
        self._waiter.daemon = True
        self._waiter.start()

    def _take_over(self) -> None:
        while not self._stopping.wait(0.5):
            if self._lock.acquire(blocking=False):
                log.info("the other instance stopped pinning: taking over the runtime connection")
                self._nri.start()
                return

    def stop(self) -> None:
        """Stop standing by, or disconnect and give the role to the other instance."""
        self._stopping.set()
        if self._waiter is not None:
            self._waiter.join()
        if self._lock.held:
            self._nri.stop()
        self._lock.release()
