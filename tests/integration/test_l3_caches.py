"""CPUs by shared L3 cache through the real API server, scheduler and the kubelet's DRA code.

nodedra reads the EPYC-like fixtures (two sockets of 8 L3 caches of 4 cores with two
threads: 8 CPUs a cache); the node is the test cluster's, with the kubelet harness.
Static: a claim matching ``l3Cache`` gets CPUs of one cache, and a CEL selector on it picks
the cache. Topology-aware: on a NUMA node of two caches, a claim of a cache's worth gets a
whole free cache rather than what is left of a split one.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from nodedra.topology import read_topology
from tests.conftest import NodedraFactory
from tests.integration.test_node_allocatable import (
    claim_name,
    create,
    kubelet,  # noqa: F401 (fixture)
    published_devices,
    start_nodedra,
)
from tests.peers.cluster import wait_pod_scheduled
from tests.peers.controlplane import ControlPlane
from tests.peers.kubelet import KubeletHarness
from tests.peers.nodedra_node import (
    STATIC,
    TOPOLOGY_AWARE,
    claim_pod,
    claim_template,
    granted,
    saved_grants,
)
from tests.peers.profile import ClusterProfile
from tests.unit.topology.sysfs_trees import FIXTURES

NPS1, NPS4 = FIXTURES / "epyc-2s-nps1", FIXTURES / "epyc-2s-nps4"
CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
UNMAPPED = {"nodeAllocatable": False}
"""Devices mapping none of the node's allocatable: the test node has 8 CPUs, the fixtures 128."""


def create_template_pod(
    cp: ControlPlane, namespace: str, node: str, template: dict[str, Any]
) -> None:
    """Create ``template`` and a pod of its name with a claim from it, fitting only ``node``."""
    name = template["metadata"]["name"]
    cp.request(
        "POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates", template
    )
    create(cp, namespace, claim_pod(name, node, name))


def prepared_grants(
    cp: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    factory: NodedraFactory,
    *,
    name: str,
    template: dict[str, Any],
) -> list[dict[str, Any]]:
    """Run a pod with a claim from ``template`` (named ``name``), let the kubelet prepare it,
    and return the grants nodedra saved for the claim, one a result."""
    template["metadata"]["name"] = name
    create_template_pod(cp, namespace, kubelet.node_name, template)
    pod = wait_pod_scheduled(cp, namespace, name)
    (ids,) = kubelet.prepare(namespace, name).values()
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{claim_name(pod)}"
    uid = cp.request("GET", path)["metadata"]["uid"]
    grants = saved_grants(factory.dirs.checkpoint)[uid]
    assert len(ids) == len(grants), "a CDI device for each result"
    return grants


def prepared_cpus(
    cp: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    factory: NodedraFactory,
    *,
    name: str,
    template: dict[str, Any],
) -> frozenset[int]:
    """The CPUs of :func:`prepared_grants`."""
    return granted(prepared_grants(cp, namespace, kubelet, factory, name=name, template=template))


def caches(sysfs: Path, cpus: frozenset[int]) -> Counter[int | None]:
    topology = read_topology(sysfs)
    return Counter(topology.cpus[c].l3_cache for c in cpus)


def test_static_cpus_matching_their_l3_cache_share_one(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    nodedra_factory: NodedraFactory,
) -> None:
    cp = workload_controllers
    start_nodedra(nodedra_factory, cp, kubelet, UNMAPPED | {"policy": "static"}, sysfs=NPS1)
    devices = published_devices(cp, kubelet.node_name, STATIC)
    assert {d["attributes"]["l3Cache"]["int"] for d in devices} == set(range(16))
    matching = claim_template("", STATIC, count=6)
    matching["spec"]["spec"]["devices"]["constraints"] = [
        {"requests": ["cpus"], "matchAttribute": f"{STATIC}/l3Cache"}
    ]
    cpus = prepared_cpus(
        cp, namespace, kubelet, nodedra_factory, name="matching", template=matching
    )
    assert len(cpus) == 6
    assert len(caches(NPS1, cpus)) == 1
    chosen = claim_template("", STATIC, count=4)
    chosen["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.attributes["{STATIC}"].l3Cache == 11'}}
    ]
    cpus = prepared_cpus(cp, namespace, kubelet, nodedra_factory, name="chosen", template=chosen)
    assert caches(NPS1, cpus) == {11: 4}


def test_a_topology_aware_claim_of_a_cache_gets_a_whole_free_one(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    nodedra_factory: NodedraFactory,
    cluster_profile: ClusterProfile,
) -> None:
    """NUMA node 1 of the NPS4 machine holds caches 2 and 3: a claim of 2 CPUs goes into
    one, a claim of 8 then takes the whole other one, and a claim of 4 the rest of the
    first (the tightest fit). Without consumable capacity a claim takes its whole NUMA
    node: both caches."""
    cp = workload_controllers
    start_nodedra(nodedra_factory, cp, kubelet, UNMAPPED | {"policy": "topology-aware"}, sysfs=NPS4)

    def on_node_1(cpu: str) -> dict[str, Any]:
        spec = claim_template("", TOPOLOGY_AWARE, {"cpu": cpu, "memory": "64Mi"})
        spec["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
            {"cel": {"expression": 'device.attributes["resource.kubernetes.io"].numaNode == 1'}}
        ]
        return spec

    small = prepared_cpus(
        cp, namespace, kubelet, nodedra_factory, name="small", template=on_node_1("2")
    )
    if not cluster_profile.on(CONSUMABLE_CAPACITY):
        assert caches(NPS4, small) == {2: 8, 3: 8}
        return
    ((first, two),) = caches(NPS4, small).items()
    assert two == 2
    eight = prepared_cpus(
        cp, namespace, kubelet, nodedra_factory, name="eight", template=on_node_1("8")
    )
    other = ({2, 3} - {first}).pop()
    assert caches(NPS4, eight) == {other: 8}
    four = prepared_cpus(
        cp, namespace, kubelet, nodedra_factory, name="four", template=on_node_1("4")
    )
    assert caches(NPS4, four) == {first: 4}
