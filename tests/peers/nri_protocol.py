"""Typed records of the NRI runtime harness's JSON-lines protocol (documented in
``tests/peers/nri/cmd/nri-runtime/protocol.go``): what a test asks as the kubelet, what the
harness answers, and its error.

:class:`~tests.peers.nri_runtime.NRIRuntime` speaks the protocol with these records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Adjustment",
    "BulkSpec",
    "Container",
    "ContainerSpec",
    "CreateResult",
    "EnvAdjustment",
    "Eviction",
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
    "cdi_device",
    "env_name",
]

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
