"""Two nodes of two shapes in one cluster, nodedra's DaemonSet on both.

The package's cluster gets a second node: this machine's real node (tests.peers.node: cgroup
v1, cgroupfs, one NUMA node of two CPUs without SMT siblings) joins the guest's control plane
beside the guest (cgroup v2, systemd, two NUMA nodes of two SMT threads), as a cluster of
older and newer machines does. It joins after the manifests are applied again without the
quiet-cpus overlay (a rolling update of the guest's pod): that overlay would mount this
machine's /proc/irq and workqueue mask into a pod on it, and quietCPUs, which test_quiet_cpus
left on, would narrow them. The DaemonSet then runs a pod on each node, each publishing its
own node's devices, and the scheduler places claims on the node whose devices fit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from nodedra.topology import parse_cpu_list
from tests.integration.test_node_allocatable import wait_unschedulable
from tests.integration.vm_cluster import CLAIMS, TEST_NAMESPACE, numa1_claim
from tests.peers.build import PeerBinaries
from tests.peers.cluster import get_pod, poll, resource_slices
from tests.peers.deployment import (
    DAEMONSET,
    NAMESPACE,
    nodedra_pods,
    pod_token,
    rollout_status,
)
from tests.peers.node import RealNode
from tests.peers.nodedra_node import ROOT, TOPOLOGY_AWARE, dry_run_create_slice
from tests.peers.pods import container_id, create_pod, wait_pod_running, workload_pod
from tests.peers.vm_cluster import NODE_NAME, VMCluster

pytestmark = pytest.mark.timeout(1800)

HOST_NODE = "nodedra-host"
PODS = f"/api/v1/namespaces/{TEST_NAMESPACE}/pods"
#: Only this machine's node has CPUs without SMT siblings; only the guest has NUMA node 1.
NO_SMT = f'device.attributes["{TOPOLOGY_AWARE}"].smtEnabled == false'


@dataclass
class TwoNodes:
    guest: VMCluster
    host: RealNode

    def allowed(self, pod: dict[str, Any]) -> frozenset[int]:
        """The CPUs the pod's workload container may use, as its node's kernel says."""
        if pod["spec"]["nodeName"] == NODE_NAME:
            return parse_cpu_list(self.guest.allowed(pod, "workload")[0])
        pid = self.host.container_pid(container_id(pod))
        with open(f"/proc/{pid}/status") as status:
            (line,) = [x for x in status if x.startswith("Cpus_allowed_list:")]
        return parse_cpu_list(line.split(":")[1].strip())


def _release_claims(cluster: VMCluster) -> None:
    """Delete the pods with claims and the claims the modules before left (test_restarts'
    hold both CPUs of the guest's NUMA node 1), and wait until the claims are gone."""
    cp = cluster.cp
    for pod in cp.request("GET", PODS)["items"]:
        if pod["spec"].get("resourceClaims"):
            cp.request("DELETE", f"{PODS}/{pod['metadata']['name']}")
    for claim in cp.request("GET", CLAIMS)["items"]:
        cp.request("DELETE", f"{CLAIMS}/{claim['metadata']['name']}")
    poll(
        lambda: True if not cp.request("GET", CLAIMS)["items"] else None,
        300,
        lambda: (
            "the claims gone: "
            + str([c["metadata"]["name"] for c in cp.request("GET", CLAIMS)["items"]])
        ),
        2.0,
    )


@pytest.fixture(scope="module")
def two_nodes(
    deployed: VMCluster,
    node_binaries: PeerBinaries,
    nodedra_image: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TwoNodes]:
    """The manifests applied again (the guest's pod replaced), then this machine's node
    joined with nodedra's image, and the DaemonSet rolled out on both."""
    kubectl = deployed.kubectl
    _release_claims(deployed)
    kubectl("apply", "-k", str(ROOT / "manifests"))
    rollout_status(kubectl, timeout=600)
    started = time.monotonic()
    host = RealNode(
        node_binaries,
        deployed.cp,
        HOST_NODE,
        tmp_path_factory.mktemp("host-node"),
        pod_network=True,
        host_layout=True,
    )
    try:
        host.start()
        host.import_image(nodedra_image.archive)
        rollout_status(kubectl, timeout=600)
        print(
            f"[two nodes] this machine's node joined and serving {time.monotonic() - started:.1f}s"
        )
        yield TwoNodes(deployed, host)
    finally:
        host.stop()


def _devices(cluster: VMCluster, node: str) -> dict[str, dict[str, Any]]:
    slices = resource_slices(cluster.cp, node, TOPOLOGY_AWARE)
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def _claim_pod(name: str, claim: str) -> dict[str, Any]:
    """A pod of ``claim`` that the scheduler places (no node asked for)."""
    return workload_pod(name, claims=[{"name": "cpus", "resourceClaimName": claim}])


def _host_claim(name: str) -> dict[str, Any]:
    claim = numa1_claim(name)
    (request,) = claim["spec"]["devices"]["requests"]
    request["exactly"]["selectors"] = [{"cel": {"expression": NO_SMT}}]
    return claim


def test_each_node_s_nodedra_publishes_its_own_devices_and_no_other_s(
    two_nodes: TwoNodes,
) -> None:
    cp = two_nodes.guest.cp

    def published() -> dict[str, dict[str, Any]] | None:
        found = {node: _devices(two_nodes.guest, node) for node in (NODE_NAME, HOST_NODE)}
        return found if all(found.values()) else None

    devices = poll(published, 120, lambda: f"both nodes' slices: {published()}", 1.0)
    # CPU 0 reserved on both: the guest's two NUMA nodes, this machine's one.
    assert sorted(devices[NODE_NAME]) == ["cpudevnuma000", "cpudevnuma001"], devices
    assert sorted(devices[HOST_NODE]) == ["cpudevnuma000"], devices
    smt = {n: {d["attributes"]["smtEnabled"]["bool"] for d in devices[n].values()} for n in devices}
    assert smt == {NODE_NAME: {True}, HOST_NODE: {False}}, smt

    # Each pod's own token (as the kubelet projected it) may write its node's slices and is
    # refused another's by the admission policy.
    (host_pod,) = nodedra_pods(two_nodes.guest.kubectl, HOST_NODE)
    (guest_pod,) = two_nodes.guest.nodedra_pods()
    uid = guest_pod["metadata"]["uid"]
    guest_token = two_nodes.guest.vm.run(
        f"cat /var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~projected/kube-api-access-*/token"
    ).check()
    tokens = {HOST_NODE: pod_token(two_nodes.host, host_pod), NODE_NAME: guest_token.strip()}
    for node, other in ((HOST_NODE, NODE_NAME), (NODE_NAME, HOST_NODE)):
        status, answer = dry_run_create_slice(cp, tokens[node], node)
        assert status == 201, answer
        status, answer = dry_run_create_slice(cp, tokens[node], other)
        assert status == 403, answer
        assert (
            f'nodedra on node "{node}" may only create ResourceSlices of its own node, '
            f'not one of node "{other}"'
        ) in answer["message"]


def test_each_claim_lands_on_the_node_whose_devices_fit(two_nodes: TwoNodes) -> None:
    """A claim of NUMA node 1 only the guest has; one of CPUs without SMT siblings only this
    machine's node has. Neither pod names a node: the scheduler places each."""
    cp = two_nodes.guest.cp
    cp.request("POST", CLAIMS, numa1_claim("guest-side"))
    cp.request("POST", CLAIMS, _host_claim("host-side"))
    for name in ("guest-side", "host-side"):
        create_pod(cp, TEST_NAMESPACE, _claim_pod(name, name))
    pods = {
        n: wait_pod_running(cp, TEST_NAMESPACE, n, timeout=300) for n in ("guest-side", "host-side")
    }
    assert pods["guest-side"]["spec"]["nodeName"] == NODE_NAME
    assert pods["host-side"]["spec"]["nodeName"] == HOST_NODE
    assert two_nodes.allowed(pods["guest-side"]) <= {2, 3}
    # This machine's node offers CPU 1 alone (CPU 0 is reserved).
    assert two_nodes.allowed(pods["host-side"]) == {1}


def test_a_rolling_update_across_both_nodes_keeps_every_claim_and_its_cpus(
    two_nodes: TwoNodes,
) -> None:
    """``kubectl rollout restart``: the DaemonSet replaces its pod on one node, then on the
    other; the claims' containers run on, not restarted, on the same CPUs, and the claims
    keep their devices."""
    cp = two_nodes.guest.cp
    kubectl = two_nodes.guest.kubectl
    names = ("guest-side", "host-side")
    before = {n: get_pod(cp, TEST_NAMESPACE, n) for n in names}
    cpus = {n: two_nodes.allowed(before[n]) for n in names}
    claims = {n: cp.request("GET", f"{CLAIMS}/{n}")["status"]["allocation"] for n in names}
    old_nodedra = {
        p["metadata"]["name"]
        for node in (NODE_NAME, HOST_NODE)
        for p in nodedra_pods(kubectl, node)
    }

    kubectl("-n", NAMESPACE, "rollout", "restart", f"daemonset/{DAEMONSET}")
    rollout_status(kubectl, timeout=600)

    # Each node's old pod may still be terminating when the rollout is done.
    def replaced() -> dict[str, list[str]] | None:
        found = {
            node: [p["metadata"]["name"] for p in nodedra_pods(kubectl, node)]
            for node in (NODE_NAME, HOST_NODE)
        }
        fresh = all(len(n) == 1 and n[0] not in old_nodedra for n in found.values())
        return found if fresh else None

    poll(replaced, 120, lambda: f"one new nodedra pod a node, not {old_nodedra}", 1.0)
    for name in names:
        pod = get_pod(cp, TEST_NAMESPACE, name)
        assert container_id(pod) == container_id(before[name]), pod["status"]
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, pod["status"]
        assert two_nodes.allowed(pod) == cpus[name]
        assert cp.request("GET", f"{CLAIMS}/{name}")["status"]["allocation"] == claims[name]


def test_a_drained_node_gives_its_claim_back_and_takes_one_again_once_returned(
    two_nodes: TwoNodes,
) -> None:
    """``kubectl drain`` evicts the claim's pod (nodedra's stays: a DaemonSet's), the claim is
    released; a new claim that only this machine's node fits waits while it is cordoned, and
    runs there on the same CPU once it is uncordoned."""
    cp = two_nodes.guest.cp
    kubectl = two_nodes.guest.kubectl
    kubectl(
        "drain", HOST_NODE, "--ignore-daemonsets", "--force", "--delete-emptydir-data",
        "--timeout=300s", timeout=360,
    )  # fmt: skip
    poll(
        lambda: (
            None
            if [p for p in cp.request("GET", PODS)["items"] if p["metadata"]["name"] == "host-side"]
            else True
        ),
        120,
        lambda: "the drained node's claim pod gone",
    )
    (nodedra,) = nodedra_pods(kubectl, HOST_NODE)
    assert nodedra["status"]["phase"] == "Running", nodedra["status"]
    poll(
        lambda: (
            True
            if not (cp.request("GET", f"{CLAIMS}/host-side").get("status") or {}).get("allocation")
            else None
        ),
        120,
        lambda: f"host-side deallocated: {cp.request('GET', f'{CLAIMS}/host-side')}",
    )

    cp.request("POST", CLAIMS, _host_claim("returned"))
    create_pod(cp, TEST_NAMESPACE, _claim_pod("returned", "returned"))

    message = wait_unschedulable(cp, TEST_NAMESPACE, "returned")
    assert "unschedulable" in message, message

    kubectl("uncordon", HOST_NODE)
    pod = wait_pod_running(cp, TEST_NAMESPACE, "returned", timeout=300)
    assert pod["spec"]["nodeName"] == HOST_NODE
    assert two_nodes.allowed(pod) == {1}
    for name in ("guest-side", "returned"):
        cp.request("DELETE", f"{PODS}/{name}")
    for name in ("guest-side", "host-side", "returned"):
        cp.request("DELETE", f"{CLAIMS}/{name}")
