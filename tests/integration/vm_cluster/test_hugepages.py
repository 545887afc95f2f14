"""Huge pages claimed with CPUs on the guest's NUMA node 1, used, limited, and given back.

The guest boots with 32 pages of 2 MiB (``hugepagesz=2M hugepages=32``), which the kernel
spreads over its two NUMA nodes, and its containerd keeps the hugetlb controller (a
production node that offers huge pages has to: containerd's default drops every container's
huge page limit). The kubelet accounts a claim's huge pages to its pod and to the container
that uses the claim through the device's mapping to ``hugepages-2Mi``; a container's hugetlb
limit is what stops it past them. Runs after test_cluster and leaves no claim behind.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.vm_cluster import CLAIMS, TEST_NAMESPACE, claim_pod, numa1_claim
from tests.peers.cluster import poll, resource_slices
from tests.peers.nodedra_node import TOPOLOGY_AWARE
from tests.peers.pods import create_pod, pod_events, wait_pod_running, wait_reports, workload_pod
from tests.peers.vm_cluster import NODE_NAME, VMCluster

pytestmark = pytest.mark.timeout(1800)

PAGE = 2 << 20
CAPACITY = "hugepages_2Mi"
PODS = f"/api/v1/namespaces/{TEST_NAMESPACE}/pods"
#: The first claim's huge pages: four pages of NUMA node 1.
HELD = 4 * PAGE


def pages_of(cluster: VMCluster, node: int) -> int:
    path = f"/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages"
    return int(cluster.vm.run(f"cat {path}").check())


def huge_claim(name: str, amount: int) -> dict[str, Any]:
    claim = numa1_claim(name)
    (request,) = claim["spec"]["devices"]["requests"]
    request["exactly"]["capacity"]["requests"][CAPACITY] = str(amount)
    return claim


def huge_pod(name: str, claim: str, trials: str, **options: Any) -> dict[str, Any]:
    """The claim's pod, its probe trying to map each amount of ``trials`` in turn."""
    return claim_pod(name, claim, env={"WORKLOAD_HUGEPAGES": trials}, **options)


def trials(cluster: VMCluster, pod: str, container: str = "workload") -> dict[str, str]:
    (report, *_) = wait_reports(cluster.cp, TEST_NAMESPACE, pod, container=container)
    found: dict[str, str] = report.get("hugepages") or {}
    return found


def wait_unschedulable(cluster: VMCluster, name: str) -> str:
    """Until the scheduler says ``name`` fits no node; what it said."""

    def check() -> str | None:
        pod = cluster.cp.request("GET", f"{PODS}/{name}")
        for condition in pod["status"].get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                return str(condition.get("message", "")) or None
        return None

    return poll(
        check, 120, lambda: f"{name} unschedulable: {pod_events(cluster.cp, TEST_NAMESPACE, name)}"
    )


def test_each_numa_node_offers_the_huge_pages_it_has(deployed: VMCluster) -> None:
    pages = {node: pages_of(deployed, node) for node in (0, 1)}
    assert sum(pages.values()) == 32, pages
    assert all(pages.values()), pages
    slices = resource_slices(deployed.cp, NODE_NAME, TOPOLOGY_AWARE)
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    for node, device in enumerate(("cpudevnuma000", "cpudevnuma001")):
        capacity = devices[device]["capacity"][CAPACITY]
        assert capacity == {
            "value": str(pages[node] * PAGE),
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": str(PAGE)}},
        }, capacity
        mapping = devices[device]["nodeAllocatableResources"]["hugepages-2Mi"]
        assert mapping == {"mapping": {"capacityKey": CAPACITY, "capacityMultiplier": "1"}}
    allocatable = deployed.node()["status"]["allocatable"]
    assert allocatable["hugepages-2Mi"] == "64Mi", allocatable


def test_a_claim_s_container_maps_its_huge_pages_and_no_more(deployed: VMCluster) -> None:
    """Four pages claimed: the container maps four and not five, and is told it has them;
    its sidecar, which does not use the claim, and a pod without a claim map none."""
    cp = deployed.cp
    cp.request("POST", CLAIMS, huge_claim("huge", HELD))
    pod = huge_pod("huge", "huge", f"{HELD},{HELD + PAGE}")
    (workload,) = pod["spec"]["containers"]
    sidecar = {k: v for k, v in workload.items() if k != "resources"}
    sidecar["env"] = [{"name": "WORKLOAD_HUGEPAGES", "value": str(PAGE)}]
    pod["spec"]["containers"].append({**sidecar, "name": "sidecar"})
    create_pod(cp, TEST_NAMESPACE, pod)
    create_pod(
        cp,
        TEST_NAMESPACE,
        workload_pod(
            "nohuge",
            node_selector={"kubernetes.io/hostname": NODE_NAME},
            env={"WORKLOAD_HUGEPAGES": str(PAGE)},
        ),
    )
    running = wait_pod_running(cp, TEST_NAMESPACE, "huge", timeout=300)
    wait_pod_running(cp, TEST_NAMESPACE, "nohuge", timeout=300)

    tried = trials(deployed, "huge")
    print(f"[vm] huge pages mapped by the claim's container: {tried}")
    assert tried[str(HELD)] == "ok", tried
    assert tried[str(HELD + PAGE)] != "ok", tried
    beside = trials(deployed, "huge", "sidecar"), trials(deployed, "nohuge")
    print(f"[vm] huge pages mapped by its sidecar, by a pod without a claim: {beside}")
    assert all(tried[str(PAGE)] != "ok" for tried in beside), beside

    (report, *_) = wait_reports(cp, TEST_NAMESPACE, "huge")
    told = {k: v for k, v in report["env"].items() if k.startswith("DRA_HUGEPAGES_2Mi_")}
    assert list(told.values()) == [str(HELD)], report["env"]
    (metadata,) = report["device_metadata"].values()
    first, _ = json.JSONDecoder().raw_decode(metadata)
    (device,) = first["requests"][0]["devices"]
    assert device["attributes"][CAPACITY] == {"int": HELD}, device
    assert report["mems_allowed_list"] == "1", report

    # What the kubelet did with them: the pod's and the claiming container's hugetlb limits
    # are the claim's pages; the sidecar's are none.
    container = deployed.cgroup(deployed.pid(running, "workload"))
    limits = ("hugetlb.2MB.max",)
    assert deployed.read_files(container, *limits) == {"hugetlb.2MB.max": str(HELD)}
    pod_slice = container.rsplit("/", 1)[0]
    assert deployed.read_files(pod_slice, *limits) == {"hugetlb.2MB.max": str(HELD)}
    side = deployed.cgroup(deployed.pid(running, "sidecar"))
    assert deployed.read_files(side, *limits) == {"hugetlb.2MB.max": "0"}


def test_the_scheduler_refuses_what_the_node_has_not_free_and_unprepare_gives_it_back(
    deployed: VMCluster,
) -> None:
    """With four of node 1's pages held, a claim of all the others and one more fits no
    node, nor does a pod asking the node for more than the rest of its huge pages the old
    way (the claim's are counted against the node); once the first claim is released, the
    bigger one runs and maps them."""
    cp = deployed.cp
    rest = pages_of(deployed, 1) * PAGE - HELD
    cp.request("POST", CLAIMS, huge_claim("more", rest + PAGE))
    create_pod(cp, TEST_NAMESPACE, huge_pod("more", "more", str(rest + PAGE)))
    message = wait_unschedulable(deployed, "more")
    assert "cannot allocate all claims" in message, message

    classic = workload_pod(
        "classic",
        node_selector={"kubernetes.io/hostname": NODE_NAME},
        resources={
            "requests": {"memory": "32Mi", "hugepages-2Mi": str(64 * (1 << 20) - HELD + PAGE)},
            "limits": {"memory": "32Mi", "hugepages-2Mi": str(64 * (1 << 20) - HELD + PAGE)},
        },
    )
    create_pod(cp, TEST_NAMESPACE, classic)
    message = wait_unschedulable(deployed, "classic")
    assert "Insufficient hugepages-2Mi" in message, message
    cp.request("DELETE", f"{PODS}/classic")

    for name in ("huge", "nohuge", "more"):
        delete_pod(deployed, name)
    wait_released(deployed)
    for name in ("huge", "more"):
        cp.request("DELETE", f"{CLAIMS}/{name}")
    # Anew, as a user would retry: the scheduler need not notice a release on its own.
    cp.request("POST", CLAIMS, huge_claim("more", rest + PAGE))
    create_pod(cp, TEST_NAMESPACE, huge_pod("more", "more", str(rest + PAGE)))
    wait_pod_running(cp, TEST_NAMESPACE, "more", timeout=300)
    assert trials(deployed, "more") == {str(rest + PAGE): "ok"}

    delete_pod(deployed, "more")
    wait_released(deployed)
    cp.request("DELETE", f"{CLAIMS}/more")


def delete_pod(cluster: VMCluster, name: str) -> None:
    """Delete pod ``name`` and wait until it is gone."""
    cluster.cp.request("DELETE", f"{PODS}/{name}")

    def gone() -> bool | None:
        pods = cluster.cp.request("GET", PODS)["items"]
        return None if any(p["metadata"]["name"] == name for p in pods) else True

    poll(gone, 120, lambda: f"pod {name} gone")


def wait_released(cluster: VMCluster) -> None:
    poll(
        lambda: True if cluster.metric("nodedra_claims_held") == 0 else None,
        120,
        lambda: "every claim released",
    )
