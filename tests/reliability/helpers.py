"""One node's nodedra for the reliability tests, and the books it must always keep straight.

`LocalNode` is nodedra as a process builds it: the real ResourceManager, plugin and policy on
the two-socket fixture machine, with its state, CDI, plugin and registry directories under
one root (short, so that the sockets fit in a Unix socket path), and a pod UID as deployed.
The API server is a fake of our own ClusterAPI protocol; the tests of faults that need a
real one use the peers.

`state_of` turns a running node into plain JSON (what `crashy_node` prints, too) and
`check_state` asserts the invariants every cut of that state must satisfy.
"""

from __future__ import annotations

import contextlib
import functools
import json
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
import yaml
from kubernetes.client import ApiClient, Configuration

from nodedra.dra import (
    CDIStore,
    ClaimRef,
    ClusterAPI,
    KubeClusterAPI,
    MetadataStore,
    PrepareResult,
    RequestObserver,
)
from nodedra.dra import driver_name as policy_driver
from nodedra.dra.kube import RESOURCE_API, RESOURCE_API_VERSION
from nodedra.grpc_gen import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from nodedra.lib import faults
from nodedra.policy import ExclusiveCPUPolicy, PolicyConfig, make_policy, parse_config
from nodedra.policy.ledger import env_suffix
from nodedra.resmgr import Checkpoint, ManagerOptions, ResourceManager, State
from nodedra.topology import parse_cpu_list, read_topology
from nodedra.topology.cpulist import format_cpu_list
from nodedra.topology.model import Topology
from tests.peers.controlplane import ControlPlane
from tests.unit.dra.fakes import NODE, FakeCluster, make_claim, result

ROOT = Path(__file__).resolve().parents[2]
SYSFS = ROOT / "tests" / "fixtures" / "sysfs" / "two-socket-smt2-numa4"
POLICIES = ("topology-aware", "static")
RESERVED = "0-1"
"""The reservedCPUs of every node here: the books must never hand them out."""
POD_UID = "pod-5d0c8f3e"
"""The pod UID of every node here (a restart keeps it, as a container restart in its pod
does). Every deployed pod has one (``POD_UID``, from the downward API), and it turns on
what rolling updates need: the instance lock (``serialize.lock``), per-pod socket names,
and catching up with the checkpoint before each change. Shorter than a real one (36
characters): the tests' directories are deeper than the kubelet's, and the socket names
that carry it must fit in a Unix socket path."""

#: Where each crash point is, as the disk shows it: (is the claim in the checkpoint, does it
#: have a CDI spec) right after the crash. A crash anywhere else would leave another picture.
AFTER_CRASH = {
    faults.PREPARE_ALLOCATED: (False, False),
    faults.PREPARE_CHECKPOINT.written: (True, False),  # written in place: a restart reads it
    faults.PREPARE_CHECKPOINT.synced: (True, False),
    faults.PREPARE_COMMITTED: (True, False),
    faults.PREPARE_SPEC.written: (True, False),
    faults.PREPARE_SPEC.renamed: (True, True),
    faults.PREPARE_WRITTEN: (True, True),
    faults.UNPREPARE_RELEASED: (True, True),
    faults.UNPREPARE_CHECKPOINT.written: (False, True),
    faults.UNPREPARE_CHECKPOINT.synced: (False, True),
    faults.UNPREPARE_COMMITTED: (False, True),
    faults.UNPREPARE_REMOVED: (False, False),
}


@functools.cache
def fixture_topology() -> Topology:
    """The two-socket, SMT-2, four-NUMA-node machine of tests/fixtures/sysfs."""
    return read_topology(SYSFS)


def short_dir(prefix: str) -> Path:
    """A fresh directory with a short path (sockets in it must fit in 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


class ClaimsOnServer:
    """Claims put on a real API server, allocated as the scheduler would leave them.

    A claim given in the shape of ``fakes.make_claim`` is created in ``namespace`` (the
    server assigns its UID) with a spec naming the requests its results name, and its
    allocation is written to its status, which the server validates like the scheduler's.
    """

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp = cp
        self.namespace = namespace
        self.api = KubeClusterAPI(admin_client(cp))

    def create(self, claim: Mapping[str, Any]) -> dict[str, Any]:
        """Create and allocate ``claim`` (its name is kept, its UID is the server's)."""
        name = claim["metadata"]["name"]
        allocation = claim["status"]["allocation"]
        path = f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims"
        self.cp.request(
            "POST",
            path,
            {
                "apiVersion": RESOURCE_API_VERSION,
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": _requests(allocation["devices"]["results"])}},
            },
        )
        stored: dict[str, Any] = self.cp.request(
            "PATCH",
            f"{path}/{name}/status",
            {"status": {"allocation": allocation}},
            content_type="application/merge-patch+json",
        )
        return stored


def _requests(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Requests that results name: ``r`` exactly, ``r/s`` a first-available ``s``."""
    subrequests: dict[str, list[str]] = {}
    for found in results:
        main, _, sub = str(found["request"]).partition("/")
        names = subrequests.setdefault(main, [])
        if sub and sub not in names:
            names.append(sub)
    requests: list[dict[str, Any]] = []
    for main, subs in subrequests.items():
        if subs:
            first = [{"name": sub, "deviceClassName": "any"} for sub in subs]
            requests.append({"name": main, "firstAvailable": first})
        else:
            requests.append({"name": main, "exactly": {"deviceClassName": "any"}})
    return requests


def admin_client(cp: ControlPlane) -> ApiClient:
    """The official client, as cluster admin of ``cp``."""
    return ApiClient(
        Configuration(
            host=cp.url,
            ssl_ca_cert=str(cp.ca.pair.cert),
            cert_file=str(cp.admin.cert),
            key_file=str(cp.admin.key),
        )
    )


class LocalNode:
    """nodedra for a node (``NODE`` by default): real manager, plugin and policy under ``root``."""

    def __init__(
        self,
        root: Path,
        policy: str,
        *,
        cluster: ClusterAPI | ClaimsOnServer | None = None,
        reserved: str = RESERVED,
        observer: RequestObserver | None = None,
        resync_period: float = 30.0,
        node_name: str = NODE,
        registrar_dir: Path | None = None,
        pod_uid: str | None = POD_UID,
    ) -> None:
        self.root = root
        self.pod_uid = pod_uid
        self.node_name = node_name
        self.registrar_dir = registrar_dir or root / "registry"
        self.policy_name = policy
        self.claims_on_server = cluster if isinstance(cluster, ClaimsOnServer) else None
        self.cluster: ClusterAPI = (
            cluster.api
            if isinstance(cluster, ClaimsOnServer)
            else cluster
            if cluster is not None
            else FakeCluster()
        )
        self.config = parse_config({"policy": policy, "reservedCPUs": reserved})
        self.observer = observer
        self.resync_period = resync_period
        self.shutdowns: list[str] = []
        self.manager = self.new_manager()

    def new_manager(self) -> ResourceManager:
        """A manager as a (re)started process builds it, on the same directories."""
        return ResourceManager(
            make_policy(fixture_topology(), self.config),
            self.cluster,
            ManagerOptions(
                node_name=self.node_name,
                state_dir=self.root / "state",
                registrar_dir=self.registrar_dir,
                plugin_data_dir=self.root / "plugin",
                cdi_dir=self.root / "cdi",
                rolling_update_uid=self.pod_uid,
                resync_period=self.resync_period,
                observer=self.observer,
            ),
            self.shutdowns.append,
        )

    @property
    def driver(self) -> str:
        return policy_driver(self.policy_name)

    @property
    def policy(self) -> ExclusiveCPUPolicy:
        return cast(ExclusiveCPUPolicy, self.manager.policy)

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    def serve(self, claim: Mapping[str, Any]) -> ClaimRef:
        """Let the API server (or its fake) serve ``claim``; the kubelet's reference to it.

        On a real server the claim gets a UID of the server's: use the reference's.
        """
        if self.claims_on_server is not None:
            return ref_of(self.claims_on_server.create(claim))
        meta = claim["metadata"]
        assert isinstance(self.cluster, FakeCluster)
        self.cluster.claims[(meta["namespace"], meta["name"])] = dict(claim)
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])

    def prepare(self, *refs: ClaimRef) -> dict[str, PrepareResult]:
        return self.manager.plugin.node_prepare(list(refs))

    def unprepare(self, *refs: ClaimRef) -> dict[str, Exception | None]:
        return self.manager.plugin.node_unprepare(list(refs))

    def spec_files(self) -> dict[str, bytes]:
        """Every file in the CDI directory (ours or not, temporary or not), by name."""
        if not self.cdi_dir.is_dir():
            return {}
        return {p.name: p.read_bytes() for p in sorted(self.cdi_dir.iterdir())}

    def saved_state(self) -> State | None:
        """What the checkpoint holds, as a restart reads it."""
        return self.manager.checkpoint.load()

    def state(self) -> dict[str, Any]:
        return state_of(self.manager)


# --- claims -------------------------------------------------------------------------------


def ta_result(
    numa: int, cpus: int | str | None, memory: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A result of the topology-aware driver on NUMA node ``numa``'s device."""
    consumed: dict[str, Any] = {}
    if cpus is not None:
        consumed["cpu"] = cpus
    if memory is not None:
        consumed["memory"] = memory
    if consumed:
        extra.setdefault("consumedCapacity", consumed)
    return result(
        extra.pop("request", "cpus"),
        f"cpudevnuma{numa:03d}",
        driver=policy_driver("topology-aware"),
        pool=NODE,
        **extra,
    )


def static_result(cpu: int, **extra: Any) -> dict[str, Any]:
    """A result of the static driver on CPU ``cpu``'s device."""
    return result(
        extra.pop("request", "cpus"),
        f"cpu{cpu:03d}",
        driver=policy_driver("static"),
        pool=NODE,
        **extra,
    )


OTHER_DRIVER_RESULT = result("gpu", "gpu-0", driver="gpu.example.com", pool="gpus")
"""A result of somebody else's driver: a claim may span drivers."""


def sample_claim(policy: str, uid: str) -> dict[str, Any]:
    """Claims "a", "b", "c" of the crash tests: a few results each, on distinct devices."""
    if policy == "topology-aware":
        results = {
            "a": [
                ta_result(0, "3", "64Mi", request="main"),
                OTHER_DRIVER_RESULT,
                ta_result(1, 2, request="side/one"),
            ],
            "b": [ta_result(0, "4", "1Gi")],
            "c": [ta_result(2, "5"), ta_result(3, "1", "2Mi", request="more")],
        }[uid]
    else:
        results = {
            "a": [
                static_result(4, request="main"),
                OTHER_DRIVER_RESULT,
                static_result(33, request="side/one"),
            ],
            "b": [static_result(10)],
            "c": [static_result(20), static_result(48, request="more")],
        }[uid]
    return make_claim(uid, results)


def ref_of(claim: Mapping[str, Any]) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


# --- answers and state as JSON ------------------------------------------------------------


def encode_answer(answer: PrepareResult) -> dict[str, Any]:
    """A prepare answer as JSON: the error text, or what the kubelet is told per device."""
    return {
        "error": None if answer.error is None else str(answer.error),
        "devices": [
            {
                "requests": list(d.requests),
                "pool": d.pool_name,
                "device": d.device_name,
                "cdi": list(d.cdi_device_ids),
                "share": d.share_id,
            }
            for d in answer.devices
        ],
    }


def spec_cpusets(path: Path) -> list[str]:
    """The cpu list each device of a claim's CDI spec hands its containers, in order."""
    spec = yaml.safe_load(path.read_text())
    uid = path.name.split("-device_", 1)[1].removesuffix(".yaml")
    found = []
    for index, device in enumerate(spec["devices"]):
        assert device["name"] == f"claim-{uid}-{index}"
        env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
        found.append(env[f"DRA_CPUSET_{env_suffix(uid, index)}"])
    return found


def metadata_cpus(path: Path) -> list[str]:
    """The CPUs a metadata file tells each device of its request it got (first version)."""
    first, _ = json.JSONDecoder().raw_decode(path.read_text())
    (request,) = first["requests"]
    return [device["attributes"]["cpus"]["string"] for device in request["devices"]]


def state_of(manager: ResourceManager) -> dict[str, Any]:
    """One consistent cut of a node's books, as JSON, taken under the owner's lock."""
    with manager:
        return books(
            cast(ExclusiveCPUPolicy, manager.policy),
            manager.checkpoint.load(),
            manager.plugin.cdi,
            manager.checkpoint.path.parent,
            manager.plugin.metadata,
        )


def state_on_disk(
    checkpoint: Path, cdi_dir: Path, plugin_dir: Path, config: PolicyConfig, sysfs: Path = SYSFS
) -> dict[str, Any]:
    """A node's books as its files say (for a nodedra that runs as a process of its own).

    The policy is what a restart would make of the checkpoint; read while no request is in
    flight, this is what the running process holds too.
    """
    policy = make_policy(read_topology(sysfs), config)
    saved = Checkpoint(checkpoint).load()
    if saved is not None:
        policy.restore(saved.claims)
    driver = policy_driver(policy.name)
    return books(
        policy,
        saved,
        CDIStore(driver, cdi_dir),
        checkpoint.parent,
        MetadataStore(driver, plugin_dir),
    )


def books(
    policy: ExclusiveCPUPolicy,
    saved: State | None,
    cdi: CDIStore,
    state_dir: Path,
    metadata: MetadataStore,
) -> dict[str, Any]:
    """The books as JSON: the policy's claims, the checkpoint, CDI specs, metadata, leftovers."""
    return {
        "policy": policy.name,
        "claims": policy.snapshot(),
        "checkpoint": None
        if saved is None
        else {"policy": saved.policy, "driver": saved.driver, "claims": dict(saved.claims)},
        "driver": policy_driver(policy.name),
        "grantable": format_cpu_list(policy.grantable),
        "free": format_cpu_list(policy.free_cpus()),
        "reserved": format_cpu_list(policy.config.reserved_cpus),
        "specs": {uid: spec_cpusets(cdi.spec_path(uid)) for uid in cdi.claim_uids()},
        "metadata": {
            uid: [metadata_cpus(path) for path in paths]
            for uid, paths in metadata.claim_uids().items()
        },
        "stray_files": sorted(
            p.name
            for directory in (cdi.directory, state_dir, *metadata.directory.glob("*/*/"))
            for p in (directory.iterdir() if directory.is_dir() else ())
            if p.suffix == ".tmp"
        ),
    }


def held_cpus(claims: Mapping[str, Any]) -> dict[str, list[frozenset[int]]]:
    """The CPUs of each grant of each claim in a snapshot."""
    return {
        uid: [parse_cpu_list(g["cpus"]) for g in record["grants"]] for uid, record in claims.items()
    }


def check_state(state: Mapping[str, Any], *, every_claim_has_a_spec: bool = True) -> None:
    """The invariants of every cut of a node's books.

    The checkpoint is what the policy holds; no CPU is in two claims; no CPU is lost (every
    grantable CPU is free or held, never both) and none reserved is held; every CDI spec on
    disk is that of a claim held and tells its containers the CPUs the claim holds; nothing
    half-written is left in the CDI or state directory. And unless ``every_claim_has_a_spec`` is
    false, every claim held has its spec: only a crash between the commit and the spec's
    write (or a reboot, which empties the CDI directory) leaves a claim without one, for
    the kubelet's retry to write.
    """
    claims = state["claims"]
    assert state["checkpoint"] == {
        "policy": state["policy"],
        "driver": state["driver"],
        "claims": claims,
    }, "the checkpoint is not what the policy holds"
    owner: dict[int, str] = {}
    for uid, grants in held_cpus(claims).items():
        for cpus in grants:
            assert cpus, f"claim {uid} has a grant without CPUs"
            for cpu in cpus:
                assert cpu not in owner, f"CPU {cpu} is held by claims {owner[cpu]} and {uid}"
                owner[cpu] = uid
    held = frozenset(owner)
    free = parse_cpu_list(state["free"])
    grantable = parse_cpu_list(state["grantable"])
    assert not held & free, f"CPUs {format_cpu_list(held & free)} are both held and free"
    assert held | free == grantable, (
        f"CPUs lost: {format_cpu_list(grantable - held - free)}; "
        f"not grantable: {format_cpu_list((held | free) - grantable)}"
    )
    reserved = parse_cpu_list(state["reserved"])
    assert not held & reserved, f"reserved CPUs {format_cpu_list(held & reserved)} are held"
    assert set(state["specs"]) <= set(claims), "CDI specs of claims nobody holds are left"
    assert set(state["metadata"]) <= set(claims), "device metadata of claims nobody holds is left"
    assert set(state["specs"]) <= set(state["metadata"]), "a CDI spec mounts missing metadata"
    if every_claim_has_a_spec:
        assert set(state["specs"]) == set(claims), "claims held have no CDI spec"
    for uid, cpusets in state["specs"].items():
        assert cpusets == [format_cpu_list(c) for c in held_cpus(claims)[uid]], uid
    for uid, files in state["metadata"].items():
        told = sorted(cpus for file in files for cpus in file)
        assert told == sorted(format_cpu_list(c) for c in held_cpus(claims)[uid]), uid
    assert state["stray_files"] == [], "half-written files are left behind"


# --- the plugin's gRPC socket ---------------------------------------------------------------

DRA_VERSIONS = {
    "v1": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}


@contextlib.contextmanager
def dra_client(socket: Path, version: str = "v1") -> Iterator[tuple[Any, Any]]:
    """The messages module of ``version`` and a stub on the plugin's DRA socket."""
    pb, pb_grpc = DRA_VERSIONS[version]
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        yield pb, pb_grpc.DRAPluginStub(channel)


def grpc_claims(pb: Any, refs: Sequence[ClaimRef]) -> list[Any]:
    return [pb.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]
