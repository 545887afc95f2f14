"""The NRI plugin: registered with the container runtime, answering its events, pushing updates.

The plugin owns the connection and the protocol and none of the decisions: which cpuset a
container gets is its owner's (the resource manager). It connects to the runtime's NRI
socket, registers, and serves the events pinning needs (nodedra.nri.events). Changes the
owner makes outside events (a claim prepared or unprepared) are sent by a thread of their
own with ``UpdateContainers``, never while an event is being handled: the runtime holds its
NRI lock while it calls a plugin, so it could not act on them then.

A closed connection (the runtime restarted, or dropped us) is reconnected with backoff, and
the next Synchronize repairs whatever was created meanwhile.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from nodedra.grpc_gen import nri_v1alpha1_pb2 as pb

from .events import EventObserver, Events, RuntimeOwner
from .messages import Update, container_updates
from .ttrpc import Connection, ConnectionClosedError, RPCError

log = logging.getLogger(__name__)

RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_SOCKET = Path("/var/run/nri/nri.sock")
PLUGIN_NAME = "nodedra"
NRI_VERSION = "v0.12.0"
"""The NRI version we speak (what we tell the runtime; older runtimes ignore it)."""
PINNING_MODES = ("required", "best-effort", "off")
"""How containers are pinned. required: claims are refused while the runtime is not
connected; best-effort: served anyway, containers are repaired once it connects; off: none."""
CALL_TIMEOUT = 5.0
"""Seconds we wait for the runtime to answer one of our calls."""
HANDLER_WAIT_WARNING = 10.0
"""Seconds between two warnings that an ended connection's handler holds up the next."""


@dataclass
class PluginOptions:
    """How the plugin reaches the runtime."""

    socket_path: Path = DEFAULT_SOCKET
    index: str = "50"
    """Two digits: the runtime calls plugins in ascending order of their index."""
    name: str = PLUGIN_NAME
    min_backoff: float = 0.5
    max_backoff: float = 10.0
    observer: EventObserver | None = None


def check_index(index: str) -> str:
    """``index`` if it is what NRI takes (exactly two digits); ValueError otherwise."""
    if len(index) != 2 or not index.isascii() or not index.isdigit():
        raise ValueError(f"NRI plugin index {index!r} must be two digits, 00 to 99")
    return index


class NRIPlugin:
    """nodedra's NRI plugin: a connection kept up to the runtime, and the updates it sends."""

    def __init__(self, owner: RuntimeOwner, options: PluginOptions) -> None:
        check_index(options.index)
        self._owner = owner
        self._options = options
        self._cond = threading.Condition()
        self._stopping = False
        self._connection: Connection | None = None
        self._synchronized = False
        self._updates_wanted = False
        self._events = Events(
            owner, self._synchronized_now, options.observer, on_updates_due=self.request_updates
        )
        self._threads: list[threading.Thread] = []

    @property
    def runtime(self) -> str:
        """The runtime's name and version, as it told us in Configure."""
        return self._events.runtime

    # Lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background (and keep reconnecting), and start the update sender."""
        with self._cond:
            if self._threads:
                raise RuntimeError("NRI plugin already started")
            self._stopping = False
            self._threads = [
                threading.Thread(target=self._run, name="nri-connection", daemon=True),
                threading.Thread(target=self._send_updates, name="nri-updates", daemon=True),
            ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Close the connection and stop; the runtime then goes on without us."""
        with self._cond:
            self._stopping = True
            connection, threads, self._threads = self._connection, self._threads, []
            self._cond.notify_all()
        if connection is not None:
            connection.close("nodedra is stopping")
        for thread in threads:
            thread.join()

    @property
    def synchronized(self) -> bool:
        """Whether we are connected and the runtime's Synchronize is done."""
        with self._cond:
            return self._synchronized

    def wait_synchronized(self, timeout: float) -> bool:
        """Wait until connected and synchronized; whether that happened in ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self._synchronized or self._stopping, timeout)

    def request_updates(self) -> None:
        """Ask the runtime for the owner's pending updates soon (never from an event)."""
        with self._cond:
            self._updates_wanted = True
            self._cond.notify_all()

    # The connection ----------------------------------------------------------------------

    def _run(self) -> None:
        backoff = self._options.min_backoff
        reported: str | None = None
        while not self._stopped():
            try:
                connection = self._connect()
            except OSError as err:
                why = f"cannot connect to {self._options.socket_path}: {err.strerror or err}"
                if why != reported:
                    log.warning("NRI: %s; retrying", why)
                    self._owner.connection_changed(False, why)
                    reported = why
            else:
                reported = None
                connection.wait_closed()
                self._wait_handler(connection)
                was_synchronized = self._closed(connection)
                why = connection.close_reason or "closed"
                log.warning("NRI: the connection to the runtime ended: %s", why)
                self._owner.connection_changed(False, why)
                if was_synchronized:
                    backoff = self._options.min_backoff
            with self._cond:
                self._cond.wait_for(lambda: self._stopping, backoff)
            backoff = min(backoff * 2, self._options.max_backoff)

    def _connect(self) -> Connection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self._options.socket_path))
        except OSError:
            sock.close()
            raise
        connection = Connection(
            sock,
            self._events.handle,
            name="nri",
            on_answered=self._events.answered,
            inline=self._owner.idle,
        )
        with self._cond:
            if self._stopping:
                sock.close()
                raise OSError("stopping")
            self._connection = connection
            self._synchronized = False
            self._events.reset()
        connection.start()
        request = pb.RegisterPluginRequest(
            plugin_name=self._options.name,
            plugin_idx=self._options.index,
            nri_version=NRI_VERSION,
        )
        try:
            connection.call(
                RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(), CALL_TIMEOUT
            )
        except (RPCError, ConnectionClosedError, TimeoutError) as err:
            connection.close(f"registration failed: {err}")
            log.error("NRI: registering with the runtime failed: %s", err)
        else:
            log.info(
                "NRI: registered as %s-%s on %s",
                self._options.index,
                self._options.name,
                self._options.socket_path,
            )
        return connection

    def _wait_handler(self, connection: Connection) -> None:
        """Wait until the ended connection's handler has returned.

        It may still be deciding about a container (waiting for the resource manager's
        lock) when the connection ends: what it records then, the runtime never got. A
        new connection's Synchronize starts the books of containers again, so the old
        handler must be done before it: two handlers never overlap.
        """
        while not connection.join(HANDLER_WAIT_WARNING):
            log.warning(
                "NRI: the handler of the ended connection is still busy; reconnecting after it"
            )

    def _closed(self, connection: Connection) -> bool:
        """Forget ``connection``; whether it had been synchronized."""
        with self._cond:
            was = self._synchronized
            if self._connection is connection:
                self._connection = None
                self._synchronized = False
            self._cond.notify_all()
            return was

    def _stopped(self) -> bool:
        with self._cond:
            return self._stopping

    # Unsolicited updates -------------------------------------------------------------------

    def _send_updates(self) -> None:
        backoff = self._options.min_backoff
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._stopping or (self._updates_wanted and self._synchronized)
                )
                if self._stopping:
                    return
                self._updates_wanted = False
                connection = self._connection
            # The runtime could not act on them during an event.
            updates = self._events.when_idle(self._owner.pending_updates)
            if not updates or connection is None:
                continue
            failed = self._push(connection, updates)
            if self._owner.updates_sent(updates, failed):
                with self._cond:  # an event decided some of them anew meanwhile
                    self._updates_wanted = True
            if failed:  # try those again later
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, backoff)
                    self._updates_wanted = True
                backoff = min(backoff * 2, self._options.max_backoff)
            else:
                backoff = self._options.min_backoff

    def _push(self, connection: Connection, updates: Sequence[Update]) -> list[str]:
        """Send ``updates``; the IDs of the containers whose update did not happen.

        A runtime fails the whole call when one update fails: then each is sent on its
        own, so that one container the runtime cannot update holds up no other.
        """
        failed = self._update(connection, updates)
        if failed is not None:
            return failed
        if len(updates) == 1:
            return [updates[0].container_id]
        return [u.container_id for u in updates if self._update(connection, [u]) != []]

    def _update(self, connection: Connection, updates: Sequence[Update]) -> list[str] | None:
        """One UpdateContainers call: the containers it says failed; None if the call failed."""
        request = pb.UpdateContainersRequest(update=container_updates(updates))
        try:
            answer = connection.call(
                RUNTIME_SERVICE, "UpdateContainers", request.SerializeToString(), CALL_TIMEOUT
            )
            response = pb.UpdateContainersResponse.FromString(answer)
        except (RPCError, ConnectionClosedError, TimeoutError, DecodeError) as err:
            log.warning(
                "NRI: updating %s failed: %s", ", ".join(u.container_id for u in updates), err
            )
            return None
        return [u.container_id for u in response.failed]

    def _synchronized_now(self) -> None:
        """The runtime's Synchronize is answered: events and updates may flow."""
        with self._cond:
            self._synchronized = True
            self._cond.notify_all()
        self._owner.connection_changed(True, f"synchronized with {self.runtime or 'the runtime'}")
