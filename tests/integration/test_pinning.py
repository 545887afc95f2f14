"""Container pinning end to end: ``nodedra run`` between the kubelet's DRA code and the runtime.

The claims are the real scheduler's, prepared through the kubelet's own DRA manager (the
kubelet harness); the runtime side is NRI's adaptation, the code containerd embeds (the NRI
runtime harness), at every NRI version the supported containerd releases vendor. The test
plays the rest of the kubelet: it starts the pod's sandbox and container in the runtime with
the CDI devices the kubelet got, and the environment the claim's CDI spec adds (the runtime
applies CDI edits before it asks NRI plugins). What each container runs on is the runtime's
model, which changes exactly as containerd's would.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodedra.dra import claim_of_cdi_device
from nodedra.resmgr import Checkpoint
from nodedra.topology import format_cpu_list, parse_cpu_list, read_topology
from tests.conftest import NODEDRA_SYSFS, KubeletFactory, NodedraFactory
from tests.peers.cluster import (
    get_claim,
    get_pod,
    pod_claim_name,
    pod_on,
    poll,
    wait_pod_scheduled,
)
from tests.peers.controlplane import ControlPlane
from tests.peers.kubelet import KubeletError, KubeletHarness
from tests.peers.nodedra_node import (
    TOPOLOGY_AWARE,
    NodedraProcess,
    start_claim_pod,
)
from tests.peers.nri_protocol import BulkSpec, ContainerSpec, PodSpec, Resources, env_name
from tests.peers.nri_runtime import NRIFactory, NRIRuntime
from tests.peers.peer_groups import NRI_VERSIONS

DEVICES = 4
ONLINE = "0-55"
ISOLATED = read_topology(NODEDRA_SYSFS).isolated
"""The fixture machine's CPUs (tests/fixtures/sysfs/two-socket-smt2-numa4)."""
RESERVED = "0"
"""What the test configuration reserves: CPU 0 is always in the shared pool."""


@pytest.fixture(params=NRI_VERSIONS)
def nri_version(request: pytest.FixtureRequest) -> str:
    version: str = request.param
    return version


@pytest.fixture
def kubelet(ready_node: str, kubelet_factory: KubeletFactory) -> KubeletHarness:
    harness = kubelet_factory(ready_node)
    harness.wait_slice_wipe("")
    return harness


@dataclass
class Node:
    """One node: the kubelet's DRA code, the runtime, and nodedra between them."""

    cp: ControlPlane
    namespace: str
    kubelet: KubeletHarness
    runtime: NRIRuntime
    factory: NodedraFactory
    _ids: Iterator[int] = field(default_factory=itertools.count)
    _nodedra: NodedraProcess | None = None

    @property
    def nodedra(self) -> NodedraProcess:
        """The instance of nodedra started last."""
        assert self._nodedra is not None
        return self._nodedra

    def start_nodedra(self, pinning: str = "required") -> NodedraProcess:
        """A new instance of nodedra on the node, serving and synchronized."""
        self._nodedra = self.factory(self.kubelet, pinning=pinning, nri_socket=self.runtime.socket)
        self._nodedra.wait_serving(self.cp, self.kubelet, TOPOLOGY_AWARE, DEVICES)
        return self._nodedra

    def plain_container(self, name: str) -> str:
        """A pod without claims and its container, created in the runtime; its ID."""
        pod_id = f"sb-{name}"
        self.runtime.run_pod(PodSpec(pod_id, name=name, namespace=self.namespace, uid=name))
        ctr = ContainerSpec(f"ctr-{name}", pod_id, name="main")
        self.runtime.create_container(ctr, start=True)
        return ctr.id

    def claim_pod(self, name: str, capacity: dict[str, str]) -> tuple[str, str]:
        """A pod whose claim the scheduler allocated and the kubelet prepared, and its
        container created in the runtime as the kubelet would: (claim UID, container ID)."""
        claim = start_claim_pod(self.cp, self.namespace, self.kubelet.node_name, name, capacity)
        ids = self.kubelet.prepare(self.namespace, name)["demo"]
        pod = get_pod(self.cp, self.namespace, name)
        return claim["metadata"]["uid"], self.create(pod["metadata"]["uid"], name, ids)

    def create(
        self, pod_uid: str, name: str, cdi_ids: Sequence[str], env: Sequence[str] = ()
    ) -> str:
        """The kubelet's CreateContainer of pod ``name`` with these CDI devices."""
        pod_id = f"sb-{name}"
        if pod_id not in {p.id for p in self.runtime.pods()}:
            self.runtime.run_pod(PodSpec(pod_id, name=name, namespace=self.namespace, uid=pod_uid))
        ctr = ContainerSpec(
            f"ctr-{name}-{next(self._ids)}",
            pod_id,
            name="demo",
            env=[*cdi_env(self.factory, cdi_ids), *env],
            cdi_devices=list(cdi_ids),
        )
        self.runtime.create_container(ctr, start=True)
        return ctr.id

    def grants(self, claim_uid: str) -> tuple[frozenset[int], frozenset[int]]:
        """The CPUs and memory nodes the checkpoint records for a claim."""
        state = Checkpoint(self.factory.dirs.checkpoint).load()
        assert state is not None
        grants = state.claims[claim_uid]["grants"]
        cpus = frozenset().union(*(parse_cpu_list(g["cpus"]) for g in grants))
        mems = frozenset().union(*(parse_cpu_list(g["mems"]) for g in grants))
        return cpus, mems

    def cpus_of(self, container_id: str) -> frozenset[int]:
        return parse_cpu_list(self.runtime.container(container_id).cpus)

    def shared(self) -> frozenset[int]:
        """What containers without claims should run on now: online less every claim's and
        less the fixture's isolated CPUs (kept for claims)."""
        state = Checkpoint(self.factory.dirs.checkpoint).load()
        assert state is not None
        taken = frozenset().union(
            *(parse_cpu_list(g["cpus"]) for c in state.claims.values() for g in c["grants"])
        )
        return parse_cpu_list(ONLINE) - taken - ISOLATED

    def wait_cpus(self, container_id: str, expected: frozenset[int]) -> None:
        seen: frozenset[int] = frozenset()

        def check() -> bool | None:
            nonlocal seen
            seen = self.cpus_of(container_id)
            return True if seen == expected else None

        poll(
            check,
            30,
            lambda: (
                f"{container_id} on CPUs {format_cpu_list(expected)}, "
                f"runs on {format_cpu_list(seen)}"
            ),
        )


def cdi_env(factory: NodedraFactory, cdi_ids: Sequence[str]) -> list[str]:
    """The environment nodedra's CDI specs of these devices add to a container (other
    drivers' devices have specs of their own, elsewhere)."""
    env = []
    for qualified in cdi_ids:
        device = claim_of_cdi_device(qualified)
        if device is None or device.driver != TOPOLOGY_AWARE:
            continue
        spec = yaml.safe_load(factory.dirs.spec_path(device.driver, device.uid).read_text())
        (found,) = [d for d in spec["devices"] if d["name"] == f"claim-{device.uid}-{device.index}"]
        env += found["containerEdits"]["env"]
    return env


@pytest.fixture
def node(  # noqa: PLR0917 (fixtures)
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
    nri_runtime_factory: NRIFactory,
    nri_version: str,
) -> Node:
    runtime = nri_runtime_factory(nri_version, online_cpus=ONLINE, online_mems="0-3")
    nodedra_factory.write_config({"policy": "topology-aware", "reservedCPUs": RESERVED})
    node = Node(workload_controllers, namespace, kubelet, runtime, nodedra_factory)
    node.start_nodedra()
    return node


def test_claimed_cpus_are_the_containers_and_no_one_elses(node: Node) -> None:
    """A claim pins its container; containers without claims give its CPUs up while it is
    prepared and get them back when it is unprepared."""
    plain = node.plain_container("plain")
    # Nothing claimed: every CPU but the fixture's isolated ones, which are kept for claims.
    assert node.cpus_of(plain) == node.shared() == parse_cpu_list(ONLINE) - ISOLATED

    uid, claimed = node.claim_pod("claimer", {"cpu": "4", "memory": "64Mi"})
    cpus, mems = node.grants(uid)
    assert len(cpus) == 4
    container = node.runtime.container(claimed)
    assert parse_cpu_list(container.cpus) == cpus
    assert parse_cpu_list(container.mems) == mems
    # Told when the claim was prepared, before its container even existed.
    node.wait_cpus(plain, node.shared())
    assert not node.cpus_of(plain) & cpus
    assert parse_cpu_list(RESERVED) <= node.cpus_of(plain)

    # The kubelet stops the pod's container, then unprepares the claim.
    node.runtime.stop_container(claimed)
    node.runtime.remove_container(claimed)
    node.kubelet.unprepare(node.namespace, "claimer")
    node.wait_cpus(plain, parse_cpu_list(ONLINE) - ISOLATED)
    assert node.nodedra.metric("nodedra_nri_connected") == 1
    assert node.nodedra.metric("nodedra_pinned_containers") == 0


def test_the_kubelet_cannot_move_a_pinned_container(node: Node) -> None:
    """UpdateContainerResources (a CPU manager's, say) gets our cpuset re-asserted."""
    uid, claimed = node.claim_pod("claimer", {"cpu": "2"})
    cpus, _ = node.grants(uid)
    answer = node.runtime.update_container(claimed, Resources(cpus=ONLINE, shares=512))
    assert parse_cpu_list(answer.applied.cpus) == cpus
    assert answer.applied.shares == 512, "the rest of the kubelet's update stands"
    assert node.cpus_of(claimed) == cpus
    # Only a CPU manager other than none sets cpusets: said, and counted.
    assert "its CPU manager policy is not none" in node.nodedra.log_text()
    assert node.nodedra.metric("nodedra_cpu_manager_conflicts_total") == 1


def test_a_container_naming_another_pods_claim_gets_the_shared_pool(node: Node) -> None:
    """A forged marker (the environment variable of another pod's claim) gets nothing."""
    uid, _ = node.claim_pod("owner", {"cpu": "3"})
    cpus, _ = node.grants(uid)
    forged = node.create("intruder-uid", "intruder", [], env=[f"{env_name(uid, 0)}=0-55"])
    assert node.cpus_of(forged) == node.shared()
    assert not node.cpus_of(forged) & cpus
    assert "not reserved for its pod" in node.nodedra.log_text()
    assert node.nodedra.metric("nodedra_unreserved_claims_total") == 1


def test_other_drivers_devices_in_a_container_change_nothing(node: Node) -> None:
    """A container with a claim of ours and a device of another driver: our CPUs."""
    uid, _ = node.claim_pod("mixed", {"cpu": "2"})
    cpus, _ = node.grants(uid)
    pod = get_pod(node.cp, node.namespace, "mixed")
    ours = f"{TOPOLOGY_AWARE}/device=claim-{uid}-0"
    both = node.create(pod["metadata"]["uid"], "mixed", [ours, "gpu.example.com/gpu=gpu-0"])
    assert node.cpus_of(both) == cpus


def test_synchronize_of_a_thousand_containers_gives_each_the_shared_pool(node: Node) -> None:
    """Containers that ran before nodedra connected are brought to the shared pool."""
    node.nodedra.terminate()
    node.runtime.add(bulk=BulkSpec(containers=1000, pods=50, annotation_bytes=4096))
    syncs = len(node.runtime.syncs())
    node.start_nodedra()
    (sync,) = node.runtime.wait_sync(syncs + 1)[syncs:]
    assert sync.split, "the runtime split the state into chunks (more)"
    assert sync.containers >= 1000
    shared = format_cpu_list(node.shared())
    bulk = [c for c in node.runtime.containers() if c.id.startswith("bulk-")]
    assert len(bulk) == 1000
    assert {c.cpus for c in bulk} == {shared}
    print(f"\nSynchronize of {sync.containers} containers in {len(sync.messages)} messages:")
    print(f"{sync.ns / 1e6:.1f} ms in the runtime (transport and nodedra's handling)")


def test_a_runtime_restart_is_reconnected_and_resynchronized(node: Node) -> None:
    uid, claimed = node.claim_pod("claimer", {"cpu": "2"})
    cpus, _ = node.grants(uid)
    plain = node.plain_container("plain")
    syncs = len(node.runtime.syncs())
    node.runtime.restart(down=1.0)
    node.runtime.wait_sync(syncs + 1, timeout=60)
    assert node.cpus_of(claimed) == cpus
    assert node.cpus_of(plain) == node.shared()
    late = node.plain_container("late")
    assert node.cpus_of(late) == node.shared()


def test_a_nodedra_restart_keeps_the_pinning_and_repairs_what_it_missed(node: Node) -> None:
    uid, claimed = node.claim_pod("claimer", {"cpu": "2"})
    cpus, _ = node.grants(uid)
    assert node.nodedra.terminate() == 0
    # Created while nodedra is away: the runtime goes on without it, unpinned.
    missed = node.plain_container("missed")
    assert node.cpus_of(missed) != node.shared()
    syncs = len(node.runtime.syncs())
    node.start_nodedra()
    node.runtime.wait_sync(syncs + 1)
    assert node.cpus_of(claimed) == cpus
    assert node.cpus_of(missed) == node.shared()


def test_claims_wait_for_the_runtime_by_default(node: Node) -> None:
    """Without the runtime, --pinning=required refuses claims: nothing would pin them."""
    claim = start_claim_pod(node.cp, node.namespace, node.kubelet.node_name, "early", {"cpu": "1"})
    node.runtime.stop()
    with pytest.raises(KubeletError, match="not connected to the container runtime"):
        node.kubelet.prepare(node.namespace, "early")
    state = Checkpoint(node.factory.dirs.checkpoint).load()
    assert state is not None
    assert claim["metadata"]["uid"] not in state.claims, "refused, so nothing allocated"
    node.runtime.start()
    node.runtime.wait_sync(1, timeout=60)
    ids = node.kubelet.prepare(node.namespace, "early")["demo"]
    assert ids


def template(name: str, requests: dict[str, dict[str, str]], numa: int | None = None) -> Any:
    """A ResourceClaimTemplate of topology-aware requests (name -> consumed capacity)."""
    selectors = (
        [{"cel": {"expression": f'device.attributes["resource.kubernetes.io"].numaNode == {numa}'}}]
        if numa is not None
        else []
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": request,
                            "exactly": {
                                "deviceClassName": TOPOLOGY_AWARE,
                                "capacity": {"requests": capacity},
                                "selectors": selectors,
                            },
                        }
                        for request, capacity in requests.items()
                    ]
                }
            }
        },
    }


def pod_of(name: str, node: str, containers: dict[str, str | None]) -> Any:
    """A pod whose containers use the claim of template ``name`` (container -> request)."""
    return pod_on(
        node,
        name,
        [
            {
                "name": container,
                "image": "busybox",
                "resources": {
                    "claims": [{"name": "cpus", **({"request": request} if request else {})}]
                },
            }
            for container, request in containers.items()
        ],
        [{"name": "cpus", "resourceClaimTemplateName": name}],
    )


def start_pod(node: Node, name: str, tpl: Any, containers: dict[str, str | None]) -> Any:
    """Create the template and the pod; once scheduled, the kubelet prepares it."""
    claims = f"/apis/resource.k8s.io/v1/namespaces/{node.namespace}/resourceclaimtemplates"
    node.cp.request("POST", claims, tpl)
    node.cp.request(
        "POST",
        f"/api/v1/namespaces/{node.namespace}/pods",
        pod_of(name, node.kubelet.node_name, containers),
    )
    pod = wait_pod_scheduled(node.cp, node.namespace, name)
    claim_name = pod_claim_name(pod, "cpus")
    assert claim_name is not None, pod.get("status")
    return pod, get_claim(node.cp, node.namespace, claim_name)


def test_two_containers_holding_different_results_of_one_claim(node: Node) -> None:
    """A container that names one request of a claim gets only that result's CPUs."""
    pod, claim = start_pod(
        node,
        "split",
        template("split", {"a": {"cpu": "2"}, "b": {"cpu": "3"}}),
        {"first": "a", "second": "b"},
    )
    uid = claim["metadata"]["uid"]
    ids = node.kubelet.prepare(node.namespace, "split")
    assert ids == {
        "first": [f"{TOPOLOGY_AWARE}/device=claim-{uid}-0"],
        "second": [f"{TOPOLOGY_AWARE}/device=claim-{uid}-1"],
    }
    state = Checkpoint(node.factory.dirs.checkpoint).load()
    assert state is not None
    first, second = (parse_cpu_list(g["cpus"]) for g in state.claims[uid]["grants"])
    pod_uid = pod["metadata"]["uid"]
    one = node.create(pod_uid, "split", ids["first"])
    two = node.create(pod_uid, "split", ids["second"])
    assert (node.cpus_of(one), node.cpus_of(two)) == (first, second)
    assert (len(first), len(second)) == (2, 3)
    assert not first & second


def test_two_claims_on_one_numa_node_get_cpus_of_their_own(node: Node) -> None:
    pods = [
        start_pod(node, name, template(name, {"cpus": {"cpu": "3"}}, numa=0), {"demo": None})
        for name in ("left", "right")
    ]
    containers = []
    for (pod, claim), name in zip(pods, ("left", "right"), strict=True):
        assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "cpudevnuma000"
        ids = node.kubelet.prepare(node.namespace, name)["demo"]
        containers.append(node.create(pod["metadata"]["uid"], name, ids))
    left, right = (node.runtime.container(c) for c in containers)
    assert not parse_cpu_list(left.cpus) & parse_cpu_list(right.cpus)
    assert (len(parse_cpu_list(left.cpus)), len(parse_cpu_list(right.cpus))) == (3, 3)
    assert left.mems == right.mems == "0"


def test_best_effort_serves_claims_without_the_runtime_and_repairs_at_sync(
    node: Node,
) -> None:
    """With --pinning=best-effort the kubelet is served while the runtime is away; the
    containers it starts meanwhile are repaired when the runtime connects."""
    node.nodedra.terminate()
    node.runtime.stop()
    best_effort = node.factory(node.kubelet, pinning="best-effort", nri_socket=node.runtime.socket)

    def served_but_not_pinned() -> bool:
        status, body = best_effort.readyz()
        checks = json.loads(body)
        return status == 503 and checks["registered"] and checks["published"] is True

    best_effort.process.wait_until(served_but_not_pinned, 60, "registered, not pinning")
    assert "containers are not pinned" in best_effort.readyz()[1]
    claim = start_claim_pod(node.cp, node.namespace, node.kubelet.node_name, "early", {"cpu": "2"})
    ids = node.kubelet.prepare(node.namespace, "early")["demo"]
    cpus, _ = node.grants(claim["metadata"]["uid"])
    pod_uid = get_pod(node.cp, node.namespace, "early")["metadata"]["uid"]
    # The runtime comes back with the claim's container already running, unpinned.
    node.runtime.start()
    node.runtime.run_pod(PodSpec("sb-early", name="early", namespace=node.namespace, uid=pod_uid))
    node.runtime.add(
        containers=[
            ContainerSpec(
                "ctr-early",
                "sb-early",
                name="demo",
                env=cdi_env(node.factory, ids),
                cdi_devices=ids,
            )
        ]
    )
    node.runtime.wait_sync(1, timeout=60)
    assert node.cpus_of("ctr-early") == cpus


def share_claim(node: Node, owner: str, sharer: str) -> str:
    """Pod ``sharer`` uses the claim of pod ``owner`` (after its prepare); its UID once the
    claim is reserved for it too.

    The reservation is written as the scheduler writes it for a pod that shares a claim.
    The scheduler itself does so only where no device of the claim maps node-allocatable
    resources (1.34, or DRANodeAllocatableResources off): at 1.37 with every gate on, it
    refuses to share such a claim, but a node upgraded from 1.34 keeps what it shared.
    """
    claim_name = pod_claim_name(get_pod(node.cp, node.namespace, owner), "cpus")
    assert claim_name is not None
    container = {"name": "demo", "image": "busybox", "resources": {"claims": [{"name": "cpus"}]}}
    pod = pod_on(
        node.kubelet.node_name,
        sharer,
        [container],
        [{"name": "cpus", "resourceClaimName": claim_name}],
    )
    created = node.cp.request("POST", f"/api/v1/namespaces/{node.namespace}/pods", pod)
    uid: str = created["metadata"]["uid"]
    path = f"/apis/resource.k8s.io/v1/namespaces/{node.namespace}/resourceclaims/{claim_name}"
    claim = node.cp.request("GET", path)
    claim["status"]["reservedFor"].append({"resource": "pods", "name": sharer, "uid": uid})
    node.cp.request("PUT", f"{path}/status", claim)
    return uid


def test_a_pod_sharing_a_claim_created_while_nodedra_is_away_gets_its_cpus(node: Node) -> None:
    """Reserved for a second pod after its prepare; the runtime creates that pod's container
    while nodedra is not connected. The Synchronize reads whom the claim is for now."""
    claim = start_claim_pod(node.cp, node.namespace, node.kubelet.node_name, "owner", {"cpu": "2"})
    ids = node.kubelet.prepare(node.namespace, "owner")["demo"]
    owner_uid = get_pod(node.cp, node.namespace, "owner")["metadata"]["uid"]
    first = node.create(owner_uid, "owner", ids)
    cpus, _ = node.grants(claim["metadata"]["uid"])
    sharer_uid = share_claim(node, "owner", "sharer")
    assert node.nodedra.terminate() == 0
    second = node.create(sharer_uid, "sharer", ids)
    syncs = len(node.runtime.syncs())
    node.start_nodedra()
    node.runtime.wait_sync(syncs + 1)
    node.wait_cpus(second, cpus)
    assert node.cpus_of(first) == cpus
    node.runtime.restart(down=0.5)
    node.runtime.wait_sync(syncs + 2, timeout=60)
    assert node.cpus_of(second) == cpus, "and it stays there through a runtime restart"


def test_a_container_created_during_a_synchronize_is_pinned_at_its_start(node: Node) -> None:
    """A runtime that creates a container while it synchronizes nodedra tells it neither in
    the Synchronize nor by CreateContainer (containerd#13698, cri-o#10090): the container's
    StartContainer is the first nodedra hears of it, and moves it onto its claim; a container
    without claims so created leaves the claim's CPUs."""
    claim = start_claim_pod(node.cp, node.namespace, node.kubelet.node_name, "late", {"cpu": "2"})
    ids = node.kubelet.prepare(node.namespace, "late")["demo"]
    cpus, _ = node.grants(claim["metadata"]["uid"])
    uid = get_pod(node.cp, node.namespace, "late")["metadata"]["uid"]
    node.runtime.run_pod(PodSpec("sb-late", name="late", namespace=node.namespace, uid=uid))
    node.runtime.run_pod(PodSpec("sb-quiet", name="quiet", namespace=node.namespace, uid="q"))
    late = ContainerSpec(
        "ctr-late", "sb-late", name="demo", env=cdi_env(node.factory, ids), cdi_devices=ids
    )
    quiet = ContainerSpec("ctr-quiet", "sb-quiet", name="main")
    for spec in (late, quiet):
        created = node.runtime.create_container(spec, unseen=True)
        assert created.container.cpus == "", "NRI had no say in its creation"
        node.runtime.start_container(spec.id)
    node.wait_cpus("ctr-late", cpus)
    node.wait_cpus("ctr-quiet", node.shared())
    assert not node.shared() & cpus
    assert "started without our having seen it created" in node.nodedra.log_text()


HOSTILE_TEXT = st.text(max_size=40)
CPUSET_NAME = st.one_of(
    HOSTILE_TEXT,
    st.builds(lambda s: f"DRA_CPUSET_{s}", HOSTILE_TEXT),
    st.builds(lambda n: f"DRA_CPUSET_x_{'9' * n}", st.integers(0, 6000)),
)


@st.composite
def hostile_containers(draw: st.DrawFn, claim_uid: str) -> tuple[PodSpec, ContainerSpec]:
    """A pod and a container made of untrusted names, values and sizes: environment
    names as images' ENV may have them, CDI device names, labels, annotations, a cpuset
    the runtime reports, and the claim of another pod named in every way we read."""
    pod = PodSpec(
        "",  # the test numbers pods and containers
        name=draw(HOSTILE_TEXT),
        namespace=draw(HOSTILE_TEXT),
        uid=draw(st.one_of(HOSTILE_TEXT, st.uuids().map(str))),
        labels=draw(st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT, max_size=3)),
        annotations=draw(st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT, max_size=3)),
    )
    env_names = draw(st.lists(CPUSET_NAME, max_size=5))
    env_names.append(env_name(claim_uid, draw(st.integers(0, 10**30))))
    env = [f"{name}={draw(HOSTILE_TEXT)}" for name in env_names]
    index = draw(
        st.one_of(st.integers(0, 40).map(str), st.builds(lambda n: "1" * n, st.integers(1, 6000)))
    )
    cdi = draw(
        st.lists(
            st.one_of(
                HOSTILE_TEXT,
                st.just(f"{TOPOLOGY_AWARE}/device=claim-{claim_uid}-{index}"),
                st.builds(lambda s: f"{TOPOLOGY_AWARE}/device=claim-{s}", HOSTILE_TEXT),
            ),
            max_size=4,
        )
    )
    container = ContainerSpec(
        "",
        "",
        name=draw(HOSTILE_TEXT),
        env=env,
        cdi_devices=cdi,
        labels=draw(st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT, max_size=3)),
        annotations={"big": "x" * draw(st.integers(0, 1 << 16))},
        # The runtime checks a cpuset's syntax itself (the unit tests feed odd ones).
        resources=Resources(cpus=draw(st.sampled_from(["", "0-3", "0-55", "1,5-7"]))),
    )
    return pod, container


def test_no_container_can_switch_pinning_off_for_the_node(node: Node) -> None:
    """Whatever a container is made of, the runtime's events about it succeed, it gets the
    shared pool, the connection stays, and the claim's container keeps its CPUs: through
    CreateContainer, UpdateContainer and a Synchronize of them all."""
    uid, claimed = node.claim_pod("claimer", {"cpu": "2"})
    cpus, _ = node.grants(uid)
    created: list[str] = []
    serials = itertools.count()

    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(hostile=hostile_containers(uid))
    def one_container(hostile: tuple[PodSpec, ContainerSpec]) -> None:
        serial = next(serials)
        pod = dataclasses.replace(hostile[0], id=f"sb-h{serial}")
        container = dataclasses.replace(hostile[1], id=f"ctr-h{serial}", pod=pod.id)
        node.runtime.run_pod(pod)
        result = node.runtime.create_container(container, start=True)
        created.append(container.id)
        assert parse_cpu_list(result.container.cpus) == node.shared()
        update = node.runtime.update_container(container.id, Resources(cpus="0-3"))
        assert parse_cpu_list(update.container.cpus) == node.shared()

    one_container()
    (plugin,) = [p for p in node.runtime.plugins() if not p.closed]
    assert plugin.synchronized
    assert node.cpus_of(claimed) == cpus
    syncs = len(node.runtime.syncs())
    node.runtime.restart(down=0.5)
    node.runtime.wait_sync(syncs + 1, timeout=60)
    assert node.cpus_of(claimed) == cpus
    assert {cid: node.cpus_of(cid) for cid in created} == dict.fromkeys(created, node.shared())
    late = node.plain_container("late")
    assert node.cpus_of(late) == node.shared()
    assert node.nodedra.metric("nodedra_container_errors_total") == 0, "no parser raised"
