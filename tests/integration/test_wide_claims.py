"""Claims of more CPUs than a NUMA node holds, through the real API server, scheduler and the
kubelet's DRA code.

nodedra (topology-aware) reads the NPS4 EPYC-like fixture: two sockets of four NUMA nodes of 16
CPUs, CPU 0 reserved; the test node has the fixture's capacity, so the devices map the node's
allocatable and the scheduler counts a claim's shares against it. A claim from ``nodedra
claim-template`` asks one request per NUMA node, each of an even share, with
``distinctAttribute`` on the NUMA node and ``matchAttribute`` on the package: the scheduler
puts the shares on different nodes of one socket, and nodedra grants each its node's CPUs and
memory (at 1.34 only while the first node the scheduler tries has room: see the test). Where
the API server has DRAConsumableCapacity off (to which ``distinctAttribute`` belongs) it
refuses the template: nothing silently puts two shares on one node.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from nodedra.spreadclaim import spread_template
from nodedra.topology import read_topology
from tests.conftest import KubeletFactory, NodedraFactory
from tests.integration.test_l3_caches import NPS4, create_template_pod, prepared_grants
from tests.integration.test_node_allocatable import (
    accounted,
    claim_name,
    start_nodedra,
    wait_accounted,
    wait_unschedulable,
)
from tests.peers.cluster import create_ready_node, delete_node
from tests.peers.controlplane import APIError, ControlPlane
from tests.peers.kubelet import KubeletHarness
from tests.peers.nodedra_node import granted
from tests.peers.profile import ClusterProfile

CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
NODE_ALLOCATABLE = "DRANodeAllocatableResources"
CAPACITY = {"cpu": "128", "memory": "512Gi", "pods": "110"}
"""The fixture machine's, so that its devices may map the node's allocatable."""


@pytest.fixture
def kubelet(
    control_plane: ControlPlane, kubelet_factory: KubeletFactory
) -> Iterator[KubeletHarness]:
    name = f"wide-{uuid.uuid4().hex[:8]}"
    create_ready_node(control_plane, name, CAPACITY)
    try:
        harness = kubelet_factory(name)
        harness.wait_slice_wipe("")
        yield harness
    finally:
        delete_node(control_plane, name)


def spread(grants: list[dict[str, Any]]) -> tuple[Counter[int], set[int], set[int]]:
    """NUMA node -> CPUs granted there, the packages those CPUs are on, and the memory nodes."""
    topology = read_topology(NPS4)
    cpus = granted(grants)
    per_node = Counter(topology.cpus[c].node for c in cpus)
    packages = {topology.cpus[c].package for c in cpus}
    return per_node, packages, set(granted(grants, "mems"))


def test_a_claim_bigger_than_a_numa_node_is_spread_over_nodes_of_one_socket(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
    cluster_profile: ClusterProfile,
) -> None:
    """24 CPUs and 6Gi (the latency page's example) go 8 CPUs and 2Gi to each of three
    NUMA nodes of one socket; 48 CPUs over four nodes then fit only on the other socket
    (three nodes of the first have 8 CPUs left, and the package must match): 12 on each of
    its nodes."""
    cp = workload_controllers
    if not cluster_profile.on(CONSUMABLE_CAPACITY):
        templates = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
        with pytest.raises(APIError) as refused:
            cp.request("POST", templates, spread_template("wide", 24, 3, "6Gi"))
        assert refused.value.status == 422
        assert "spec.spec.devices.constraints[0]" in str(refused.value)
        return
    start_nodedra(nodedra_factory, cp, kubelet, {"policy": "topology-aware"}, sysfs=NPS4)

    def prepare(name: str, cpus: int, nodes: int, memory: str) -> list[dict[str, Any]]:
        template = spread_template(name, cpus, nodes, memory)
        return prepared_grants(
            cp, namespace, kubelet, nodedra_factory, name=name, template=template
        )

    wide = prepare("wide", 24, 3, "6Gi")
    per_node, (socket,), mems = spread(wide)
    assert sorted(per_node.values()) == [8, 8, 8]
    assert mems == set(per_node), "each share's memory on its own node"
    assert [g["memory"] for g in wide] == [2 << 30] * 3
    if cluster_profile.on(NODE_ALLOCATABLE):  # the node's allocatable counts the whole claim
        pod = wait_accounted(cp, namespace, "wide")
        assert accounted(pod)[claim_name(pod)] == {"cpu": 24, "memory": 6 << 30}

    if cluster_profile.minor == 34:
        # 1.34's allocator adds a device to the constraints before it checks the device's
        # capacity, and keeps it there when the capacity is short: the first NUMA node
        # tried (on the full socket) pins the package, and the claim is never placed.
        # 1.35 checks capacity first.
        create_template_pod(cp, namespace, kubelet.node_name, spread_template("wider", 48, 4))
        assert "cannot allocate all claims" in wait_unschedulable(cp, namespace, "wider")
        return
    wider = prepare("wider", 48, 4, "0")
    per_node, (other,), mems = spread(wider)
    assert other != socket
    assert sorted(per_node.values()) == [12, 12, 12, 12]
    assert mems == set(per_node)
    assert not granted(wide) & granted(wider)
