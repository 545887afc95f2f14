"""Answering the runtime's calls of the plugin service: each event, asking the owner.

The runtime calls one method at a time and waits for its answer (it holds its NRI lock
meanwhile), so these run one at a time, and each answer is the owner's decision put in the
event's response: the adjustment of a container being created, the updates of others. A
Synchronize may come in chunks (``more``): every chunk but the last is answered at once and
empty, and the last with the updates for everything collected.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

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
from .ttrpc import INVALID_ARGUMENT, UNIMPLEMENTED, Call, RPCError

log = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"

EVENTS = (
    pb.RUN_POD_SANDBOX,
    pb.STOP_POD_SANDBOX,
    pb.REMOVE_POD_SANDBOX,
    pb.CREATE_CONTAINER,
    pb.START_CONTAINER,
    pb.UPDATE_CONTAINER,
    pb.STOP_CONTAINER,
    pb.REMOVE_CONTAINER,
)
"""What we subscribe to: events every runtime from containerd 2.0 (NRI v0.8) on knows."""
EVENT_MASK = sum(1 << (event - 1) for event in EVENTS)


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

    def update_container(self, pod: Pod, container: Container, requested: CPUSet) -> list[Update]:
        """The kubelet changes a container's resources: what to (re)assert.

        ``requested`` is the cpuset the kubelet asks for, if it asks for one.
        """
        ...

    def container_started(self, pod: Pod, container: Container) -> bool:
        """A container started: True if it must be updated (outside the event).

        A container the runtime created while it synchronized us is in neither the
        Synchronize nor a CreateContainer (containerd and CRI-O both), so its start is
        where it is first seen.
        """
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

    def updates_sent(self, sent: Sequence[Update], failed: Sequence[str]) -> bool:
        """``sent`` reached the runtime, except the containers ``failed`` names.

        True if updates are due again at once.
        """
        ...

    def connection_changed(self, connected: bool, detail: str) -> None:
        """The runtime connection came (synchronized) or went."""
        ...

    def idle(self) -> bool:
        """Whether an event handled now would not wait for anyone (a glance: it may change)."""
        ...


class EventObserver(Protocol):
    """Who counts events (the metrics)."""

    def event_done(self, event: str, result: str, seconds: float) -> None:
        """An event was answered (``result`` "ok" or "error") in ``seconds``."""
        ...


class Events:
    """The plugin service of one connection at a time."""

    def __init__(
        self,
        owner: RuntimeOwner,
        on_synchronized: Callable[[], None],
        observer: EventObserver | None = None,
        on_updates_due: Callable[[], None] = lambda: None,
    ) -> None:
        self._owner = owner
        self._on_synchronized = on_synchronized
        self._on_updates_due = on_updates_due
        self._observer = observer
        self._busy = threading.Condition()
        self._handling = False
        self._pods: list[pb.PodSandbox] = []
        self._containers: list[pb.Container] = []
        self.runtime = ""
        """The runtime's name and version, as it told us in Configure."""
        self._methods: dict[str, Callable[[bytes], Message]] = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "Shutdown": self._shutdown,
            "CreateContainer": self._create_container,
            "StartContainer": self._start_container,
            "UpdateContainer": self._update_container,
            "StopContainer": self._stop_container,
            "StateChange": self._state_change,
            "RunPodSandbox": self._run_pod,
            "StopPodSandbox": self._stop_pod,
            "RemovePodSandbox": self._remove_pod,
            "RemoveContainer": self._remove_container,
        }

    def reset(self) -> None:
        """A new connection: what an earlier one began to synchronize is forgotten."""
        self._pods, self._containers = [], []

    def when_idle(self, take: Callable[[], list[Update]]) -> list[Update]:
        """``take()`` once no event is being handled or answered, before the next begins.

        For the updates sent outside events: taken in one step with the wait, so that none
        is of an event that began meanwhile and is not answered yet (a StartContainer that
        starts between the wait and the taking would otherwise see its update overtake its
        answer, see ``answered``). ``take`` may take the owner's lock: an event takes it
        only after it began, never while it waits here.
        """
        with self._busy:
            self._busy.wait_for(lambda: not self._handling)
            return take()

    def answered(self) -> None:
        """The answer of the event handled last is on the wire (the connection's hook).

        Only now may an update follow: one that reaches the runtime before the answer can
        wait for the runtime's NRI lock while the event holding it waits for the answer
        (seen with NRI v0.8's runtime side, when a StartContainer asked for an update).
        """
        with self._busy:
            self._handling = False
            self._busy.notify_all()

    def handle(self, call: Call) -> bytes:
        """Answer one call (ttrpc's handler); RPCError for what we do not serve."""
        if call.service != PLUGIN_SERVICE:
            raise RPCError(UNIMPLEMENTED, f"service {call.service}")
        method = self._methods.get(call.method)
        if method is None:
            raise RPCError(UNIMPLEMENTED, f"method {call.method}")
        with self._busy:
            self._handling = True
        started = time.monotonic()
        result = "error"
        try:
            answer = method(call.payload)
            result = "ok"
        except Exception as err:
            if call.method == "Configure":
                raise RPCError(INVALID_ARGUMENT, f"Configure: {err}") from err
            answer = self._answer_despite(call, err)
        finally:
            if self._observer is not None:
                self._observer.event_done(call.method, result, time.monotonic() - started)
        return answer.SerializeToString()

    def _answer_despite(self, call: Call, err: Exception) -> Message:
        """The answer to an event whose handling raised: an empty one, not an error.

        The runtime fails what it was doing when a plugin answers with an error, and on a
        Synchronize drops the plugin: one container with something we could not read
        would then stop the pinning of the whole node, again after every reconnection. An
        empty answer leaves the one container as the runtime made it.
        """
        log.error(
            "NRI: handling %s failed (%s), answered without changes",
            call.method,
            _concerning(call),
            exc_info=err,
        )
        if call.method == "Synchronize":
            self.reset()
            self._on_synchronized()
        return _EMPTY_ANSWERS.get(call.method, pb.Empty)()

    # The methods -----------------------------------------------------------------------

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
        self._pods.extend(request.pods)
        self._containers.extend(request.containers)
        if request.more:  # the runtime split it: answer each chunk but the last empty
            return pb.SynchronizeResponse(more=True)
        pods, containers = self._pods, self._containers
        self.reset()
        updates = self._owner.synchronize(
            [pod_of(p) for p in pods], [container_of(c) for c in containers]
        )
        log.info(
            "NRI: synchronized %d pods and %d containers, %d updated",
            len(pods),
            len(containers),
            len(updates),
        )
        self._on_synchronized()
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

    def _start_container(self, payload: bytes) -> Message:
        request = pb.PodContainerRequest.FromString(payload)
        self._started(pod_of(request.pod), container_of(request.container))
        return pb.Empty()

    def _started(self, pod: Pod, container: Container) -> None:
        if self._owner.container_started(pod, container):
            self._on_updates_due()

    def _update_container(self, payload: bytes) -> Message:
        request = pb.UpdateContainerRequest.FromString(payload)
        cpu = request.linux_resources.cpu
        updates = self._owner.update_container(
            pod_of(request.pod), container_of(request.container), CPUSet(cpu.cpus, cpu.mems)
        )
        return pb.UpdateContainerResponse(update=container_updates(updates))

    def _stop_container(self, payload: bytes) -> Message:
        request = pb.StopContainerRequest.FromString(payload)
        updates = self._owner.container_stopped(
            pod_of(request.pod), container_of(request.container)
        )
        return pb.StopContainerResponse(update=container_updates(updates))

    def _state_change(self, payload: bytes) -> Message:
        """Pod events, StartContainer and RemoveContainer from runtimes before NRI v0.12."""
        event = pb.StateChangeEvent.FromString(payload)
        pod = pod_of(event.pod)
        if event.event == pb.RUN_POD_SANDBOX:
            self._owner.pod_seen(pod)
        elif event.event == pb.START_CONTAINER:
            self._started(pod, container_of(event.container))
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


_EMPTY_ANSWERS: dict[str, type[Message]] = {
    "Synchronize": pb.SynchronizeResponse,
    "CreateContainer": pb.CreateContainerResponse,
    "UpdateContainer": pb.UpdateContainerResponse,
    "StopContainer": pb.StopContainerResponse,
}
"""The answer of each event that changes nothing (pb.Empty for the others)."""


def _concerning(call: Call) -> str:
    """The container or pod a call concerns, in words, as far as it can be read."""
    request_types: dict[str, type[Message]] = {
        "CreateContainer": pb.CreateContainerRequest,
        "StartContainer": pb.PodContainerRequest,
        "UpdateContainer": pb.UpdateContainerRequest,
        "StopContainer": pb.StopContainerRequest,
        "RemoveContainer": pb.PodContainerRequest,
        "RunPodSandbox": pb.PodContainerRequest,
        "RemovePodSandbox": pb.PodContainerRequest,
    }
    request_type = request_types.get(call.method)
    if request_type is None:
        return f"{len(call.payload)} bytes"
    try:
        request: Any = request_type.FromString(call.payload)
    except DecodeError:
        return f"{len(call.payload)} undecodable bytes"
    pod = f"pod {request.pod.namespace}/{request.pod.name}"
    if request.HasField("container"):
        return f"container {request.container.name!r} ({request.container.id}) of {pod}"
    return pod
