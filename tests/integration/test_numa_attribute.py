"""CPUs beside another driver's device: ``resource.kubernetes.io/numaNode`` (KEP-6072) in
both forms, through the real API server, scheduler and the kubelet's DRA code.

The other driver is the Go driver on the official kubelet plugin helper, its accelerators'
attribute made by the official ``deviceattribute`` helper from the same fixture machine
nodedra reads (two sockets of two NUMA nodes: 0-1 and 2-3). The accelerator lies in NUMA
node 2, so a claim the default placement served would be wrong.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from nodedra.policy.numa_attribute import OWN_ATTRIBUTE, nearest
from nodedra.policy.protocol import NUMA_NODE_ATTRIBUTE
from nodedra.topology import read_topology
from tests.conftest import NODEDRA_SYSFS, GoDriverFactory, NodedraFactory
from tests.integration.test_l3_caches import create_template_pod
from tests.integration.test_node_allocatable import (
    claim_name,
    kubelet,  # noqa: F401 (fixture)
    published_devices,
    start_nodedra,
    wait_unschedulable,
)
from tests.integration.test_plugin_integration import device_class
from tests.peers.build import PeerBinaries
from tests.peers.cluster import wait_for_slices, wait_pod_scheduled
from tests.peers.controlplane import ControlPlane
from tests.peers.go_driver import NUMAPlacement
from tests.peers.kubelet import KubeletHarness
from tests.peers.nodedra_node import (
    STATIC,
    TOPOLOGY_AWARE,
    NodedraProcess,
    granted,
    saved_grants,
)
from tests.peers.profile import ClusterProfile
from tests.unit.policy.conftest import FIXTURES, SHAPES

LIST_GATE = "DRAListTypeAttributes"
SCHEDULER_WITHOUT_LISTS = 36
"""The release whose scheduler meets no matchAttribute of lists, even equal ones."""
POLICY = {TOPOLOGY_AWARE: "topology-aware", STATIC: "static"}
"""Driver -> its policy."""
ACCELERATOR_NODE = 2


def helper_attribute(binaries: PeerBinaries, shape: str, form: str, nodes: list[int]) -> list[Any]:
    """The official helper's attribute value of a device in each of ``nodes``."""
    printed = subprocess.run(
        [str(binaries.go_driver), "numa-attribute", str(FIXTURES / shape), form, *map(str, nodes)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [json.loads(line) for line in printed.splitlines()]


@pytest.mark.parametrize("shape", SHAPES)
def test_both_forms_are_the_official_helper_s(peer_binaries: PeerBinaries, shape: str) -> None:
    topology = read_topology(FIXTURES / shape)
    if not (FIXTURES / shape / "devices/system/node").is_dir():
        # Without NUMA in sysfs nodedra makes one node 0 of the machine; the helper cannot
        # read a distance for it and names it alone too.
        assert [nearest(topology, n) for n in topology.nodes] == [[0]]
        return
    nodes = sorted(topology.nodes)
    lists = [{"ints": nearest(topology, n)} for n in nodes]
    assert helper_attribute(peer_binaries, shape, "list", nodes) == lists
    assert helper_attribute(peer_binaries, shape, "scalar", nodes) == [{"int": n} for n in nodes]


def nodedra_on(
    factory: NodedraFactory,
    cp: ControlPlane,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    driver: str,
    **setting: Any,
) -> NodedraProcess:
    config = {"policy": POLICY[driver], "nodeAllocatable": False, "numaNodeAttribute": setting}
    return start_nodedra(factory, cp, kubelet, config)


def test_the_list_form_is_published_where_the_api_server_keeps_it(
    control_plane: ControlPlane,
    cluster_profile: ClusterProfile,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    nodedra_factory: NodedraFactory,
) -> None:
    """With the gate off nodedra publishes the scalar, not slices the server would refuse;
    ``nodedra preflight`` warns where the list form cannot align claims (the gate off, or a
    1.36 control plane, whose scheduler matches no list)."""
    aliases = ["dra.net/numaNode"]
    nodedra = nodedra_on(
        nodedra_factory, control_plane, kubelet, TOPOLOGY_AWARE, form="list", aliases=aliases
    )
    _, report = nodedra.preflight()
    (check,) = [c for c in report["checks"] if c["name"] == "numa-attribute"]
    works = cluster_profile.on(LIST_GATE) and cluster_profile.minor != SCHEDULER_WITHOUT_LISTS
    assert check["status"] == ("ok" if works else "warn"), (cluster_profile.describe(), check)
    topology = read_topology(NODEDRA_SYSFS)
    devices = published_devices(control_plane, kubelet.node_name, TOPOLOGY_AWARE)
    assert len(devices) == len(topology.nodes)
    for device in devices:
        attributes = device["attributes"]
        node = attributes[OWN_ATTRIBUTE]["int"]
        expected = (
            {"ints": nearest(topology, node)} if cluster_profile.on(LIST_GATE) else {"int": node}
        )
        assert attributes[NUMA_NODE_ATTRIBUTE] == expected, (cluster_profile.describe(), device)
        assert attributes["dra.net/numaNode"] == {"int": node}


def beside(name: str, accelerator_class: str, cpus_class: str, **cpus: Any) -> dict[str, Any]:
    """A claim template of one accelerator and CPUs, constrained to one NUMA node."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": accelerator_class}},
                        {"name": "cpus", "exactly": {"deviceClassName": cpus_class, **cpus}},
                    ],
                    "constraints": [
                        {"requests": ["gpu", "cpus"], "matchAttribute": NUMA_NODE_ATTRIBUTE}
                    ],
                }
            }
        },
    }


def on_node(driver: str, node: int) -> dict[str, Any]:
    """A selector of ``driver``'s devices of NUMA node ``node`` (nodedra's own scalar)."""
    return {"cel": {"expression": f'device.attributes["{driver}"].{OWN_ATTRIBUTE} == {node}'}}


CPUS: dict[str, dict[str, Any]] = {
    TOPOLOGY_AWARE: {"capacity": {"requests": {"cpu": "2"}}},
    STATIC: {"count": 2},
}


def accelerator(
    factory: GoDriverFactory,
    cp: ControlPlane,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    form: str = "scalar",
) -> str:
    """The Go driver with one accelerator in NUMA node 2; its DeviceClass."""
    go = factory(kubelet, devices=1, numa=NUMAPlacement((ACCELERATOR_NODE,), NODEDRA_SYSFS, form))
    kubelet.wait_registered(go.driver_name)
    wait_for_slices(cp, kubelet.node_name, go.driver_name, 1)
    return device_class(cp, go.driver_name)


def prepared(
    cp: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    factory: NodedraFactory,
    template: dict[str, Any],
) -> list[dict[str, Any]]:
    """Run a pod of ``template``'s claim, let the kubelet prepare it with both drivers; the
    grants nodedra saved."""
    name = template["metadata"]["name"]
    create_template_pod(cp, namespace, kubelet.node_name, template)
    pod = wait_pod_scheduled(cp, namespace, name)
    (ids,) = kubelet.prepare(namespace, name).values()
    assert len({i.split("/")[0] for i in ids}) == 2, f"CDI devices of both drivers: {ids}"
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{claim_name(pod)}"
    uid = cp.request("GET", path)["metadata"]["uid"]
    return saved_grants(factory.dirs.checkpoint)[uid]


@pytest.mark.parametrize("policy", [TOPOLOGY_AWARE, STATIC])
def test_cpus_of_the_accelerator_s_numa_node(  # noqa: PLR0917
    workload_controllers: ControlPlane,
    namespace: str,
    cluster_profile: ClusterProfile,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    nodedra_factory: NodedraFactory,
    go_driver_factory: GoDriverFactory,
    policy: str,
) -> None:
    """The scalar form (the default): the claim's CPUs and memory are of the accelerator's
    NUMA node; CPUs asked of another node cannot be aligned, and the pod stays pending."""
    cp = workload_controllers
    nodedra_on(nodedra_factory, cp, kubelet, policy)
    gpu = accelerator(go_driver_factory, cp, kubelet)
    grants = prepared(
        cp, namespace, kubelet, nodedra_factory, beside("aligned", gpu, policy, **CPUS[policy])
    )
    node_cpus = read_topology(NODEDRA_SYSFS).nodes[ACCELERATOR_NODE].cpus
    assert granted(grants) <= node_cpus, grants
    # Without consumable capacity a topology-aware claim takes its NUMA node whole.
    whole = policy == TOPOLOGY_AWARE and not cluster_profile.on("DRAConsumableCapacity")
    assert len(granted(grants)) == (len(node_cpus) if whole else 2), grants
    assert granted(grants, "mems") == {ACCELERATOR_NODE}

    apart = beside("apart", gpu, policy, selectors=[on_node(policy, 0)], **CPUS[policy])
    create_template_pod(cp, namespace, kubelet.node_name, apart)
    assert "cannot allocate all claims" in wait_unschedulable(cp, namespace, "apart")


def test_the_list_form_pairs_the_accelerator_with_a_near_node(  # noqa: PLR0917
    workload_controllers: ControlPlane,
    namespace: str,
    cluster_profile: ClusterProfile,
    kubelet: KubeletHarness,  # noqa: F811 (fixture)
    nodedra_factory: NodedraFactory,
    go_driver_factory: GoDriverFactory,
) -> None:
    """CPUs asked of NUMA node 3, beside an accelerator in node 2 of the same socket: with
    both drivers' lists (node 2: [2, 3]; node 3: [3, 2]) the sets meet and the claim is
    served from node 3 (1.37). Where the API server has the gate off, nodedra publishes the
    scalar and the Go driver can only do the same: the claim cannot be aligned. At 1.36,
    with the gate on everywhere and both lists published and kept, its scheduler matches no
    list at all, not even two equal ones: the list form breaks alignment there."""
    cp = workload_controllers
    nodedra_on(nodedra_factory, cp, kubelet, TOPOLOGY_AWARE, form="list")
    lists = cluster_profile.on(LIST_GATE)
    gpu = accelerator(go_driver_factory, cp, kubelet, "list" if lists else "scalar")
    near = beside(
        "near", gpu, TOPOLOGY_AWARE, selectors=[on_node(TOPOLOGY_AWARE, 3)], **CPUS[TOPOLOGY_AWARE]
    )
    if not lists or cluster_profile.minor == SCHEDULER_WITHOUT_LISTS:
        create_template_pod(cp, namespace, kubelet.node_name, near)
        assert "cannot allocate all claims" in wait_unschedulable(cp, namespace, "near")
        if lists:  # 1.36: not even equal lists (node 2's accelerator, node 2's CPUs) match
            same = beside("same", gpu, TOPOLOGY_AWARE, selectors=[on_node(TOPOLOGY_AWARE, 2)])
            create_template_pod(cp, namespace, kubelet.node_name, same)
            assert "cannot allocate all claims" in wait_unschedulable(cp, namespace, "same")
        return
    grants = prepared(cp, namespace, kubelet, nodedra_factory, near)
    assert granted(grants) <= read_topology(NODEDRA_SYSFS).nodes[3].cpus, grants
    assert granted(grants, "mems") == {3}
