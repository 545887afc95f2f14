"""Python side of the NRI runtime harness (tests/peers/nri/cmd/nri-runtime) and of the Go
pinning plugin (tests/peers/nri/cmd/nri-stub-plugin).

The harness is containerd's NRI integration without containerd: the official
``github.com/containerd/nri/pkg/adaptation`` (the code containerd embeds), driven the way
containerd's CRI plugin drives it, around a model of the runtime's pods and containers. A
test plays the kubelet (``run_pod``, ``create_container``, ``update_container``, ...) and
asserts on the model, which changes exactly as containerd's stores would under the plugins'
adjustments and updates. It is built at each NRI version in ``NRI_VERSIONS``, i.e. as
each line of containerd releases embeds NRI, so a plugin is tested against all of them.

:class:`NRIRuntime` speaks the harness's JSON-lines protocol (documented in
``cmd/nri-runtime/protocol.go``) with one method per operation and typed answers.
:class:`GoStubPlugin` runs the Go reference plugin. :class:`NRIFactory` starts both for a
test (the ``nri_runtime_factory`` fixture) and stops them afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.peers.build import NRI_CONTAINERD, NRI_VERSIONS, PeerBinaries
from tests.peers.process import PeerProcess

__all__ = [
    "NRI_CONTAINERD",
    "NRI_VERSIONS",
    "Adjustment",
    "BulkSpec",
    "Container",
    "ContainerSpec",
    "CreateResult",
    "GoStubPlugin",
    "NRIFactory",
    "NRIRuntime",
    "NRIRuntimeError",
    "PluginEvent",
    "PluginRecord",
    "Pod",
    "PodSpec",
    "Refusal",
    "Resources",
    "RuntimeInfo",
    "StopResult",
    "SyncChunk",
    "SyncRecord",
    "UnsolicitedCall",
    "UpdateOutcome",
    "UpdateResult",
]

#: How long an operation may take in the harness unless a call says otherwise. Longer than
#: containerd's request timeout times the events of one operation, so a plugin's timeout
#: shows as the harness's answer, not as ours.
DEFAULT_TIMEOUT = 60.0

#: Unix socket paths must fit sockaddr_un.sun_path (108 bytes with the terminating NUL).
MAX_SOCKET_PATH = 107

#: The subscription bits of NRI events (1 << (event - 1)), as in pkg/api/event.go.
EVENT_MASKS: dict[str, int] = {
    name: 1 << index
    for index, name in enumerate(
        (
            "RUN_POD_SANDBOX",
            "STOP_POD_SANDBOX",
            "REMOVE_POD_SANDBOX",
            "CREATE_CONTAINER",
            "POST_CREATE_CONTAINER",
            "START_CONTAINER",
            "POST_START_CONTAINER",
            "UPDATE_CONTAINER",
            "POST_UPDATE_CONTAINER",
            "STOP_CONTAINER",
            "REMOVE_CONTAINER",
            "UPDATE_POD_SANDBOX",
            "POST_UPDATE_POD_SANDBOX",
            "VALIDATE_CONTAINER_ADJUSTMENT",
        )
    )
}


class NRIRuntimeError(RuntimeError):
    """The harness answered a request with an error (its message), or went away."""


def env_name(claim_uid: str, index: int) -> str:
    """The environment variable naming a claim's result in a container (the marker the Go
    stub plugin, like nodedra's CDI specs, uses where the runtime passes no CDI names)."""
    return f"DRA_CPUSET_{claim_uid.replace('-', '_')}_{index}"


def cdi_device(driver: str, claim_uid: str, index: int) -> str:
    """The qualified CDI device name of a claim's result, as nodedra writes it."""
    return f"{driver}/device=claim-{claim_uid}-{index}"


# -- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """A container's Linux resources, the part a CPU and memory plugin deals with.

    In requests (the kubelet's side) an empty or ``None`` value is "not set", as in CRI; in
    answers ``None`` means the container's spec does not set it.
    """

    cpus: str = ""
    mems: str = ""
    shares: int | None = None
    quota: int | None = None
    period: int | None = None
    memory_limit: int | None = None
    memory_swap: int | None = None
    pids_limit: int | None = None
    unified: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Resources:
        data = data or {}
        return cls(
            cpus=data.get("cpus") or "",
            mems=data.get("mems") or "",
            shares=data.get("shares"),
            quota=data.get("quota"),
            period=data.get("period"),
            memory_limit=data.get("memory_limit"),
            memory_swap=data.get("memory_swap"),
            pids_limit=data.get("pids_limit"),
            unified=dict(data.get("unified") or {}),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpus": self.cpus, "mems": self.mems}
        for name in (
            "shares",
            "quota",
            "period",
            "memory_limit",
            "memory_swap",
            "pids_limit",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.unified:
            out["unified"] = dict(self.unified)
        return out


@dataclass(frozen=True)
class PodSpec:
    """A pod as the kubelet's RunPodSandbox describes it. Name, namespace and UID default
    from the id; the harness adds the labels and annotations kubelet and containerd add."""

    id: str
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    runtime_handler: str = ""
    state: str = ""  # add() only: "ready" (default) or "notready"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "runtime_handler": self.runtime_handler,
            "state": self.state,
        }


@dataclass(frozen=True)
class ContainerSpec:
    """A container as the kubelet's CreateContainer describes it: ``cdi_devices`` are the
    CRI request's CDIDevices (what the kubelet got from DRA), ``env`` "K=V" entries (the
    CDI specs' env edits land there too), ``resources`` the initial Linux resources."""

    id: str
    pod: str
    name: str = ""
    env: Sequence[str] = ()
    cdi_devices: Sequence[str] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    args: Sequence[str] = ()
    resources: Resources | None = None
    state: str = ""  # add() only: "running" (default), "created" or "stopped"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pod": self.pod,
            "name": self.name,
            "env": list(self.env),
            "cdi_devices": list(self.cdi_devices),
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "args": list(self.args),
            "resources": self.resources.to_json() if self.resources else None,
            "state": self.state,
        }


@dataclass(frozen=True)
class BulkSpec:
    """Many similar pods and containers for add(), generated in the harness (cheap for
    thousands). Containers ``<prefix>-ctr-<i>`` are dealt round robin to pods
    ``<prefix>-pod-<j>``; ``annotation_bytes`` pads each container with an annotation of
    that size, which makes Synchronize messages big enough to be split."""

    containers: int
    pods: int = 1
    prefix: str = "bulk"
    annotation_bytes: int = 0
    env: Sequence[str] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    state: str = ""
    resources: Resources | None = None

    def container_ids(self) -> list[str]:
        return [f"{self.prefix}-ctr-{i}" for i in range(self.containers)]

    def to_json(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "pods": self.pods,
            "containers": self.containers,
            "annotation_bytes": self.annotation_bytes,
            "env": list(self.env),
            "labels": dict(self.labels),
            "state": self.state,
            "resources": self.resources.to_json() if self.resources else None,
        }


# -- answers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuntimeInfo:
    """What the harness says about itself (ping)."""

    nri_version: str
    ttrpc_version: str
    containerd: str
    fills_cdi_devices: bool
    sends_pod_updates: bool
    runtime_name: str
    runtime_version: str
    socket: str
    registration_timeout_ms: int
    request_timeout_ms: int
    generation: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RuntimeInfo:
        return cls(
            nri_version=data["nri_version"],
            ttrpc_version=data["ttrpc_version"],
            containerd=data["containerd"],
            fills_cdi_devices=bool(data["fills_cdi_devices"]),
            sends_pod_updates=bool(data["sends_pod_updates"]),
            runtime_name=data["runtime_name"],
            runtime_version=data["runtime_version"],
            socket=data["socket"],
            registration_timeout_ms=int(data["registration_timeout_ms"]),
            request_timeout_ms=int(data["request_timeout_ms"]),
            generation=int(data["generation"]),
        )


@dataclass(frozen=True)
class Container:
    """A container in the runtime's model: the ground truth tests assert on."""

    id: str
    pod: str
    name: str
    state: str  # created, running, stopped
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    env: tuple[str, ...]
    args: tuple[str, ...]
    cdi_devices: tuple[str, ...]
    injected_cdi_devices: tuple[str, ...]
    cpus: str
    mems: str
    resources: Resources
    created_at: int
    started_at: int
    finished_at: int
    exit_code: int
    pid: int
    evicted: str
    spec: Mapping[str, Any] | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Container:
        return cls(
            id=data["id"],
            pod=data["pod"],
            name=data["name"],
            state=data["state"],
            labels=dict(data.get("labels") or {}),
            annotations=dict(data.get("annotations") or {}),
            env=tuple(data.get("env") or ()),
            args=tuple(data.get("args") or ()),
            cdi_devices=tuple(data.get("cdi_devices") or ()),
            injected_cdi_devices=tuple(data.get("injected_cdi_devices") or ()),
            cpus=data.get("cpus") or "",
            mems=data.get("mems") or "",
            resources=Resources.from_json(data.get("resources")),
            created_at=int(data.get("created_at") or 0),
            started_at=int(data.get("started_at") or 0),
            finished_at=int(data.get("finished_at") or 0),
            exit_code=int(data.get("exit_code") or 0),
            pid=int(data.get("pid") or 0),
            evicted=data.get("evicted") or "",
            spec=data.get("spec"),
        )

    def env_map(self) -> dict[str, str]:
        """The environment as a mapping (the last entry of a name wins, as in a process)."""
        out: dict[str, str] = {}
        for entry in self.env:
            key, _, value = entry.partition("=")
            out[key] = value
        return out


@dataclass(frozen=True)
class Pod:
    """A pod in the runtime's model."""

    id: str
    name: str
    namespace: str
    uid: str
    state: str  # ready, notready
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    containers: tuple[str, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Pod:
        return cls(
            id=data["id"],
            name=data["name"],
            namespace=data["namespace"],
            uid=data["uid"],
            state=data["state"],
            labels=dict(data.get("labels") or {}),
            annotations=dict(data.get("annotations") or {}),
            containers=tuple(data.get("containers") or ()),
        )


@dataclass(frozen=True)
class UpdateOutcome:
    """An update a plugin asked for (in any response, a sync, or unsolicited) and what the
    runtime made of it. ``outcome`` is "applied", "unknown container" (containerd skips
    those silently), "failed: <why>" or "ignored failure: <why>" (ignore_failure set)."""

    container_id: str
    resources: Resources | None
    ignore_failure: bool
    outcome: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UpdateOutcome:
        res = data.get("resources")
        return cls(
            container_id=data["container_id"],
            resources=Resources.from_json(res) if res is not None else None,
            ignore_failure=bool(data.get("ignore_failure")),
            outcome=data["outcome"],
        )

    @property
    def applied(self) -> bool:
        return self.outcome == "applied"


def _outcomes(data: Iterable[Mapping[str, Any]] | None) -> tuple[UpdateOutcome, ...]:
    return tuple(UpdateOutcome.from_json(o) for o in data or ())


@dataclass(frozen=True)
class EnvAdjustment:
    """One environment change of an adjustment (``remove``: the plugin deletes ``key``)."""

    key: str
    value: str
    remove: bool


@dataclass(frozen=True)
class Adjustment:
    """What the plugins, merged by the adaptation, changed in a container being created.
    ``raw`` is the whole ContainerAdjustment as protojson (proto field names)."""

    cpus: str
    mems: str
    resources: Resources | None
    env: tuple[EnvAdjustment, ...]
    annotations: Mapping[str, str]
    cdi_devices: tuple[str, ...]
    raw: Mapping[str, Any]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Adjustment:
        res = data.get("resources")
        return cls(
            cpus=data.get("cpus") or "",
            mems=data.get("mems") or "",
            resources=Resources.from_json(res) if res is not None else None,
            env=tuple(
                EnvAdjustment(e["key"], e.get("value") or "", bool(e.get("remove")))
                for e in data.get("env") or ()
            ),
            annotations=dict(data.get("annotations") or {}),
            cdi_devices=tuple(data.get("cdi_devices") or ()),
            raw=dict(data.get("raw") or {}),
        )


@dataclass(frozen=True)
class Eviction:
    container_id: str
    reason: str


def _evictions(data: Iterable[Mapping[str, Any]] | None) -> tuple[Eviction, ...]:
    return tuple(Eviction(e["container_id"], e.get("reason") or "") for e in data or ())


@dataclass(frozen=True)
class CreateResult:
    """The answer to create_container. ``ns`` is the wall time of the adaptation's
    CreateContainer call (all plugins' handling of the event, transport included)."""

    container: Container
    adjust: Adjustment | None
    updates: tuple[UpdateOutcome, ...]
    evictions: tuple[Eviction, ...]
    ns: int
    started: bool
    start_error: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CreateResult:
        adjust = data.get("adjust")
        return cls(
            container=Container.from_json(data["container"]),
            adjust=Adjustment.from_json(adjust) if adjust is not None else None,
            updates=_outcomes(data.get("updates")),
            evictions=_evictions(data.get("evictions")),
            ns=int(data.get("ns") or 0),
            started=bool(data.get("started")),
            start_error=data.get("start_error") or "",
        )


@dataclass(frozen=True)
class UpdateResult:
    """The answer to update_container: what the kubelet asked for, what the runtime applied
    after the plugins' say (``plugins_changed``: a plugin updated this container), the
    container afterwards, and what became of updates of other containers."""

    requested: Resources
    applied: Resources
    plugins_changed: bool
    container: Container
    updates: tuple[UpdateOutcome, ...]
    evictions: tuple[Eviction, ...]
    ns: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UpdateResult:
        return cls(
            requested=Resources.from_json(data.get("requested")),
            applied=Resources.from_json(data.get("applied")),
            plugins_changed=bool(data.get("plugins_changed")),
            container=Container.from_json(data["container"]),
            updates=_outcomes(data.get("updates")),
            evictions=_evictions(data.get("evictions")),
            ns=int(data.get("ns") or 0),
        )


@dataclass(frozen=True)
class StopResult:
    """The answer to stop_container (``container`` is None if it did not exist)."""

    updates: tuple[UpdateOutcome, ...]
    container: Container | None
    ns: int


@dataclass(frozen=True)
class SyncChunk:
    """One SynchronizeRequest: sent, or refused as too big by ttrpc (``error``)."""

    pods: int
    containers: int
    more: bool
    bytes: int
    ns: int
    updates: int
    error: str


@dataclass(frozen=True)
class SyncRecord:
    """One Synchronize of one plugin. ``pods``/``containers``: what the runtime offered;
    ``ns``: how long the adaptation's sync took (the plugin's handling and transport);
    ``updates``: how many updates came back."""

    plugin: str
    generation: int
    at: int
    pods: int
    containers: int
    ns: int
    updates: int
    outcomes: tuple[UpdateOutcome, ...]
    chunks: tuple[SyncChunk, ...]
    error: str
    done: bool

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SyncRecord:
        return cls(
            plugin=data.get("plugin") or "",
            generation=int(data["generation"]),
            at=int(data["at"]),
            pods=int(data["pods"]),
            containers=int(data["containers"]),
            ns=int(data.get("ns") or 0),
            updates=int(data.get("updates") or 0),
            outcomes=_outcomes(data.get("outcomes")),
            chunks=tuple(
                SyncChunk(
                    pods=int(c["pods"]),
                    containers=int(c["containers"]),
                    more=bool(c.get("more")),
                    bytes=int(c.get("bytes") or 0),
                    ns=int(c.get("ns") or 0),
                    updates=int(c.get("updates") or 0),
                    error=c.get("error") or "",
                )
                for c in data.get("chunks") or ()
            ),
            error=data.get("error") or "",
            done=bool(data.get("done")),
        )

    @property
    def messages(self) -> tuple[SyncChunk, ...]:
        """The SynchronizeRequests that went out (not those refused as too big)."""
        return tuple(c for c in self.chunks if not c.error)

    @property
    def split(self) -> bool:
        """Whether the runtime sent the state in several messages (``more`` set)."""
        return len(self.messages) > 1


@dataclass(frozen=True)
class UnsolicitedCall:
    """One UpdateContainers call of a plugin and what the runtime answered: the failed
    updates and the error (containerd fails the call whenever an update failed)."""

    at: int
    updates: int
    outcomes: tuple[UpdateOutcome, ...]
    failed: tuple[str, ...]
    error: str


@dataclass(frozen=True)
class PluginEvent:
    """One request the adaptation sent to a plugin (other than Configure and Synchronize):
    ``method`` is the ttrpc method (e.g. ``StateChange`` or ``StartContainer``), ``event``
    the NRI event it carries."""

    seq: int
    at: int
    method: str
    event: str
    pod: str
    container: str
    ns: int
    error: str


@dataclass(frozen=True)
class PluginRecord:
    """One connection of a plugin, from its registration on."""

    name: str  # "<idx>-<name>"
    index: str
    base: str
    generation: int
    registered_at: int
    events: int
    synchronized: bool
    synced_at: int
    closed: bool
    closed_at: int
    dropped: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PluginRecord:
        return cls(
            name=data["name"],
            index=data["index"],
            base=data["base"],
            generation=int(data["generation"]),
            registered_at=int(data.get("registered_at") or 0),
            events=int(data.get("events") or 0),
            synchronized=bool(data.get("synchronized")),
            synced_at=int(data.get("synced_at") or 0),
            closed=bool(data.get("closed")),
            closed_at=int(data.get("closed_at") or 0),
            dropped=data.get("dropped") or "",
        )

    def subscribed(self, event: str) -> bool:
        """Whether the plugin subscribed to ``event`` (e.g. "CREATE_CONTAINER")."""
        return bool(self.events & EVENT_MASKS[event])


@dataclass(frozen=True)
class Refusal:
    """A plugin connection the adaptation gave up on before synchronizing it (bad name or
    index, registration timeout, Configure failed or asked for unknown events). ``plugin``
    is empty if it never registered."""

    at: int
    plugin: str
    error: str


def _refusals(data: Iterable[Mapping[str, Any]] | None) -> list[Refusal]:
    return [Refusal(int(r["at"]), r.get("plugin") or "", r["error"]) for r in data or ()]


# -- the harness ------------------------------------------------------------------------------


class NRIRuntime:
    """One runtime-side NRI harness at NRI ``version``, listening on ``socket``.

    Requests may be made from several threads at once (answers are matched by id), which
    lets a test, say, create a container while a plugin's sync is under way.
    """

    def __init__(
        self,
        binary: Path,
        version: str,
        socket: Path,
        workdir: Path,
        *,
        online_cpus: str = "",
        online_mems: str = "",
        registration_timeout: float | None = None,
        request_timeout: float | None = None,
        runtime_version: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if len(str(socket)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"NRI socket path {socket} is {len(str(socket))} bytes; Unix socket paths"
                f" must stay under {MAX_SOCKET_PATH + 1}: use a shorter directory"
            )
        self.binary = binary
        self.version = version
        self.socket = socket
        self.workdir = workdir
        self.log_path = workdir / f"nri-runtime-{version}.log"
        self.online_cpus = online_cpus
        self.online_mems = online_mems
        self.registration_timeout = registration_timeout
        self.request_timeout = request_timeout
        self.runtime_version = runtime_version
        self.extra_args = list(extra_args)
        self.info: RuntimeInfo | None = None
        self._process: PeerProcess | None = None
        self._ids = itertools.count(1)
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._answers: dict[int, dict[str, Any]] = {}
        self._answered = threading.Condition(self._read_lock)
        self._reader_busy = False
        self._buffer = b""
        self._gone: str | None = None

    def __enter__(self) -> NRIRuntime:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def process(self) -> PeerProcess:
        if self._process is None:
            raise NRIRuntimeError("the NRI runtime harness is not running")
        return self._process

    def start(self, timeout: float = 30.0) -> RuntimeInfo:
        """Start the harness and check it embeds the NRI version it was asked for."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        argv = [str(self.binary), f"--socket={self.socket}"]
        if self.online_cpus:
            argv.append(f"--online-cpus={self.online_cpus}")
        if self.online_mems:
            argv.append(f"--online-mems={self.online_mems}")
        if self.registration_timeout is not None:
            argv.append(f"--registration-timeout={self.registration_timeout}s")
        if self.request_timeout is not None:
            argv.append(f"--request-timeout={self.request_timeout}s")
        if self.runtime_version is not None:
            argv.append(f"--runtime-version={self.runtime_version}")
        argv += self.extra_args
        self._gone = None
        self._process = PeerProcess(
            f"nri-runtime-{self.version}", argv, self.log_path, interactive=True
        )
        try:
            self.info = self.ping(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        if self.info.nri_version != self.version:
            self.stop()
            raise NRIRuntimeError(
                f"{self.binary} embeds NRI {self.info.nri_version}, not {self.version}:"
                " a stale or misbuilt peer; rebuild with `python -m tests.peers.build`"
            )
        return self.info

    def stop(self) -> None:
        """Ask the harness to stop (it closes every plugin connection), then make sure."""
        if self._process is None:
            return
        if self._process.alive():
            with contextlib.suppress(NRIRuntimeError, OSError):
                self.call("stop", timeout=5.0)
        self._process.stop()
        self._process = None

    def log_tail(self, lines: int = 40) -> str:
        return self._process.tail(lines) if self._process is not None else ""

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        return {f"nri-runtime {self.version} ({self.log_path})": self.log_tail(lines)}

    def log_text(self) -> str:
        """The whole log so far (the adaptation's own lines included)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # -- protocol ---------------------------------------------------------------------

    def call(self, op: str, timeout: float = DEFAULT_TIMEOUT, **params: Any) -> dict[str, Any]:
        """Send one request and wait for its answer.

        The harness gets ``timeout`` for the operation; we wait a little longer, so that
        its own timeout error, which says what it waited for, is what the caller sees.
        """
        proc = self.process
        request_id = next(self._ids)
        message = {"id": request_id, "op": op, "timeout": timeout, **params}
        stdin = proc.popen.stdin
        assert stdin is not None
        with self._write_lock:
            try:
                stdin.write(json.dumps(message).encode() + b"\n")
                stdin.flush()
            except (BrokenPipeError, ValueError):
                raise NRIRuntimeError(f"the NRI runtime harness is gone; {self._why()}") from None
        answer = self._wait_answer(request_id, time.monotonic() + timeout + 10.0)
        if not answer.get("ok"):
            raise NRIRuntimeError(f"NRI runtime {op} failed: {answer.get('error')}")
        return answer

    def _wait_answer(self, request_id: int, deadline: float) -> dict[str, Any]:
        """Wait for the answer with ``request_id``. One waiting thread at a time reads
        stdout and files every answer it reads; the others wait to be woken."""
        with self._answered:
            while True:
                if request_id in self._answers:
                    return self._answers.pop(request_id)
                if self._gone is not None:
                    raise NRIRuntimeError(self._gone)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NRIRuntimeError(
                        f"no answer from the NRI runtime harness in time; {self._why()}"
                    )
                if self._reader_busy:
                    self._answered.wait(min(remaining, 1.0))
                    continue
                self._reader_busy = True
                self._answered.release()
                try:
                    lines = self._read_lines(min(remaining, 1.0))
                finally:
                    self._answered.acquire()
                    self._reader_busy = False
                for answer in lines:
                    answer_id = answer.get("id")
                    if isinstance(answer_id, int):
                        self._answers[answer_id] = answer
                self._answered.notify_all()

    def _read_lines(self, wait: float) -> list[dict[str, Any]]:
        proc = self.process
        stdout = proc.popen.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], wait)
        if not ready:
            if not proc.alive():
                self._gone = f"the NRI runtime harness exited; {self._why()}"
            return []
        # Unbuffered read: select() cannot see data hidden in a Python-level buffer.
        chunk = os.read(stdout.fileno(), 1 << 20)
        if not chunk:
            with contextlib.suppress(Exception):
                proc.popen.wait(timeout=10)
            self._gone = f"the NRI runtime harness exited; {self._why()}"
            return []
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in complete if line.strip()]

    def _why(self) -> str:
        proc = self._process
        if proc is None:
            return "not running"
        return f"exit code {proc.popen.poll()}, log {proc.log_path}:\n{proc.tail()}"

    # -- operations -------------------------------------------------------------------

    def ping(self, timeout: float = 10.0) -> RuntimeInfo:
        return RuntimeInfo.from_json(self.call("ping", timeout=timeout))

    def add(
        self,
        pods: Iterable[PodSpec] = (),
        containers: Iterable[ContainerSpec] = (),
        bulk: BulkSpec | None = None,
    ) -> tuple[int, int]:
        """Put pods and containers into the runtime's stores without any event, as if
        they existed before (e.g. before a plugin connects). Returns how many of each."""
        answer = self.call(
            "add",
            pods=[p.to_json() for p in pods],
            containers=[c.to_json() for c in containers],
            generate=bulk.to_json() if bulk else None,
        )
        return int(answer["pods"]), int(answer["containers"])

    def run_pod(self, pod: PodSpec) -> Pod:
        """RunPodSandbox: relays RUN_POD_SANDBOX; a plugin's error fails it."""
        return Pod.from_json(self.call("run_pod", pod=pod.to_json())["pod"])

    def stop_pod(self, pod_id: str) -> tuple[UpdateOutcome, ...]:
        """StopPodSandbox: stops the pod's containers (their STOP_CONTAINER events), then
        relays STOP_POD_SANDBOX. Returns what became of the updates plugins asked for."""
        return _outcomes(self.call("stop_pod", pod_id=pod_id)["updates"])

    def remove_pod(self, pod_id: str) -> tuple[UpdateOutcome, ...]:
        """RemovePodSandbox: stops the pod if needed, removes its containers, then relays
        REMOVE_POD_SANDBOX."""
        return _outcomes(self.call("remove_pod", pod_id=pod_id)["updates"])

    def update_pod(
        self, pod_id: str, resources: Resources, overhead: Resources | None = None
    ) -> None:
        """UpdatePodSandboxResources (containerd 2.3 on, i.e. the v0.12 build only)."""
        self.call(
            "update_pod",
            pod_id=pod_id,
            resources=resources.to_json(),
            overhead=overhead.to_json() if overhead else None,
        )

    def create_container(
        self,
        container: ContainerSpec,
        *,
        start: bool = False,
        unseen: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> CreateResult:
        """CreateContainer (then StartContainer with ``start``, as the kubelet does next).

        A plugin's error fails it (NRIRuntimeError); a failed start is reported in
        ``start_error`` and leaves the container stopped. With ``unseen`` NRI hears nothing
        of the creation, as of a container a runtime created while it synchronized a plugin
        (containerd#13698, cri-o#10090): its start is then NRI's first word of it.
        """
        answer = self.call(
            "create_container",
            timeout=timeout,
            container=container.to_json(),
            start=start,
            unseen=unseen,
        )
        return CreateResult.from_json(answer)

    def start_container(self, container_id: str) -> Container:
        return Container.from_json(
            self.call("start_container", container_id=container_id)["container"]
        )

    def update_container(self, container_id: str, resources: Resources) -> UpdateResult:
        """UpdateContainerResources as the kubelet sends it (cpus/mems as the CPU manager
        would, shares/quota/memory limit as for a resize)."""
        answer = self.call(
            "update_container", container_id=container_id, resources=resources.to_json()
        )
        return UpdateResult.from_json(answer)

    def stop_container(self, container_id: str, exit_code: int = 0) -> StopResult:
        answer = self.call("stop_container", container_id=container_id, exit_code=exit_code)
        ctr = answer.get("container")
        return StopResult(
            updates=_outcomes(answer.get("updates")),
            container=Container.from_json(ctr) if ctr else None,
            ns=int(answer.get("ns") or 0),
        )

    def remove_container(self, container_id: str) -> tuple[UpdateOutcome, ...]:
        return _outcomes(self.call("remove_container", container_id=container_id)["updates"])

    def containers(self, pod_id: str = "", *, with_spec: bool = False) -> list[Container]:
        answer = self.call("containers", pod_id=pod_id, with_spec=with_spec)
        return [Container.from_json(c) for c in answer["containers"]]

    def container(self, container_id: str, *, with_spec: bool = False) -> Container:
        answer = self.call("container", container_id=container_id, with_spec=with_spec)
        return Container.from_json(answer["container"])

    def pods(self) -> list[Pod]:
        return [Pod.from_json(p) for p in self.call("pods")["pods"]]

    def syncs(self) -> list[SyncRecord]:
        return [SyncRecord.from_json(s) for s in self.call("syncs")["syncs"]]

    def wait_sync(self, count: int, timeout: float = 30.0) -> list[SyncRecord]:
        """Wait until ``count`` Synchronize calls (in total, all plugins and restarts)
        have completed; returns every sync record."""
        answer = self.call("wait_sync", timeout=timeout, count=count)
        return [SyncRecord.from_json(s) for s in answer["syncs"]]

    def unsolicited(self) -> list[UnsolicitedCall]:
        return self._unsolicited(self.call("unsolicited"))

    def wait_unsolicited(self, count: int, timeout: float = 30.0) -> list[UnsolicitedCall]:
        """Wait until plugins have made ``count`` UpdateContainers calls in total."""
        return self._unsolicited(self.call("wait_unsolicited", timeout=timeout, count=count))

    @staticmethod
    def _unsolicited(answer: Mapping[str, Any]) -> list[UnsolicitedCall]:
        return [
            UnsolicitedCall(
                at=int(c["at"]),
                updates=int(c["updates"]),
                outcomes=_outcomes(c.get("outcomes")),
                failed=tuple(c.get("failed") or ()),
                error=c.get("error") or "",
            )
            for c in answer["calls"]
        ]

    def events(self, since: int = 0) -> list[PluginEvent]:
        """Requests sent to plugins after sequence number ``since``."""
        answer = self.call("events", since=since)
        return [
            PluginEvent(
                seq=int(e["seq"]),
                at=int(e["at"]),
                method=e["method"],
                event=e["event"],
                pod=e.get("pod") or "",
                container=e.get("container") or "",
                ns=int(e.get("ns") or 0),
                error=e.get("error") or "",
            )
            for e in answer["events"]
        ]

    def plugins(self) -> list[PluginRecord]:
        return [PluginRecord.from_json(p) for p in self.call("plugins")["plugins"]]

    def refusals(self) -> list[Refusal]:
        return _refusals(self.call("plugins").get("refused"))

    def wait_refused(self, count: int, timeout: float = 30.0) -> list[Refusal]:
        """Wait until the adaptation has refused ``count`` plugin connections in total."""
        return _refusals(self.call("wait_refused", timeout=timeout, count=count)["refused"])

    def wait_plugin(self, name: str, timeout: float = 30.0) -> PluginRecord:
        """Wait until plugin ``name`` ("<idx>-<name>") is connected and synchronized to the
        adaptation as it runs now (after a restart: reconnected and resynchronized)."""
        answer = self.call("wait_plugin", timeout=timeout, name=name)
        return PluginRecord.from_json(answer["plugin"])

    def wait_plugin_closed(self, name: str, timeout: float = 30.0) -> PluginRecord:
        answer = self.call("wait_plugin_closed", timeout=timeout, name=name)
        return PluginRecord.from_json(answer["plugin"])

    def fail_updates(self, container_ids: Iterable[str], error: str = "injected failure") -> None:
        """Make updates of these containers fail from now on, as a runc error would;
        ``error=""`` heals them."""
        self.call("fail_updates", container_ids=list(container_ids), error=error)

    def restart(self, down: float = 0.2) -> int:
        """A containerd restart: every plugin connection closes, the socket is gone for
        ``down`` seconds, then a new adaptation listens on it. The model survives.
        Returns the new generation number."""
        return int(self.call("restart", down=down)["generation"])


# -- the Go reference plugin ------------------------------------------------------------------


class GoStubPlugin:
    """The Go pinning plugin (cmd/nri-stub-plugin) connected to a runtime's socket.

    ``claims`` maps claim UID to (cpus, mems); :meth:`set_claims` rewrites them and makes
    the plugin reload them, after which it sends unsolicited updates (marked
    ignore_failure with ``ignore_failure``).
    """

    def __init__(
        self,
        binary: Path,
        socket: Path,
        workdir: Path,
        *,
        online_cpus: str,
        online_mems: str = "",
        claims: Mapping[str, tuple[str, str]] | None = None,
        name: str = "stub",
        index: str = "10",
        driver: str = "",
        ignore_failure: bool = False,
    ) -> None:
        self.binary = binary
        self.socket = socket
        self.workdir = workdir
        self.online_cpus = online_cpus
        self.online_mems = online_mems
        self.name = name
        self.index = index
        self.driver = driver
        self.ignore_failure = ignore_failure
        self.claims_path = workdir / f"claims-{index}-{name}.json"
        self.log_path = workdir / f"nri-stub-plugin-{index}-{name}.log"
        self._claims: dict[str, tuple[str, str]] = dict(claims or {})
        self._process: PeerProcess | None = None

    @property
    def plugin_name(self) -> str:
        """How the runtime names it: "<idx>-<name>"."""
        return f"{self.index}-{self.name}"

    def start(self) -> GoStubPlugin:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_claims()
        argv = [
            str(self.binary),
            f"--socket={self.socket}",
            f"--name={self.name}",
            f"--idx={self.index}",
            f"--online-cpus={self.online_cpus}",
            f"--claims={self.claims_path}",
        ]
        if self.online_mems:
            argv.append(f"--online-mems={self.online_mems}")
        if self.driver:
            argv.append(f"--driver={self.driver}")
        if self.ignore_failure:
            argv.append("--ignore-failure")
        self._process = PeerProcess(f"nri-stub-plugin {self.plugin_name}", argv, self.log_path)
        return self

    def set_claims(self, claims: Mapping[str, tuple[str, str]]) -> None:
        """Replace the claims and make the plugin reload them (SIGHUP)."""
        self._claims = dict(claims)
        self._write_claims()
        proc = self._process
        if proc is None or not proc.alive():
            raise NRIRuntimeError(f"the stub plugin is not running; log:\n{self.log_tail()}")
        proc.popen.send_signal(signal.SIGHUP)

    def _write_claims(self) -> None:
        data = {uid: {"cpus": cpus, "mems": mems} for uid, (cpus, mems) in self._claims.items()}
        tmp = self.claims_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.claims_path)

    def alive(self) -> bool:
        return self._process is not None and self._process.alive()

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def log_tail(self, lines: int = 40) -> str:
        return self._process.tail(lines) if self._process is not None else ""

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        return {f"nri-stub-plugin {self.plugin_name} ({self.log_path})": self.log_tail(lines)}


# -- for tests --------------------------------------------------------------------------------


class NRIFactory:
    """Starts NRI runtime harnesses (and Go stub plugins) for a test, each on a short
    socket path of its own, and stops them all afterwards (``nri_runtime_factory``)."""

    def __init__(self, binaries: PeerBinaries, workdir: Path) -> None:
        self._binaries = binaries
        self._workdir = workdir
        self.runtimes: list[NRIRuntime] = []
        self.plugins: list[GoStubPlugin] = []

    def __call__(
        self,
        version: str,
        *,
        online_cpus: str = "0-15",
        online_mems: str = "",
        registration_timeout: float | None = None,
        request_timeout: float | None = None,
        runtime_version: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> NRIRuntime:
        """A started runtime harness at NRI ``version`` (one of NRI_VERSIONS)."""
        if version not in NRI_VERSIONS:
            raise ValueError(f"no NRI harness for {version}; known: {', '.join(NRI_VERSIONS)}")
        workdir = self._workdir / f"nri-{len(self.runtimes)}"
        runtime = NRIRuntime(
            self._binaries.nri_runtime(version),
            version,
            workdir / "nri.sock",
            workdir,
            online_cpus=online_cpus,
            online_mems=online_mems,
            registration_timeout=registration_timeout,
            request_timeout=request_timeout,
            runtime_version=runtime_version,
            extra_args=extra_args,
        )
        self.runtimes.append(runtime)
        runtime.start()
        return runtime

    def stub_plugin(
        self,
        runtime: NRIRuntime,
        *,
        claims: Mapping[str, tuple[str, str]] | None = None,
        online_cpus: str | None = None,
        online_mems: str = "",
        name: str = "stub",
        index: str = "10",
        driver: str = "",
        ignore_failure: bool = False,
        wait: bool = True,
    ) -> GoStubPlugin:
        """Start the Go stub plugin (built at the runtime's NRI version) on ``runtime``'s
        socket and, with ``wait``, wait until it is connected and synchronized."""
        plugin = GoStubPlugin(
            self._binaries.nri_stub_plugin(runtime.version),
            runtime.socket,
            runtime.workdir,
            online_cpus=online_cpus or runtime.online_cpus or "0-15",
            online_mems=online_mems,
            claims=claims,
            name=name,
            index=index,
            driver=driver,
            ignore_failure=ignore_failure,
        )
        self.plugins.append(plugin)
        plugin.start()
        if wait:
            runtime.wait_plugin(plugin.plugin_name)
        return plugin

    def stop_all(self) -> None:
        for plugin in reversed(self.plugins):
            plugin.stop()
        for runtime in reversed(self.runtimes):
            runtime.stop()

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        tails: dict[str, str] = {}
        for runtime in self.runtimes:
            tails.update(runtime.log_tails(lines))
        for plugin in self.plugins:
            tails.update(plugin.log_tails(lines))
        return tails
