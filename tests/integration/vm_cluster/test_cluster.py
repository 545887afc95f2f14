"""The guest as a node, and nodedra deployed on it pinning a claim to NUMA node 1.

The cluster is the package's (see it); nodedra's image is in the guest's containerd
(imported when the guest's image was built, as if pulled), deployed with
``kubectl apply -k deploy/overlays/quiet-cpus/``: the manifests unchanged, and two host directories
mounted that only quietCPUs (off here) writes.
"""

from __future__ import annotations

import json
import math
import socket
import ssl
import time
from typing import Any

import pytest
from cryptography import x509

from nodedra.lib.quantity import parse_quantity
from nodedra.topology import format_cpu_list, parse_cpu_list
from tests.integration.vm_cluster import (
    CLAIM_CPU,
    CLAIM_MEMORY,
    CLAIMS,
    TEST_NAMESPACE,
    claim_pod,
    edit_config,
    numa1_claim,
)
from tests.peers.cluster import poll, resource_slices
from tests.peers.deployment import NAMESPACE
from tests.peers.nodedra_node import TOPOLOGY_AWARE
from tests.peers.pods import (
    container_id,
    create_pod,
    wait_pod_running,
    wait_reports,
    workload_pod,
)
from tests.peers.vm_cluster import KUBELET_PORT, NODE_NAME, VMCluster
from tests.peers.vm_image import GUEST_ADDRESS

pytestmark = pytest.mark.timeout(1800)

REQUESTS = {"cpu": "100m", "memory": "32Mi"}
LIMITS = {"cpu": "200m", "memory": "64Mi"}
CFS_PERIOD = 100_000


# -- the guest as a node -------------------------------------------------------------------------


def test_the_kubelet_registers_the_guest_as_a_cgroup_v2_systemd_node(
    vm_cluster: VMCluster,
) -> None:
    node = vm_cluster.node()
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == GUEST_ADDRESS, addresses
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://2.4.2"), info
    assert info["kubeletVersion"].startswith("v1.37.2"), info
    assert node["status"]["capacity"]["cpu"] == "4", node["status"]["capacity"]


def test_the_kubelet_answers_at_the_forward_with_its_serving_certificate(
    vm_cluster: VMCluster,
) -> None:
    context = ssl.create_default_context(cafile=str(vm_cluster.cp.ca.pair.cert))
    with (
        socket.create_connection((GUEST_ADDRESS, KUBELET_PORT), timeout=60) as raw,
        context.wrap_socket(raw, server_hostname=NODE_NAME) as tls,
    ):
        request = f"GET /pods HTTP/1.1\r\nHost: {NODE_NAME}\r\nConnection: close\r\n\r\n"
        tls.sendall(request.encode())
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    subject = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    # The kubelet, by its serving certificate, refusing an anonymous client.
    assert f"CN=system:node:{NODE_NAME}" in subject, subject
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


# -- reading the guest ---------------------------------------------------------------------------


def kubelet_weight(shares: int) -> int:
    """cgroup v1 shares as the cgroup v2 weight the kubelet writes for a pod's slice (its
    cgroup manager's linear map of 2..262144 onto 1..10000)."""
    return 1 + (shares - 2) * 9999 // 262142


def runc_weight(shares: int) -> int:
    """The same as runc writes for a container's scope (opencontainers/cgroups: a quadratic
    in log2 that maps 2, 1024 and 262144 to 1, 100 and 10000)."""
    if shares <= 2:
        return 1
    if shares >= 262144:
        return 10000
    level = math.log2(shares)
    return math.ceil(10 ** ((level * level + 125 * level) / 612 - 7 / 34))


# -- a pod without a claim -----------------------------------------------------------------------


def test_a_pod_runs_in_a_systemd_scope_of_kubepods_slice(vm_cluster: VMCluster) -> None:
    started = time.monotonic()
    create_pod(vm_cluster.cp, TEST_NAMESPACE, workload_pod("probe", node_name=NODE_NAME))
    pod = wait_pod_running(vm_cluster.cp, TEST_NAMESPACE, "probe", timeout=300)
    running = time.monotonic() - started
    pid = vm_cluster.pid(pod, "workload")
    group = vm_cluster.cgroup(pid)
    uid = pod["metadata"]["uid"].replace("-", "_")
    # The systemd driver's names: the pod's slice in its QoS class' slice, the container's scope.
    assert group == (
        "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{uid}.slice/cri-containerd-{container_id(pod)}.scope"
    ), group
    effective = vm_cluster.read_files(group, "cpuset.cpus.effective", "cpuset.mems.effective")
    # No claim and no CPU manager: the shared pool is the whole machine, both NUMA nodes.
    assert vm_cluster.allowed(pod, "workload") == ("0-3", "0-1")
    assert effective == {"cpuset.cpus.effective": "0-3", "cpuset.mems.effective": "0-1"}
    print(f"[vm] pod Running {running:.1f}s after it was created")


# -- nodedra, deployed -------------------------------------------------------------------------


def test_nodedra_publishes_both_numa_nodes_of_the_guest(deployed: VMCluster) -> None:
    (pod,) = deployed.nodedra_pods()
    assert not pod["spec"].get("hostNetwork"), "the manifests' pod is on the pod network"
    (container,) = pod["status"]["containerStatuses"]
    assert container["ready"], container
    assert container["restartCount"] == 0, container
    slices = resource_slices(deployed.cp, NODE_NAME, TOPOLOGY_AWARE)
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    numa = {
        name: d["attributes"]["resource.kubernetes.io/numaNode"]["int"]
        for name, d in devices.items()
    }
    assert numa == {"cpudevnuma000": 0, "cpudevnuma001": 1}, devices
    # CPU 0 is reserved (the manifests' configuration): node 0 offers one CPU, node 1 two.
    cpus = {name: d["capacity"]["cpu"]["value"] for name, d in devices.items()}
    assert cpus == {"cpudevnuma000": "1", "cpudevnuma001": "2"}, cpus
    assert all(d["attributes"]["smtEnabled"]["bool"] for d in devices.values()), devices
    assert deployed.metric("nodedra_nri_connected") == 1
    assert deployed.metric("nodedra_devices_published") == 2


def _numa1_pod() -> dict[str, Any]:
    """The claim's container, with requests and limits, and a sidecar without either."""
    pod = claim_pod("numa1", "numa1", resources={"requests": REQUESTS, "limits": LIMITS})
    (workload,) = pod["spec"]["containers"]
    sidecar = {key: value for key, value in workload.items() if key != "resources"}
    pod["spec"]["containers"].append({**sidecar, "name": "sidecar"})
    return pod


def test_a_claim_on_numa_node_1_runs_there_and_everything_else_keeps_off(
    deployed: VMCluster,
) -> None:
    """The claim's container runs on one CPU of NUMA node 1 with memory of node 1 only; the
    sidecar, the probe and nodedra on the rest; the kubelet's cgroup v2 files hold the
    claim's CPU and memory (DRANodeAllocatableResources) with the container's own."""
    cp = deployed.cp
    cp.request("POST", CLAIMS, numa1_claim("numa1"))
    started = time.monotonic()
    create_pod(cp, TEST_NAMESPACE, _numa1_pod())
    pod = wait_pod_running(cp, TEST_NAMESPACE, "numa1", timeout=300)
    print(f"[vm] the claim's pod Running {time.monotonic() - started:.1f}s after it was created")

    cpus, mems = deployed.allowed(pod, "workload")
    assert mems == "1", f"the claim's memory is NUMA node 1's: Mems_allowed_list {mems}"
    claimed = parse_cpu_list(cpus)
    assert len(claimed) == CLAIM_CPU, cpus
    assert claimed <= {2, 3}, f"CPUs {cpus} are not NUMA node 1's"
    shared = format_cpu_list(frozenset(range(4)) - claimed)
    assert deployed.allowed(pod, "sidecar") == (shared, "0-1")
    deployed.wait_allowed(TEST_NAMESPACE, "probe", "workload", (shared, "0-1"))
    (nodedra,) = deployed.nodedra_pods()
    assert deployed.allowed(nodedra, "nodedra") == (shared, "0-1")

    container = deployed.cgroup(deployed.pid(pod, "workload"))
    files = (
        "cpuset.cpus.effective", "cpuset.mems.effective", "cpu.weight", "cpu.max", "memory.max"
    )  # fmt: skip
    got = deployed.read_files(container, *files)
    pod_slice = container.rsplit("/", 1)[0]
    pod_files = deployed.read_files(pod_slice, "cpu.weight", "cpu.max", "memory.max")
    mapped = deployed.cp.feature_gates.get("DRANodeAllocatableResources", False)
    milli = 1000 * CLAIM_CPU if mapped else 0
    memory = int(parse_quantity(CLAIM_MEMORY)) if mapped else 0
    cpu_limit = (int(LIMITS["cpu"][:-1]) + milli) * CFS_PERIOD // 1000
    # The share of CPU time (the kubelet's MilliCPUToShares) is the container's own requests
    # for its scope, as a weight by runc's map; the pod's requests with the claim's CPU for
    # the pod's slice (the sidecar requests none), as a weight by the kubelet's own map.
    shares = int(REQUESTS["cpu"][:-1]) * 1024 // 1000
    pod_shares = (int(REQUESTS["cpu"][:-1]) + milli) * 1024 // 1000
    assert got == {
        "cpuset.cpus.effective": cpus,
        "cpuset.mems.effective": "1",
        "cpu.weight": str(runc_weight(shares)),
        "cpu.max": f"{cpu_limit} {CFS_PERIOD}",
        "memory.max": str(int(parse_quantity(LIMITS["memory"])) + memory),
    }, got
    # No limit for the pod: the sidecar has none.
    assert pod_files == {
        "cpu.weight": str(kubelet_weight(pod_shares)),
        "cpu.max": f"max {CFS_PERIOD}",
        "memory.max": "max",
    }, pod_files


def test_deleting_the_claim_s_pod_gives_its_cpus_back(deployed: VMCluster) -> None:
    cp = deployed.cp
    cp.request("DELETE", f"/api/v1/namespaces/{TEST_NAMESPACE}/pods/numa1")
    deployed.wait_allowed(TEST_NAMESPACE, "probe", "workload", ("0-3", "0-1"))
    # The shared pool's containers are widened one after the other: nodedra's may come last.
    (nodedra,) = deployed.nodedra_pods()
    deployed.wait_allowed(NAMESPACE, nodedra["metadata"]["name"], "nodedra", ("0-3", "0-1"))
    assert deployed.metric("nodedra_claims_held") == 0
    for numa_node in ("0", "1"):
        assert deployed.metric("nodedra_cpus_allocated", {"numa_node": numa_node}) == 0
    # Deallocated, the claim's CPU is free for the restarts' claims (test_restarts).
    cp.request("DELETE", f"{CLAIMS}/numa1")


# -- whole cores on the guest's SMT2 cores --------------------------------------------------------


def _set_full_physical_cores(cluster: VMCluster, on: bool) -> None:
    edit_config(
        cluster,
        f"fullPhysicalCores: {str(not on).lower()}",
        f"fullPhysicalCores: {str(on).lower()}",
    )


def _wait_devices(cluster: VMCluster, want: dict[str, str]) -> dict[str, Any]:
    """Until the guest's devices are ``want`` (name: cpu capacity); the devices."""
    seen: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        nonlocal seen
        slices = resource_slices(cluster.cp, NODE_NAME, TOPOLOGY_AWARE)
        seen = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
        found = {name: d["capacity"]["cpu"]["value"] for name, d in seen.items()}
        return seen if found == want else None

    return poll(check, 300, lambda: f"devices {want}; published: {seen}\n{cluster.nodedra_logs()}")


def test_with_whole_cores_a_claim_of_one_cpu_gets_both_threads_of_a_core_alone(
    deployed: VMCluster,
) -> None:
    """fullPhysicalCores, switched on in the running deployment: the guest's cores are CPUs
    0-1 and 2-3, and with CPU 0 reserved only core 2-3 is offered, two CPUs at least. A
    claim of one CPU is rounded up by the scheduler to the core; its container runs on both
    threads, is told so by its device metadata, and nothing else runs there."""
    cp = deployed.cp
    _set_full_physical_cores(deployed, True)
    devices = _wait_devices(deployed, {"cpudevnuma001": "2"})
    # One core of two threads: the one value its range holds (a step would exceed it).
    policy = devices["cpudevnuma001"]["capacity"]["cpu"]["requestPolicy"]
    assert policy == {"default": "2", "validRange": {"min": "2"}}, policy
    assert devices["cpudevnuma001"]["attributes"]["fullPhysicalCores"] == {"bool": True}

    cp.request("POST", CLAIMS, numa1_claim("core"))
    create_pod(cp, TEST_NAMESPACE, claim_pod("core", "core"))
    pod = wait_pod_running(cp, TEST_NAMESPACE, "core", timeout=300)
    claim = cp.request("GET", f"{CLAIMS}/core")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"]["cpu"] == "2", result
    assert deployed.allowed(pod, "workload") == ("2-3", "1")
    deployed.wait_allowed(TEST_NAMESPACE, "probe", "workload", ("0-1", "0-1"))
    (nodedra,) = deployed.nodedra_pods()
    assert deployed.allowed(nodedra, "nodedra") == ("0-1", "0-1")
    (report, *_) = wait_reports(cp, TEST_NAMESPACE, "core")
    (told,) = report["device_metadata"].values()
    first, _ = json.JSONDecoder().raw_decode(told)
    (device,) = first["requests"][0]["devices"]
    assert device["attributes"]["cpus"] == {"string": report["cpus_allowed_list"]}, report

    cp.request("DELETE", f"/api/v1/namespaces/{TEST_NAMESPACE}/pods/core")
    deployed.wait_allowed(TEST_NAMESPACE, "probe", "workload", ("0-3", "0-1"))
    cp.request("DELETE", f"{CLAIMS}/core")
    poll(
        lambda: True if deployed.metric("nodedra_claims_held") == 0 else None,
        120,
        lambda: "the whole-core claim released",
    )
    # As the restarts' tests expect it: single CPUs again (refused while a claim holds a core).
    _set_full_physical_cores(deployed, False)
    _wait_devices(deployed, {"cpudevnuma000": "1", "cpudevnuma001": "2"})
