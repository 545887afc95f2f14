"""Claimed CPUs and memory count against the node: the scheduler's side (KEP-5517).

`nodedra run` publishes devices that map the node's ``cpu`` and ``memory``; the real
kube-scheduler then takes what claims hold out of what ordinary pods may request, and writes
what it accounted for each claim into the pod's status. The node is the test cluster's
(allocatable: 8 CPUs, 16Gi), with the kubelet harness; nodedra reads a 56-CPU fixture
machine, so only the node's allocatable limits what fits. The kubelet's side (the pod's
cgroups) is in test_node_pinning.py, on a real node.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import driver_name
from nodedra.dra.probes import NODE_ALLOCATABLE_FIELD as FIELD
from nodedra.dra.probes import NODE_ALLOCATABLE_FIELD_1_36 as FIELD_1_36
from nodedra.lib.quantity import parse_quantity
from tests.conftest import NODEDRA_SYSFS, KubeletFactory, NodedraFactory
from tests.peers.cluster import (
    NODE_CAPACITY,
    get_pod,
    pod_on,
    poll,
    resource_slices,
    wait_pod_scheduled,
)
from tests.peers.controlplane import ControlPlane
from tests.peers.kubelet import KubeletHarness
from tests.peers.nodedra_node import (
    STATIC,
    TOPOLOGY_AWARE,
    NodedraProcess,
    claim_pod,
    claim_template,
    expected_devices,
)
from tests.peers.profile import ClusterProfile

GATE = "DRANodeAllocatableResources"
NODE_CPUS = int(NODE_CAPACITY["cpu"])
NODE_MEMORY = parse_quantity(NODE_CAPACITY["memory"])
GI = 1 << 30


@pytest.fixture
def kubelet(ready_node: str, kubelet_factory: KubeletFactory) -> KubeletHarness:
    harness = kubelet_factory(ready_node)
    harness.wait_slice_wipe("")
    return harness


def start_nodedra(
    factory: NodedraFactory,
    cp: ControlPlane,
    kubelet: KubeletHarness,
    config: dict[str, Any],
    *,
    sysfs: Path = NODEDRA_SYSFS,
    **settings: Any,
) -> NodedraProcess:
    """nodedra reading ``sysfs`` under ``config`` (CPU 0 reserved unless it says otherwise),
    once the kubelet registered it and its slices hold every device."""
    path = factory.write_config({"reservedCPUs": "0", **config})
    devices = len(expected_devices(sysfs, path)[config["policy"]])
    nodedra = factory(kubelet, sysfs=sysfs, **settings)
    nodedra.wait_serving(cp, kubelet, driver_name(config["policy"]), devices)
    return nodedra


def ordinary_pod(name: str, node: str, requests: Mapping[str, str]) -> dict[str, Any]:
    """A pod without claims that requests ``requests``; only ``node`` fits."""
    container = {"name": "app", "image": "busybox", "resources": {"requests": dict(requests)}}
    return pod_on(node, name, [container])


def create_claim_pod(
    cp: ControlPlane,
    namespace: str,
    node: str,
    name: str,
    driver: str,
    *,
    capacity: Mapping[str, str] | None = None,
    count: int = 1,
) -> None:
    """A pod with a claim from a template of its own."""
    cp.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
        claim_template(name, driver, capacity, count),
    )
    create(cp, namespace, claim_pod(name, node, name))


def wait_accounted(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    """Wait until the pod is bound and the scheduler's account of its claims is in its status."""
    wait_pod_scheduled(cp, namespace, name)
    return poll(
        lambda: pod if accounted(pod := get_pod(cp, namespace, name)) else None,
        30,
        lambda: f"the scheduler's account of the claims in the status of pod {name}",
    )


def create(cp: ControlPlane, namespace: str, pod: Mapping[str, Any]) -> None:
    cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)


def wait_unschedulable(cp: ControlPlane, namespace: str, name: str) -> str:
    """Wait until the scheduler says why the pod does not fit; its message."""
    seen: list[dict[str, Any]] = []

    def check() -> str | None:
        nonlocal seen
        pod = get_pod(cp, namespace, name)
        assert not pod["spec"].get("nodeName"), f"pod {name} was bound to a node"
        seen = (pod.get("status") or {}).get("conditions") or []
        for condition in seen:
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                message: str = condition["message"]
                return message
        return None

    return poll(check, 60, lambda: f"pod {name} unschedulable; its conditions: {seen}")


def accounted(pod: Mapping[str, Any]) -> dict[str, dict[str, Fraction]]:
    """What the scheduler wrote into the pod's status: claim -> resource -> amount (a list
    ``mapping`` of names and quantities from 1.37, a map ``resources`` in 1.36)."""
    return {
        status["resourceClaimName"]: {
            name: parse_quantity(quantity)
            for name, quantity in (
                status["resources"].items()
                if "resources" in status
                else ((m["name"], m["quantity"]) for m in status.get("mapping") or [])
            )
        }
        for status in pod["status"].get("nodeAllocatableResourceClaimStatuses") or []
    }


def claim_name(pod: Mapping[str, Any]) -> str:
    (status,) = pod["status"]["resourceClaimStatuses"]
    name: str = status["resourceClaimName"]
    return name


def published_devices(cp: ControlPlane, node: str, driver: str) -> list[dict[str, Any]]:
    return [d for s in resource_slices(cp, node, driver) for d in s["spec"]["devices"]]


def assert_promised_twice(
    cp: ControlPlane, namespace: str, node: str, driver: str, **claim: Any
) -> None:
    """Without mappings: no device maps anything, the scheduler accounts nothing for a
    claim, and a pod may request every CPU of the node beside it."""
    assert not any(FIELD in d or FIELD_1_36 in d for d in published_devices(cp, node, driver))
    create_claim_pod(cp, namespace, node, "claimer", driver, **claim)
    claimer = wait_pod_scheduled(cp, namespace, "claimer")
    assert claim_name(claimer)
    assert accounted(claimer) == {}
    left = NODE_CPUS * 1000 - requested_millicpus(cp, node)
    create(cp, namespace, ordinary_pod("everything", node, {"cpu": f"{left}m"}))
    wait_pod_scheduled(cp, namespace, "everything")


def requested_millicpus(cp: ControlPlane, node: str) -> int:
    """What the pods bound to ``node`` request of its CPUs (other tests' DaemonSets may have
    put a pod there), in millicores."""
    pods = cp.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}")["items"]
    return sum(
        int(parse_quantity(c.get("resources", {}).get("requests", {}).get("cpu", "0")) * 1000)
        for pod in pods
        if pod["status"].get("phase") not in ("Succeeded", "Failed")
        for c in pod["spec"]["containers"]
    )


def test_claimed_cpus_and_memory_leave_the_rest_to_ordinary_pods(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
    cluster_profile: ClusterProfile,
) -> None:
    """8 CPUs and 16Gi allocatable, a claim of 3 CPUs and 4Gi: 5 CPUs and 12Gi are left, and
    the scheduler refuses more with its own reason. Where the API server lacks the gate,
    the node's CPUs are promised twice, and nodedra says so in a metric."""
    cp, node = workload_controllers, kubelet.node_name
    nodedra = start_nodedra(nodedra_factory, cp, kubelet, {"policy": "topology-aware"})
    on = cluster_profile.on(GATE)
    assert nodedra.metric("nodedra_api_feature_gate", {"gate": GATE}) == int(on)
    if not on:
        assert_promised_twice(cp, namespace, node, TOPOLOGY_AWARE, capacity={"cpu": "3"})
        return
    devices = published_devices(cp, node, TOPOLOGY_AWARE)
    field = cluster_profile.node_allocatable_field
    # Each NUMA node's huge pages too, of the sizes it has (the fixture's last node has none).
    mapped = [sorted(d[field]) for d in devices]
    assert mapped == [
        ["cpu", "hugepages-1Gi", "hugepages-2Mi", "memory"],
        ["cpu", "hugepages-2Mi", "memory"],
        ["cpu", "hugepages-1Gi", "memory"],
        ["cpu", "memory"],
    ], devices

    create_claim_pod(
        cp, namespace, node, "claimer", TOPOLOGY_AWARE, capacity={"cpu": "3", "memory": "4Gi"}
    )
    pod = wait_accounted(cp, namespace, "claimer")
    (claim,) = accounted(pod).values()
    # The huge pages of the device's sizes are accounted too, as none.
    assert {name: n for name, n in claim.items() if n} == {"cpu": 3, "memory": 4 * GI}, claim
    (status,) = pod["status"]["nodeAllocatableResourceClaimStatuses"]
    assert status["containers"] == ["demo"]

    left_cpus, left_memory = NODE_CPUS - 3, NODE_MEMORY - 4 * GI
    create(cp, namespace, ordinary_pod("too-many-cpus", node, {"cpu": str(left_cpus + 1)}))
    assert "Insufficient cpu" in wait_unschedulable(cp, namespace, "too-many-cpus")
    create(cp, namespace, ordinary_pod("too-much-memory", node, {"memory": str(left_memory + 1)}))
    assert "Insufficient memory" in wait_unschedulable(cp, namespace, "too-much-memory")
    # A claim too: the device has 14 CPUs, the node's allocatable 5 left.
    create_claim_pod(
        cp, namespace, node, "too-big-a-claim", TOPOLOGY_AWARE, capacity={"cpu": str(left_cpus + 1)}
    )
    assert "Insufficient cpu" in wait_unschedulable(cp, namespace, "too-big-a-claim")
    # The node has no huge pages to give (its allocatable has none), whatever a device offers.
    create_claim_pod(
        cp,
        namespace,
        node,
        "huge-pages",
        TOPOLOGY_AWARE,
        capacity={"cpu": "1", "hugepages_2Mi": "2Mi"},
    )
    assert "Insufficient hugepages-2Mi" in wait_unschedulable(cp, namespace, "huge-pages")

    create(
        cp,
        namespace,
        ordinary_pod("the-rest", node, {"cpu": str(left_cpus), "memory": str(left_memory)}),
    )
    assert wait_pod_scheduled(cp, namespace, "the-rest")["spec"]["nodeName"] == node


def test_static_claims_count_one_cpu_per_device(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
    cluster_profile: ClusterProfile,
) -> None:
    cp, node = workload_controllers, kubelet.node_name
    start_nodedra(nodedra_factory, cp, kubelet, {"policy": "static"})
    if not cluster_profile.on(GATE):
        assert_promised_twice(cp, namespace, node, STATIC, count=2)
        return

    create_claim_pod(cp, namespace, node, "claimer", STATIC, count=2)
    pod = wait_accounted(cp, namespace, "claimer")
    assert accounted(pod) == {claim_name(pod): {"cpu": 2}}
    create(cp, namespace, ordinary_pod("too-many", node, {"cpu": str(NODE_CPUS - 1)}))
    assert "Insufficient cpu" in wait_unschedulable(cp, namespace, "too-many")
    create(cp, namespace, ordinary_pod("the-rest", node, {"cpu": str(NODE_CPUS - 2)}))
    wait_pod_scheduled(cp, namespace, "the-rest")


def test_turned_off_the_node_s_cpus_are_promised_twice(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
) -> None:
    """``nodeAllocatable: false``: what the mappings prevent, for clusters that account CPUs
    otherwise. No device maps anything, and a pod may request every CPU beside a claim."""
    cp, node = workload_controllers, kubelet.node_name
    start_nodedra(
        nodedra_factory, cp, kubelet, {"policy": "topology-aware", "nodeAllocatable": False}
    )
    assert_promised_twice(cp, namespace, node, TOPOLOGY_AWARE, capacity={"cpu": "3"})


def test_a_claim_with_mapped_devices_is_not_shared_by_two_pods(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
    cluster_profile: ClusterProfile,
) -> None:
    """The scheduler keeps a second pod off a claim whose devices map node resources (the
    first pod's cgroups already hold them), saying which claim and why. Without mappings
    both pods get the claim."""
    cp, node = workload_controllers, kubelet.node_name
    start_nodedra(nodedra_factory, cp, kubelet, {"policy": "topology-aware"})
    cp.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared"},
            "spec": claim_template("shared", TOPOLOGY_AWARE, {"cpu": "1"})["spec"]["spec"],
        },
    )
    for name in ("first", "second"):
        pod = claim_pod(name, node, "unused")
        pod["spec"]["resourceClaims"] = [{"name": "cpus", "resourceClaimName": "shared"}]
        create(cp, namespace, pod)
        if name == "first":
            wait_pod_scheduled(cp, namespace, name)
    if not cluster_profile.on(GATE):
        assert wait_pod_scheduled(cp, namespace, "second")["spec"]["nodeName"] == node
        return
    message = wait_unschedulable(cp, namespace, "second")
    assert "node allocatable resource claim shared" in message
    if cluster_profile.minor > 36:
        assert "has a mapped device and cannot be shared across pods" in message
    else:
        assert "is already used by another pod" in message
