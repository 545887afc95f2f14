"""The NRI plugin's protocol with the runtime, and its owner, event by event.

The runtime's end is spoken by hand on a Unix socket (tests.unit.nri.test_ttrpc.Peer) to
send what a real one rarely does: garbage, a split Synchronize, an unknown method. The owner
is a recording double of nodedra's own RuntimeOwner protocol. The real runtime side is in
tests/integration/test_pinning.py.
"""

from __future__ import annotations

import socket
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from google.protobuf.message import Message

from nodedra.grpc_gen import nri_v1alpha1_pb2 as pb
from nodedra.grpc_gen import ttrpc_pb2
from nodedra.nri import EVENT_MASK, Container, CPUSet, NRIPlugin, PluginOptions, Pod, Update
from nodedra.nri.ttrpc import UNIMPLEMENTED
from nodedra.nri.wire import PLUGIN_CONN, RUNTIME_CONN
from tests.unit.nri.test_ttrpc import Peer

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"


class Owner:
    """Records what the plugin tells it; answers with what the test set."""

    def __init__(self, idle: bool = False) -> None:
        self.is_idle = idle
        """What ``idle`` answers: whether events are handled on the connection's reader."""
        self.synchronized: list[tuple[list[Pod], list[Container]]] = []
        self.created: list[Container] = []
        self.connections: list[bool] = []
        self.pending: list[Update] = []
        self.sent: list[tuple[list[Update], list[str]]] = []
        self.hold_creation = threading.Event()
        self.hold_creation.set()
        self.started: list[tuple[Pod, Container]] = []
        self.update_started = False
        """What container_started answers: whether the started container is to be updated."""
        self.creating = threading.Event()
        self.changed = threading.Condition()
        self.hold_taking = threading.Event()
        self.hold_taking.set()
        self.taking = threading.Event()

    def synchronize(self, pods: Sequence[Pod], containers: Sequence[Container]) -> list[Update]:
        self.synchronized.append((list(pods), list(containers)))
        return [Update(c.id, CPUSet("1-3")) for c in containers]

    def create_container(
        self, pod: Pod, container: Container
    ) -> tuple[CPUSet | None, list[Update]]:
        self.creating.set()
        self.hold_creation.wait(30)
        self.created.append(container)
        return CPUSet("4-5", "0"), [Update("other", CPUSet("0-3"))]

    def update_container(self, pod: Pod, container: Container, requested: CPUSet) -> list[Update]:
        return [Update(container.id, CPUSet("4-5"))]

    def container_started(self, pod: Pod, container: Container) -> bool:
        self.started.append((pod, container))
        return self.update_started

    def container_stopped(self, pod: Pod, container: Container) -> list[Update]:
        return []

    def container_removed(self, pod: Pod, container: Container) -> None:
        pass

    def pod_seen(self, pod: Pod) -> None:
        pass

    def pod_removed(self, pod: Pod) -> None:
        pass

    def pending_updates(self) -> list[Update]:
        self.taking.set()
        self.hold_taking.wait(30)
        return list(self.pending)

    def updates_sent(self, sent: Sequence[Update], failed: Sequence[str]) -> bool:
        with self.changed:
            self.sent.append((list(sent), list(failed)))
            self.pending = [u for u in self.pending if u.container_id in failed]
            self.changed.notify_all()
        return False

    def connection_changed(self, connected: bool, detail: str) -> None:
        with self.changed:
            self.connections.append(connected)
            self.changed.notify_all()

    def idle(self) -> bool:
        return self.is_idle


class Runtime:
    """A listening NRI socket whose connections the test speaks for the runtime."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(4)
        self.server.settimeout(30)
        self.next_id = 1

    def accept(self) -> Peer:
        sock, _ = self.server.accept()
        sock.settimeout(30)
        self.next_id = 1
        return Peer(sock)

    def register(self, peer: Peer) -> pb.RegisterPluginRequest:
        """Take the plugin's RegisterPlugin and answer it."""
        conn_id, message = peer.receive()
        assert conn_id == RUNTIME_CONN
        request = ttrpc_pb2.Request.FromString(message.payload)
        assert (request.service, request.method) == (
            "nri.pkg.api.v1alpha1.Runtime",
            "RegisterPlugin",
        )
        peer.answer(message.stream_id, pb.Empty().SerializeToString())
        return pb.RegisterPluginRequest.FromString(request.payload)

    def call(
        self, peer: Peer, method: str, message: Message, service: str = PLUGIN
    ) -> ttrpc_pb2.Response:
        """One call of the plugin service; its response."""
        stream_id, self.next_id = self.next_id, self.next_id + 2
        peer.call(stream_id, service, method, message.SerializeToString())
        conn_id, answer = peer.receive()
        assert (conn_id, answer.stream_id) == (PLUGIN_CONN, stream_id)
        return ttrpc_pb2.Response.FromString(answer.payload)

    def connect(self, peer: Peer) -> None:
        """Register, configure and synchronize (empty): a plugin ready for events."""
        self.register(peer)
        configured = pb.ConfigureResponse.FromString(
            self.call(peer, "Configure", pb.ConfigureRequest(runtime_name="test")).payload
        )
        assert configured.events == EVENT_MASK
        self.call(peer, "Synchronize", pb.SynchronizeRequest())


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    directory = Path(tempfile.mkdtemp(prefix="nd-nri-"))
    server = Runtime(directory / "nri.sock")
    yield server
    server.server.close()


@pytest.fixture(params=[False, True], ids=["handed-off", "inline"])
def owner(request: pytest.FixtureRequest) -> Owner:
    """Every test twice: each event handled on the connection's handler thread, and on
    its reader thread (what the plugin does while the owner's lock is idle)."""
    return Owner(idle=request.param)


@pytest.fixture
def plugin(runtime: Runtime, owner: Owner) -> Iterator[NRIPlugin]:
    nri = NRIPlugin(owner, PluginOptions(socket_path=runtime.path, index="42", min_backoff=0.05))
    nri.start()
    yield nri
    nri.stop()


def container(index: int) -> pb.Container:
    return pb.Container(id=f"c{index}", pod_sandbox_id="p", name=f"c{index}", env=["A=1", "B=x=y"])


def test_it_registers_with_its_name_and_index(runtime: Runtime, plugin: NRIPlugin) -> None:
    request = runtime.register(runtime.accept())
    assert (request.plugin_name, request.plugin_idx) == ("nodedra", "42")


def test_the_event_mask_is_one_containerd_2_0_takes(runtime: Runtime, plugin: NRIPlugin) -> None:
    """Only events NRI v0.8 knows (ValidEvents 0x7ff): run/stop/remove pod, create, start,
    update, stop and remove container."""
    assert EVENT_MASK == 0x6AF
    peer = runtime.accept()
    runtime.register(peer)
    answer = runtime.call(peer, "Configure", pb.ConfigureRequest(runtime_name="containerd"))
    assert pb.ConfigureResponse.FromString(answer.payload).events == 0x6AF


def test_a_split_synchronize_is_answered_at_its_last_chunk(
    runtime: Runtime, plugin: NRIPlugin, owner: Owner
) -> None:
    peer = runtime.accept()
    runtime.register(peer)
    runtime.call(peer, "Configure", pb.ConfigureRequest())
    for chunk in range(3):
        request = pb.SynchronizeRequest(
            pods=[pb.PodSandbox(id=f"p{chunk}", uid=f"u{chunk}")],
            containers=[container(2 * chunk), container(2 * chunk + 1)],
            more=True,
        )
        answer = pb.SynchronizeResponse.FromString(
            runtime.call(peer, "Synchronize", request).payload
        )
        assert answer.more, "every chunk but the last is answered with more"
        assert not answer.update
        assert owner.synchronized == []
    last = pb.SynchronizeRequest(containers=[container(6)])
    answer = pb.SynchronizeResponse.FromString(runtime.call(peer, "Synchronize", last).payload)
    assert not answer.more
    assert [u.container_id for u in answer.update] == [f"c{i}" for i in range(7)]
    assert answer.update[0].linux.resources.cpu.cpus == "1-3"
    ((pods, containers),) = owner.synchronized
    assert [p.uid for p in pods] == ["u0", "u1", "u2"]
    assert containers[0].env_names == {"A", "B"}, "names only, never values"
    assert plugin.wait_synchronized(10)


def test_creation_is_adjusted_and_others_updated(runtime: Runtime, plugin: NRIPlugin) -> None:
    peer = runtime.accept()
    runtime.connect(peer)
    request = pb.CreateContainerRequest(pod=pb.PodSandbox(id="p"), container=container(1))
    answer = pb.CreateContainerResponse.FromString(
        runtime.call(peer, "CreateContainer", request).payload
    )
    cpu = answer.adjust.linux.resources.cpu
    assert (cpu.cpus, cpu.mems) == ("4-5", "0")
    assert [(u.container_id, u.linux.resources.cpu.cpus) for u in answer.update] == [
        ("other", "0-3")
    ]


@pytest.mark.parametrize(
    ("service", "method", "message"),
    [
        (PLUGIN, "PostStartContainer", "method PostStartContainer"),
        ("nri.pkg.api.v1alpha1.Other", "Configure", "service nri.pkg.api.v1alpha1.Other"),
    ],
)
def test_anything_else_is_unimplemented(
    runtime: Runtime, plugin: NRIPlugin, service: str, method: str, message: str
) -> None:
    """v0.12 runtimes then fall back to StateChange for good; others never call them."""
    peer = runtime.accept()
    runtime.connect(peer)
    answer = runtime.call(peer, method, pb.Empty(), service=service)
    assert (answer.status.code, answer.status.message) == (UNIMPLEMENTED, message)


def test_updates_wait_until_no_event_is_being_handled(
    runtime: Runtime, plugin: NRIPlugin, owner: Owner
) -> None:
    """The runtime holds its NRI lock while it waits for an event's answer: an update sent
    meanwhile would wait for it (and, on some runtimes, never get it)."""
    peer = runtime.accept()
    runtime.connect(peer)
    owner.hold_creation.clear()
    owner.pending = [Update("c9", CPUSet("7"))]
    stream_id = runtime.next_id
    request = pb.CreateContainerRequest(pod=pb.PodSandbox(id="p"), container=container(1))
    peer.call(stream_id, PLUGIN, "CreateContainer", request.SerializeToString())
    assert owner.creating.wait(10)
    plugin.request_updates()
    peer.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        peer.receive()  # nothing, not the update, while the event is handled
    peer.sock.settimeout(30)
    owner.hold_creation.set()
    conn_id, first = peer.receive()
    assert (conn_id, first.stream_id) == (PLUGIN_CONN, stream_id), "the event's answer first"
    conn_id, second = peer.receive()
    assert conn_id == RUNTIME_CONN
    call = ttrpc_pb2.Request.FromString(second.payload)
    assert call.method == "UpdateContainers"
    updates = pb.UpdateContainersRequest.FromString(call.payload).update
    assert [(u.container_id, u.linux.resources.cpu.cpus) for u in updates] == [("c9", "7")]
    peer.answer(second.stream_id, pb.UpdateContainersResponse().SerializeToString())
    with owner.changed:
        assert owner.changed.wait_for(lambda: owner.sent, 10)
    assert owner.sent == [([Update("c9", CPUSet("7"))], [])]


def test_no_event_begins_while_the_updates_are_taken(
    runtime: Runtime, plugin: NRIPlugin, owner: Owner
) -> None:
    """Taking the updates and seeing no event under way are one step: an event that began
    between them could have its own update taken, and sent before its answer."""
    peer = runtime.accept()
    runtime.connect(peer)
    owner.pending = [Update("c9", CPUSet("7"))]
    owner.hold_taking.clear()
    plugin.request_updates()
    assert owner.taking.wait(10)
    stream_id = runtime.next_id
    request = pb.CreateContainerRequest(pod=pb.PodSandbox(id="p"), container=container(1))
    peer.call(stream_id, PLUGIN, "CreateContainer", request.SerializeToString())
    assert not owner.creating.wait(0.5), "the event began while the updates were taken"
    owner.hold_taking.set()
    assert owner.creating.wait(10)
    answers = {}
    for _ in range(2):  # the update taken before the event, and the event's answer
        conn_id, message = peer.receive()
        answers[conn_id] = message
        if conn_id == RUNTIME_CONN:
            peer.answer(message.stream_id, pb.UpdateContainersResponse().SerializeToString())
    assert answers[PLUGIN_CONN].stream_id == stream_id
    call = ttrpc_pb2.Request.FromString(answers[RUNTIME_CONN].payload)
    updates = pb.UpdateContainersRequest.FromString(call.payload).update
    assert [(u.container_id, u.linux.resources.cpu.cpus) for u in updates] == [("c9", "7")]


def receive_updates(peer: Peer) -> tuple[int, list[tuple[str, str]]]:
    """The next UpdateContainers call of the plugin: its stream and (container, cpus)."""
    conn_id, message = peer.receive()
    assert conn_id == RUNTIME_CONN
    call = ttrpc_pb2.Request.FromString(message.payload)
    assert call.method == "UpdateContainers"
    updates = pb.UpdateContainersRequest.FromString(call.payload).update
    return message.stream_id, [(u.container_id, u.linux.resources.cpu.cpus) for u in updates]


@pytest.mark.parametrize("how", ["StartContainer", "StateChange"])
def test_a_started_container_the_owner_adopts_is_updated_after_the_event(
    runtime: Runtime, plugin: NRIPlugin, owner: Owner, how: str
) -> None:
    """A container created while the runtime synchronized us is first seen at its start
    (NRI v0.12's StartContainer, or a StateChange before it); the owner's update follows."""
    peer = runtime.accept()
    runtime.connect(peer)
    owner.pending = [Update("c1", CPUSet("4-5"))]
    owner.update_started = True
    pod = pb.PodSandbox(id="p", uid="u", namespace="ns", name="pod")
    if how == "StartContainer":
        request: Message = pb.PodContainerRequest(pod=pod, container=container(1))
    else:
        request = pb.StateChangeEvent(event=pb.START_CONTAINER, pod=pod, container=container(1))
    answer = runtime.call(peer, how, request)
    assert answer.status.code == 0, answer.status
    [(started_pod, started)] = owner.started
    assert (started_pod.uid, started.id) == ("u", "c1")
    stream_id, updates = receive_updates(peer)
    assert updates == [("c1", "4-5")]
    peer.answer(stream_id, pb.UpdateContainersResponse().SerializeToString())
    with owner.changed:
        assert owner.changed.wait_for(lambda: owner.sent, 10)


def test_a_started_container_the_owner_knows_sends_nothing(
    runtime: Runtime, plugin: NRIPlugin, owner: Owner
) -> None:
    peer = runtime.accept()
    runtime.connect(peer)
    owner.pending = [Update("c1", CPUSet("4-5"))]
    request = pb.PodContainerRequest(pod=pb.PodSandbox(id="p"), container=container(1))
    runtime.call(peer, "StartContainer", request)
    assert len(owner.started) == 1
    peer.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        peer.receive()


def test_garbage_drops_the_connection_and_it_is_made_again(
    runtime: Runtime, plugin: NRIPlugin, owner: Owner
) -> None:
    """Nothing is lost: the next connection registers and synchronizes from scratch."""
    peer = runtime.accept()
    runtime.connect(peer)
    assert plugin.wait_synchronized(10)
    peer.sock.sendall(b"\xff" * 64)
    with owner.changed:
        assert owner.changed.wait_for(lambda: owner.connections[-1:] == [False], 10)
    assert not plugin.synchronized
    again = runtime.accept()
    runtime.connect(again)
    assert plugin.wait_synchronized(10)
    assert owner.connections == [True, False, True]
    assert len(owner.synchronized) == 2


def test_a_handler_of_an_ended_connection_is_done_before_the_next_connects(
    runtime: Runtime, plugin: NRIPlugin, owner: Owner
) -> None:
    """What the old handler records (a cpuset the runtime never got) must come before the
    new connection's Synchronize, which starts the books again: never overlap it."""
    peer = runtime.accept()
    runtime.connect(peer)
    owner.hold_creation.clear()
    request = pb.CreateContainerRequest(pod=pb.PodSandbox(id="p"), container=container(1))
    peer.call(runtime.next_id, PLUGIN, "CreateContainer", request.SerializeToString())
    assert owner.creating.wait(10)
    peer.sock.close()  # the runtime restarts while the event is being handled
    runtime.server.settimeout(1)
    with pytest.raises(TimeoutError):
        runtime.accept()  # no new connection while the old handler is busy
    runtime.server.settimeout(30)
    owner.hold_creation.set()
    again = runtime.accept()
    runtime.connect(again)
    assert plugin.wait_synchronized(10)
    assert [c.id for c in owner.created] == ["c1"]
    assert len(owner.synchronized) == 2


class RaisingOwner(Owner):
    """An owner with a bug that a container's odd name reaches."""

    def create_container(
        self, pod: Pod, container: Container
    ) -> tuple[CPUSet | None, list[Update]]:
        if container.name.startswith("odd"):
            raise ValueError(f"cannot read {container.name!r}")
        return super().create_container(pod, container)

    def synchronize(self, pods: Sequence[Pod], containers: Sequence[Container]) -> list[Update]:
        if any(c.name.startswith("odd") for c in containers):
            raise ValueError("cannot read a container")
        return super().synchronize(pods, containers)


@pytest.fixture
def raising_owner() -> Owner:
    return RaisingOwner()


def test_an_event_that_raises_is_answered_and_the_connection_stays(
    runtime: Runtime, raising_owner: Owner
) -> None:
    """The runtime fails a container, and drops a plugin whose Synchronize fails: an
    error answer would let one container switch pinning off for the whole node."""
    options = PluginOptions(socket_path=runtime.path, index="42", min_backoff=0.05)
    nri = NRIPlugin(raising_owner, options)
    nri.start()
    try:
        peer = runtime.accept()
        runtime.connect(peer)
        odd = pb.Container(
            id="c-odd",
            pod_sandbox_id="p",
            name="odd\udcff".encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
        )
        request = pb.CreateContainerRequest(pod=pb.PodSandbox(id="p"), container=odd)
        answer = runtime.call(peer, "CreateContainer", request)
        assert answer.status.code == 0
        assert not pb.CreateContainerResponse.FromString(answer.payload).HasField("adjust")
        sync = runtime.call(peer, "Synchronize", pb.SynchronizeRequest(containers=[odd]))
        assert sync.status.code == 0
        assert nri.synchronized
        good = pb.CreateContainerRequest(pod=pb.PodSandbox(id="p"), container=container(2))
        adjusted = pb.CreateContainerResponse.FromString(
            runtime.call(peer, "CreateContainer", good).payload
        )
        assert adjusted.adjust.linux.resources.cpu.cpus == "4-5", "the others go on"
        assert raising_owner.connections == [True, True]
    finally:
        nri.stop()
