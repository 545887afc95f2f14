"""Whole physical cores (``fullPhysicalCores``) through the real API server, scheduler and
the kubelet's DRA code.

nodedra reads the 56-CPU fixture machine (28 cores of two threads); the node is the test
cluster's (allocatable: 8 CPUs), with the kubelet harness. Static: a device is a core, the
scheduler counts each core as its two threads against the node, and a claim of 20 cores is
prepared as 40 CPUs, more than 32 allocation results of single CPUs could hold, and pinned
so by NRI's adaptation.
Topology-aware: the scheduler rounds a claim of 3 CPUs up to a core's step, 4, and counts 4.
"""

from __future__ import annotations

from typing import Any

from nodedra.policy import make_policy, parse_config
from nodedra.topology import parse_cpu_list, read_topology
from tests.conftest import NODEDRA_SYSFS, NodedraFactory
from tests.integration.test_node_allocatable import (
    GATE,
    NODE_CPUS,
    accounted,
    claim_name,
    create,
    create_claim_pod,
    kubelet,  # noqa: F401 (fixture)
    ordinary_pod,
    published_devices,
    start_nodedra,
    wait_accounted,
    wait_unschedulable,
)
from tests.peers.cluster import wait_pod_scheduled
from tests.peers.controlplane import ControlPlane
from tests.peers.kubelet import KubeletHarness
from tests.peers.nodedra_node import STATIC, TOPOLOGY_AWARE, saved_grants
from tests.peers.nri_protocol import ContainerSpec, PodSpec
from tests.peers.nri_runtime import NRIFactory
from tests.peers.peer_groups import NRI_VERSIONS
from tests.peers.profile import ClusterProfile

WHOLE_CORES: dict[str, Any] = {"policy": "static", "fullPhysicalCores": True}
CONSUMABLE_CAPACITY = "DRAConsumableCapacity"


def test_a_core_is_a_device_and_counts_its_threads_against_the_node(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    nodedra_factory: NodedraFactory,
    cluster_profile: ClusterProfile,
) -> None:
    """27 cores are offered (CPU 0 is reserved, and with it its core); a claim of two
    devices holds two cores, which the scheduler accounts as 4 of the node's CPUs."""
    cp, node = workload_controllers, kubelet.node_name
    start_nodedra(nodedra_factory, cp, kubelet, WHOLE_CORES)
    devices = published_devices(cp, node, STATIC)
    assert len(devices) == 27
    assert {d["attributes"]["threads"]["int"] for d in devices} == {2}
    if not cluster_profile.on(GATE):
        return
    create_claim_pod(cp, namespace, node, "claimer", STATIC, count=2)
    pod = wait_accounted(cp, namespace, "claimer")
    assert accounted(pod) == {claim_name(pod): {"cpu": 4}}
    create(cp, namespace, ordinary_pod("too-many", node, {"cpu": str(NODE_CPUS - 3)}))
    assert "Insufficient cpu" in wait_unschedulable(cp, namespace, "too-many")
    create(cp, namespace, ordinary_pod("the-rest", node, {"cpu": str(NODE_CPUS - 4)}))
    wait_pod_scheduled(cp, namespace, "the-rest")


def test_a_claim_of_twenty_cores_holds_forty_cpus(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    nodedra_factory: NodedraFactory,
    nri_runtime_factory: NRIFactory,
) -> None:
    """Prepared through the kubelet's DRA manager: 20 results, 40 CPUs, each core whole;
    the container the runtime (NRI's adaptation) creates with the 20 devices is pinned to
    the 40. (The node's 8 allocatable CPUs could not take 40: the devices map none here.)"""
    cp, node = workload_controllers, kubelet.node_name
    runtime = nri_runtime_factory(NRI_VERSIONS[-1], online_cpus="0-55", online_mems="0-3")
    start_nodedra(
        nodedra_factory,
        cp,
        kubelet,
        {**WHOLE_CORES, "nodeAllocatable": False},
        pinning="required",
        nri_socket=runtime.socket,
    )
    create_claim_pod(cp, namespace, node, "big", STATIC, count=20)
    pod = wait_pod_scheduled(cp, namespace, "big")
    (ids,) = kubelet.prepare(namespace, "big").values()
    assert len(ids) == 20
    ((uid, grants),) = saved_grants(nodedra_factory.dirs.checkpoint).items()
    cpus = [parse_cpu_list(g["cpus"]) for g in grants]
    assert [len(c) for c in cpus] == [2] * 20, f"claim {uid}: every result a whole core"
    assert len(frozenset().union(*cpus)) == 40

    sandbox = PodSpec("sb-big", name="big", namespace=namespace, uid=pod["metadata"]["uid"])
    runtime.run_pod(sandbox)
    runtime.create_container(ContainerSpec("big", sandbox.id, cdi_devices=ids), start=True)
    assert parse_cpu_list(runtime.container("big").cpus) == frozenset().union(*cpus)


def test_a_topology_aware_claim_of_three_cpus_gets_two_whole_cores(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    nodedra_factory: NodedraFactory,
    cluster_profile: ClusterProfile,
) -> None:
    """The device's cpu capacity steps by a core: the real scheduler records 4 CPUs consumed
    for a request of 3 (and, with the node-allocatable gate, counts 4 against the node); the
    policy grants two whole cores. Without consumable capacity (DRAConsumableCapacity off)
    the API server keeps no request of CPUs: the claim takes its device, every whole core of
    its NUMA node, and all of its memory."""
    cp, node = workload_controllers, kubelet.node_name
    config = {"policy": "topology-aware", "fullPhysicalCores": True}
    start_nodedra(nodedra_factory, cp, kubelet, config)
    create_claim_pod(
        cp, namespace, node, "three", TOPOLOGY_AWARE, capacity={"cpu": "3", "memory": "64Mi"}
    )
    pod = wait_pod_scheduled(cp, namespace, "three")
    if cluster_profile.on(GATE):
        pod = wait_accounted(cp, namespace, "three")
        assert accounted(pod)[claim_name(pod)]["cpu"] == 4
    (ids,) = kubelet.prepare(namespace, "three").values()
    assert ids
    ((grant,),) = saved_grants(nodedra_factory.dirs.checkpoint).values()
    cpus = parse_cpu_list(grant["cpus"])
    if not cluster_profile.on(CONSUMABLE_CAPACITY):
        topology = read_topology(NODEDRA_SYSFS)
        node_cpus = topology.nodes[int(grant["device"].removeprefix("cpudevnuma"))].cpus
        whole = make_policy(topology, parse_config({**config, "reservedCPUs": "0"})).whole_cores()
        assert cpus == frozenset().union(*(c for c in whole if c <= node_cpus))
        return
    assert len(cpus) == 4
    assert int(grant["memory"]) == 64 << 20
