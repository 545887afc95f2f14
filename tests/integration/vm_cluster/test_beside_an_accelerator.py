"""CPUs beside another driver's device, on the guest: the Go driver (on the official kubelet
plugin helper) deployed as a DaemonSet (tests.peers.go_driver_daemonset) publishes one
accelerator in NUMA node 1, its ``resource.kubernetes.io/numaNode`` made by the official
helper from the guest's sysfs. A claim of the accelerator and CPUs that match it on that
attribute runs on CPUs and memory of node 1 (nodedra's first device is node 0's, where the
claim would go unconstrained); one whose CPUs are asked of node 0 stays Pending with the
scheduler's reason. The guest's scheduler and kubelet (v1.37) do it, with both policies;
tests/integration/test_numa_attribute.py runs the same claims at every release on this
machine.

First in the package: it leaves the cluster as it found it (nothing claimed, the driver
gone, topology-aware).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from nodedra.policy.protocol import NUMA_NODE_ATTRIBUTE
from nodedra.topology import parse_cpu_list
from tests.integration.test_node_allocatable import wait_unschedulable
from tests.integration.test_numa_attribute import beside, on_node
from tests.integration.vm_cluster import (
    CLAIM_MEMORY,
    CLAIMS,
    TEST_NAMESPACE,
    claim_pod,
    edit_config,
)
from tests.peers import go_driver_daemonset as accelerator
from tests.peers.cluster import poll, resource_slices
from tests.peers.deployment import NAMESPACE
from tests.peers.nodedra_node import STATIC, TOPOLOGY_AWARE
from tests.peers.pods import create_pod, wait_pod_running
from tests.peers.vm_cluster import NODE_NAME, VMCluster

pytestmark = pytest.mark.timeout(1800)

PODS = f"/api/v1/namespaces/{TEST_NAMESPACE}/pods"
ACCELERATOR_NODE = 1
POLICY = {TOPOLOGY_AWARE: "topology-aware", STATIC: "static"}
CPUS: dict[str, dict[str, Any]] = {
    TOPOLOGY_AWARE: {"capacity": {"requests": {"cpu": "1", "memory": CLAIM_MEMORY}}},
    STATIC: {"count": 1},
}


@pytest.fixture(scope="module")
def beside_accelerator(deployed: VMCluster) -> Iterator[VMCluster]:
    """The Go driver's DaemonSet applied with kubectl and its accelerator published."""
    objects = accelerator.manifests(devices=1, numa_nodes=str(ACCELERATOR_NODE))
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    deployed.kubectl("apply", "-f", "-", input=listed)
    deployed.kubectl(
        "-n", accelerator.NAMESPACE, "rollout", "status", f"daemonset/{accelerator.NAME}",
        "--timeout=300s", timeout=330,
    )  # fmt: skip
    try:
        yield deployed
    finally:
        deployed.kubectl("delete", "-f", "-", "--wait=true", input=listed, timeout=300)
        for found in resource_slices(deployed.cp, NODE_NAME, accelerator.DRIVER):
            path = f"/apis/resource.k8s.io/v1/resourceslices/{found['metadata']['name']}"
            deployed.cp.delete_if_present(path)


def test_the_accelerator_says_its_numa_node_as_the_official_helper_does(
    beside_accelerator: VMCluster,
) -> None:
    cp = beside_accelerator.cp
    devices = poll(
        lambda: (
            [
                d
                for s in resource_slices(cp, NODE_NAME, accelerator.DRIVER)
                for d in s["spec"].get("devices") or []
            ]
            or None
        ),
        120,
        lambda: f"the Go driver's slice on {NODE_NAME}",
    )
    (device,) = devices
    assert device["attributes"][NUMA_NODE_ATTRIBUTE] == {"int": ACCELERATOR_NODE}, device


def _beside(name: str, driver: str, **cpus: Any) -> dict[str, Any]:
    """test_numa_attribute's claim of the accelerator and CPUs on one NUMA node, as a
    ResourceClaim of its own."""
    template = beside(name, accelerator.DRIVER, driver, **cpus)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": template["metadata"],
        "spec": template["spec"]["spec"],
    }


def _use_policy(cluster: VMCluster, driver: str, old: str) -> None:
    """The ConfigMap's policy changed and nodedra's pod replaced (a policy change takes a
    restart); until the new policy's devices are published."""
    edit_config(cluster, f"policy: {POLICY[old]}", f"policy: {POLICY[driver]}")
    (pod,) = cluster.nodedra_pods()
    cluster.kubectl("-n", NAMESPACE, "delete", "pod", pod["metadata"]["name"], timeout=300)
    cluster.wait_nodedra_ready()
    poll(
        lambda: resource_slices(cluster.cp, NODE_NAME, driver) or None,
        300,
        lambda: f"{driver}'s slices on {NODE_NAME}\n{cluster.nodedra_logs()}",
        2.0,
    )


def _release(cluster: VMCluster, *names: str) -> None:
    for name in names:
        cluster.cp.delete_if_present(f"{PODS}/{name}")
        cluster.cp.delete_if_present(f"{CLAIMS}/{name}")
    poll(
        lambda: True if not cluster.cp.request("GET", CLAIMS)["items"] else None,
        300,
        lambda: "the claims gone",
        2.0,
    )


@pytest.mark.parametrize("driver", [TOPOLOGY_AWARE, STATIC])
def test_cpus_and_memory_of_the_accelerator_s_numa_node(
    beside_accelerator: VMCluster, driver: str
) -> None:
    cluster = beside_accelerator
    cp = cluster.cp
    aligned, apart = f"aligned-{POLICY[driver]}", f"apart-{POLICY[driver]}"
    if driver != TOPOLOGY_AWARE:
        _use_policy(cluster, driver, TOPOLOGY_AWARE)
    try:
        cp.request("POST", CLAIMS, _beside(aligned, driver, **CPUS[driver]))
        create_pod(cp, TEST_NAMESPACE, claim_pod(aligned, aligned))
        pod = wait_pod_running(cp, TEST_NAMESPACE, aligned, timeout=300)
        cpus, mems = cluster.allowed(pod, "workload")
        assert parse_cpu_list(cpus) <= {2, 3}, f"CPUs {cpus} are not NUMA node 1's"
        assert mems == str(ACCELERATOR_NODE), mems

        claim = _beside(apart, driver, selectors=[on_node(driver, 0)], **CPUS[driver])
        cp.request("POST", CLAIMS, claim)
        create_pod(cp, TEST_NAMESPACE, claim_pod(apart, apart))
        assert "cannot allocate all claims" in wait_unschedulable(cp, TEST_NAMESPACE, apart)
    finally:
        # Released first: nodedra refuses a policy change while claims are prepared.
        _release(cluster, aligned, apart)
        if driver != TOPOLOGY_AWARE:
            _use_policy(cluster, TOPOLOGY_AWARE, driver)
