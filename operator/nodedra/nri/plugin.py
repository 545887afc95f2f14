"""The NRI plugin: registered with the container runtime, answering its events, pushing updates.

The plugin owns the connection and the protocol and none of the decisions: which cpuset a
container gets is its owner's (the resource manager). It connects to the runtime's NRI
socket, registers, subscribes to the container and pod events pinning needs, collects a
Synchronize that may come in chunks and answers its last chunk with the updates that bring
every running container to what it should have, then answers each event with what the owner
decides. Changes the owner makes outside events (a claim prepared or unprepared) are sent
by a thread of their own with ``UpdateContainers``, never while an event is being handled:
the runtime holds its NRI lock while it calls a plugin, so it could not act on them then.

A closed connection (the runtime restarted, or dropped us) is reconnected with backoff, and
the next Synchronize repairs whatever was created meanwhile.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from google.protobuf.message import DecodeError, Message

from nodedra.grpc_gen import nri_v1alpha1_pb2 as pb

from .messages import (
    Container,
    CPUSet,
    Pod,
    Update,
    container_of,
    container_updates,
    pod_of,
    resources,
)
from .ttrpc import (
    INVALID_ARGUMENT,
    UNIMPLEMENTED,
    Call,
    Connection,
    ConnectionClosedError,
    RPCError,
)

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_SOCKET = Path("/var/run/nri/nri.sock")
PLUGIN_NAME = "nodedra"
NRI_VERSION = "v0.12.0"
"""The NRI version we speak (what we tell the runtime; older runtimes ignore it)."""

EVENTS = (
    pb.RUN_POD_SANDBOX,
    pb.STOP_POD_SANDBOX,
    pb.REMOVE_POD_SANDBOX,
    pb.CREATE_CONTAINER,
    pb.UPDATE_CONTAINER,
    pb.STOP_CONTAINER,
    pb.REMOVE_CONTAINER,
)
"""What we subscribe to: events every runtime from containerd 2.0 (NRI v0.8) on knows."""
EVENT_MASK = sum(1 << (event - 1) for event in EVENTS)
PINNING_MODES = ("required", "best-effort", "off")
"""How containers are pinned. required: claims are refused while the runtime is not
connected; best-effort: served anyway, containers are repaired once it connects; off: none."""
CALL_TIMEOUT = 5.0
"""Seconds we wait for the runtime to answer one of our calls."""


class RuntimeOwner(Protocol):
    """Who decides what each container gets (the resource manager); called on one thread."""

    def synchronize(self, pods: Sequence[Pod], containers: Sequence[Container]) -> list[Update]:
        """Every pod and container the runtime has: the updates that make them right."""
        ...

    def create_container(
        self, pod: Pod, container: Container
    ) -> tuple[CPUSet | None, list[Update]]:
        """The cpuset of a container being created (None: leave it) and others' updates."""
        ...

    def update_container(self, pod: Pod, container: Container) -> list[Update]:
        """The kubelet changes a container's resources: what to (re)assert."""
        ...

    def container_stopped(self, pod: Pod, container: Container) -> list[Update]:
        """A container stopped: what other containers may get now."""
        ...

    def container_removed(self, pod: Pod, container: Container) -> None:
        """A container is gone."""
        ...

    def pod_seen(self, pod: Pod) -> None:
        """A pod sandbox runs."""
        ...

    def pod_removed(self, pod: Pod) -> None:
        """A pod sandbox is gone."""
        ...

    def pending_updates(self) -> list[Update]:
        """What the runtime should be told now, outside any event."""
        ...

    def updates_sent(self, sent: Sequence[Update], failed: Sequence[str]) -> None:
        """``sent`` reached the runtime, except the containers ``failed`` names."""
        ...

    def connection_changed(self, connected: bool, detail: str) -> None:
        """The runtime connection came (synchronized) or went."""
        ...


class EventObserver(Protocol):
    """Who counts events (the metrics)."""

    def event_done(self, event: str, result: str, seconds: float) -> None:
        """An event was answered (``result`` "ok" or "error") in ``seconds``."""
        ...


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
        self._sync_pods: list[pb.PodSandbox] = []
        self._sync_containers: list[pb.Container] = []
        self._in_event = False
        self._updates_wanted = False
        self.runtime: str = ""
        """The runtime's name and version, as it told us in Configure."""
        self._threads: list[threading.Thread] = []
        self._handlers: dict[str, Callable[[bytes], Message]] = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "Shutdown": self._shutdown,
            "CreateContainer": self._create_container,
            "UpdateContainer": self._update_container,
            "StopContainer": self._stop_container,
            "StateChange": self._state_change,
            "RunPodSandbox": self._run_pod,
            "StopPodSandbox": self._stop_pod,
            "RemovePodSandbox": self._remove_pod,
            "RemoveContainer": self._remove_container,
        }

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
        connection = Connection(sock, self._handle, name="nri")
        with self._cond:
            if self._stopping:
                sock.close()
                raise OSError("stopping")
            self._connection = connection
            self._synchronized = False
            self._sync_pods, self._sync_containers = [], []
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
                    lambda: (
                        self._stopping
                        or (self._updates_wanted and self._synchronized and not self._in_event)
                    )
                )
                if self._stopping:
                    return
                self._updates_wanted = False
                connection = self._connection
            updates = self._owner.pending_updates()
            if not updates or connection is None:
                continue
            failed = self._push(connection, updates)
            self._owner.updates_sent(updates, failed)
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
        if failed is None and len(updates) > 1:
            return [u.container_id for u in updates if self._update(connection, [u]) is not None]
        return [u.container_id for u in updates] if failed is None else failed

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

    # Requests from the runtime --------------------------------------------------------------

    def _handle(self, call: Call) -> bytes:
        if call.service != PLUGIN_SERVICE:
            raise RPCError(UNIMPLEMENTED, f"service {call.service}")
        handler = self._handlers.get(call.method)
        if handler is None:
            raise RPCError(UNIMPLEMENTED, f"method {call.method}")
        with self._cond:
            self._in_event = True
        started = time.monotonic()
        result = "error"
        try:
            answer = handler(call.payload).SerializeToString()
            result = "ok"
            return answer
        except DecodeError as err:
            raise RPCError(INVALID_ARGUMENT, f"{call.method}: undecodable request: {err}") from err
        finally:
            with self._cond:
                self._in_event = False
                self._cond.notify_all()
            observer = self._options.observer
            if observer is not None:
                observer.event_done(call.method, result, time.monotonic() - started)

    def _configure(self, payload: bytes) -> Message:
        request = pb.ConfigureRequest.FromString(payload)
        self.runtime = f"{request.runtime_name} {request.runtime_version}".strip()
        log.info(
            "NRI: runtime %s (NRI %s) configures us; request timeout %d ms",
            self.runtime or "(unnamed)",
            request.nri_version or "before v0.12",
            request.request_timeout,
        )
        return pb.ConfigureResponse(events=EVENT_MASK)

    def _synchronize(self, payload: bytes) -> Message:
        request = pb.SynchronizeRequest.FromString(payload)
        with self._cond:
            self._sync_pods.extend(request.pods)
            self._sync_containers.extend(request.containers)
            if request.more:  # the runtime split it: answer each chunk but the last empty
                return pb.SynchronizeResponse(more=True)
            pods, self._sync_pods = self._sync_pods, []
            containers, self._sync_containers = self._sync_containers, []
        updates = self._owner.synchronize(
            [pod_of(p) for p in pods], [container_of(c) for c in containers]
        )
        with self._cond:
            self._synchronized = True
            self._cond.notify_all()
        self._owner.connection_changed(True, f"synchronized with {self.runtime or 'the runtime'}")
        log.info(
            "NRI: synchronized %d pods and %d containers, %d updated",
            len(pods),
            len(containers),
            len(updates),
        )
        return pb.SynchronizeResponse(update=container_updates(updates))

    def _shutdown(self, payload: bytes) -> Message:
        log.info("NRI: the runtime is shutting down")
        return pb.Empty()

    def _create_container(self, payload: bytes) -> Message:
        request = pb.CreateContainerRequest.FromString(payload)
        cpuset, updates = self._owner.create_container(
            pod_of(request.pod), container_of(request.container)
        )
        response = pb.CreateContainerResponse(update=container_updates(updates))
        if cpuset is not None:
            response.adjust.linux.resources.CopyFrom(resources(cpuset))
        return response

    def _update_container(self, payload: bytes) -> Message:
        request = pb.UpdateContainerRequest.FromString(payload)
        updates = self._owner.update_container(pod_of(request.pod), container_of(request.container))
        return pb.UpdateContainerResponse(update=container_updates(updates))

    def _stop_container(self, payload: bytes) -> Message:
        request = pb.StopContainerRequest.FromString(payload)
        updates = self._owner.container_stopped(
            pod_of(request.pod), container_of(request.container)
        )
        return pb.StopContainerResponse(update=container_updates(updates))

    def _state_change(self, payload: bytes) -> Message:
        """Pod events and RemoveContainer from runtimes before NRI v0.12."""
        event = pb.StateChangeEvent.FromString(payload)
        pod = pod_of(event.pod)
        if event.event == pb.RUN_POD_SANDBOX:
            self._owner.pod_seen(pod)
        elif event.event == pb.REMOVE_POD_SANDBOX:
            self._owner.pod_removed(pod)
        elif event.event == pb.REMOVE_CONTAINER:
            self._owner.container_removed(pod, container_of(event.container))
        return pb.Empty()

    def _run_pod(self, payload: bytes) -> Message:
        self._owner.pod_seen(pod_of(pb.PodContainerRequest.FromString(payload).pod))
        return pb.Empty()

    def _stop_pod(self, payload: bytes) -> Message:
        pb.PodContainerRequest.FromString(payload)  # nothing to do: its containers stop
        return pb.Empty()

    def _remove_pod(self, payload: bytes) -> Message:
        self._owner.pod_removed(pod_of(pb.PodContainerRequest.FromString(payload).pod))
        return pb.Empty()

    def _remove_container(self, payload: bytes) -> Message:
        request = pb.PodContainerRequest.FromString(payload)
        self._owner.container_removed(pod_of(request.pod), container_of(request.container))
        return pb.Empty()
