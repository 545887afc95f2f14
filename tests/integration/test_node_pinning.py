"""Pods that run on their claimed CPUs: nodedra on a real node (kubelet, containerd, runc).

The ground truth is what the container itself reports (its probe prints ``/proc/self/status``
and its cpuset cgroup) and what the machine says about its process, compared with the claim
as the checkpoint records it and as ``status.devices`` describes it. nodedra reads this
machine's own topology, as on a real node: on a 2-CPU machine with CPU 0 reserved, a claim
can have CPU 1 and everything else shares CPU 0. Cases that need more CPUs than the machine
has (two claims side by side, several results in one pod) run against NRI's adaptation with
a larger fixture machine (test_pinning.py).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import driver_name
from nodedra.lib.quantity import parse_quantity
from nodedra.resmgr import Checkpoint
from nodedra.topology import format_cpu_list, parse_cpu_list
from tests.conftest import NodedraFactory, RealNodeFactory
from tests.peers.cgroups import cgroup_path, hierarchy_of
from tests.peers.cluster import get_claim, pod_claim_name, poll
from tests.peers.controlplane import ControlPlane
from tests.peers.node import RealNode
from tests.peers.nodedra_node import (
    NodedraProcess,
    claim_template,
    granted,
    saved_grants,
    wait_claim_status,
)
from tests.peers.pods import (
    cpuset_cgroup,
    create_pod,
    online_cpus,
    pod_events,
    proc_status,
    wait_pod_running,
    wait_reports,
    workload_pod,
)
from tests.peers.profile import ClusterProfile
from tests.peers.runtime import NODE_RUNTIMES

POLICIES = ("topology-aware", "static")
UNLIMITED_MEMORY = 1 << 62
"""Above this, cgroup v1's memory.limit_in_bytes means no limit (it says 2^63 less a page)."""
RESERVED = "0"
"""Reserved: always in the shared pool (the machine's first CPU)."""


def claims_capacity(policy: str) -> dict[str, str] | None:
    """What a pod's claim asks of the policy's device: one CPU (and some memory)."""
    return {"cpu": "1", "memory": "32Mi"} if policy == "topology-aware" else None


@dataclass
class Pinned:
    """A real node with nodedra pinning its containers."""

    cp: ControlPlane
    namespace: str
    node: RealNode
    factory: NodedraFactory
    policy: str
    nodedra: NodedraProcess

    @property
    def driver(self) -> str:
        return driver_name(self.policy)

    @property
    def online(self) -> frozenset[int]:
        return parse_cpu_list(online_cpus())

    def start_nodedra(self, **settings: Any) -> NodedraProcess:
        self.nodedra = start_nodedra(self.factory, self.node, self.cp, self.driver, **settings)
        return self.nodedra

    def run_claim_pod(self, name: str, **options: Any) -> dict[str, Any]:
        """A probe pod with a claim of one CPU, running; the pod."""
        self.cp.request(
            "POST",
            f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaimtemplates",
            claim_template(name, self.driver, claims_capacity(self.policy)),
        )
        self.create(name, claims=[{"name": "cpus", "resourceClaimTemplateName": name}], **options)
        return wait_pod_running(self.cp, self.namespace, name, timeout=120)

    def create(self, name: str, **options: Any) -> None:
        create_pod(
            self.cp,
            self.namespace,
            workload_pod(
                name,
                node_selector={"kubernetes.io/hostname": self.node.node_name},
                report_interval="200ms",
                **options,
            ),
        )

    def claim_of(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        name = pod_claim_name(pod, "cpus")
        assert name is not None, pod.get("status")
        return get_claim(self.cp, self.namespace, name)

    def grants(self, uid: str) -> tuple[frozenset[int], frozenset[int]]:
        grants = saved_grants(self.factory.dirs.checkpoint)[uid]
        return granted(grants), granted(grants, "mems")

    def claimed(self) -> frozenset[int]:
        """Every CPU the checkpoint says claims hold."""
        return granted(
            g for grants in saved_grants(self.factory.dirs.checkpoint).values() for g in grants
        )

    def cgroups(self, pod: str) -> tuple[dict[str, Path], dict[str, Path]]:
        """The cpu and memory cgroup directories of the pod's container, and of the pod."""
        pid = self.node.pod_pid(self.namespace, pod)
        container = {
            c: hierarchy_of(c).mount / cgroup_path(pid, c).lstrip("/") for c in ("cpu", "memory")
        }
        return container, {c: d.parent for c, d in container.items()}

    def runs_on(self, pod: str) -> frozenset[int]:
        """The CPUs the machine lets the pod's container run on now."""
        pid = self.node.pod_pid(self.namespace, pod)
        return parse_cpu_list(proc_status(pid)["Cpus_allowed_list"])

    def wait_runs_on(self, pod: str, expected: frozenset[int]) -> None:
        seen: frozenset[int] = frozenset()

        def check() -> bool | None:
            nonlocal seen
            seen = self.runs_on(pod)
            return True if seen == expected else None

        poll(
            check,
            60,
            lambda: (
                f"pod {pod} on CPUs {format_cpu_list(expected)}; it runs on {format_cpu_list(seen)}"
            ),
        )


def device_metadata(
    report: Mapping[str, Any], driver: str, claim: Mapping[str, Any]
) -> dict[str, frozenset[int]]:
    """The CPUs and memory nodes the container's device metadata file tells it it has.

    The file of the probe pod's claim (from a template the pod calls "cpus", whose request
    is "cpus"), read as a KEP-5304 reader does: the first object of the stream.
    """
    path = (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/cpus/cpus/"
        f"{driver}-metadata.json"
    )
    assert list(report["device_metadata"]) == [path], report
    first, _ = json.JSONDecoder().raw_decode(report["device_metadata"][path])
    assert first["apiVersion"] == "metadata.resource.k8s.io/v1beta1"
    assert first["metadata"]["uid"] == claim["metadata"]["uid"]
    (request,) = first["requests"]
    devices = request["devices"]
    assert [d["name"] for d in devices] == [
        r["device"] for r in claim["status"]["allocation"]["devices"]["results"]
    ]
    return {
        key: frozenset().union(*(parse_cpu_list(d["attributes"][key]["string"]) for d in devices))
        for key in ("cpus", "memoryNodes")
    }


def read_int(directory: Path, name: str) -> int:
    return int((directory / name).read_text())


def start_nodedra(
    factory: NodedraFactory, node: RealNode, cp: ControlPlane, driver: str, **settings: Any
) -> NodedraProcess:
    """nodedra on ``node``, reading this machine's topology, pinning through its runtime."""
    nodedra = factory(
        node,
        sysfs=Path("/sys"),
        pinning=settings.pop("pinning", "required"),
        nri_socket=node.nri_socket,
        **settings,
    )
    nodedra.wait_ready(cp, node.node_name, driver)
    return nodedra


def pinned_node(
    cp: ControlPlane,
    namespace: str,
    real_node_factory: RealNodeFactory,
    nodedra_factory: NodedraFactory,
    *,
    runtime: str,
    policy: str,
    **node_options: Any,
) -> Pinned:
    """A real node running ``runtime`` (``node_options`` are RealNode's) with nodedra pinning
    its containers by ``policy``, RESERVED reserved: what the fixtures of the tests on such a
    node give."""
    node = real_node_factory(runtime=runtime, cdi_dir=nodedra_factory.dirs.cdi, **node_options)
    nodedra_factory.write_config({"policy": policy, "reservedCPUs": RESERVED})
    nodedra = start_nodedra(nodedra_factory, node, cp, driver_name(policy))
    return Pinned(cp, namespace, node, nodedra_factory, policy, nodedra)


@pytest.fixture(
    params=[(r, p) for r in NODE_RUNTIMES for p in POLICIES],
    ids=[f"{r}-{p}" for r in NODE_RUNTIMES for p in POLICIES],
)
def pinned(
    request: pytest.FixtureRequest,
    workload_controllers: ControlPlane,
    namespace: str,
    real_node_factory: RealNodeFactory,
    nodedra_factory: NodedraFactory,
) -> Pinned:
    runtime, policy = request.param
    return pinned_node(
        workload_controllers,
        namespace,
        real_node_factory,
        nodedra_factory,
        runtime=runtime,
        policy=policy,
    )


def test_a_pod_runs_on_the_cpus_of_its_claim_and_the_others_do_not(pinned: Pinned) -> None:
    """What the container reports, the device metadata file it reads, what the machine says,
    the checkpoint and the claim's status all name the same CPUs; a pod without a claim runs
    on the rest, before, while and after."""
    pinned.create("plain")
    wait_pod_running(pinned.cp, pinned.namespace, "plain")
    assert pinned.runs_on("plain") == pinned.online, "nothing claimed yet: every CPU"

    pod = pinned.run_claim_pod("claimer")
    claim = pinned.claim_of(pod)
    uid = claim["metadata"]["uid"]
    cpus, mems = pinned.grants(uid)
    assert cpus
    assert not cpus & parse_cpu_list(RESERVED)
    (report, *_) = wait_reports(pinned.cp, pinned.namespace, "claimer")
    assert parse_cpu_list(report["cpus_allowed_list"]) == cpus, report
    assert parse_cpu_list(report["mems_allowed_list"]) == mems, report
    assert parse_cpu_list(report["cgroup"]["cpus"]) == cpus, report
    assert parse_cpu_list(report["cgroup"]["mems"]) == mems, report
    told = device_metadata(report, pinned.driver, claim)
    assert told["cpus"] == parse_cpu_list(report["cpus_allowed_list"]), report
    assert told["memoryNodes"] == mems
    assert pinned.runs_on("claimer") == cpus
    cgroup = cpuset_cgroup(pinned.node.pod_pid(pinned.namespace, "claimer"))
    assert (parse_cpu_list(cgroup.cpus), parse_cpu_list(cgroup.mems)) == (cpus, mems)
    (entry,) = wait_claim_status(
        pinned.cp, pinned.namespace, claim["metadata"]["name"], pinned.driver, present=True
    )
    assert parse_cpu_list(entry["data"]["cpus"]) == cpus
    assert parse_cpu_list(entry["data"]["mems"]) == mems

    pinned.wait_runs_on("plain", pinned.online - cpus)

    pinned.cp.request("DELETE", f"/api/v1/namespaces/{pinned.namespace}/pods/claimer")
    pinned.wait_runs_on("plain", pinned.online)
    poll(
        lambda: True if not pinned.claimed() else None,
        60,
        lambda: f"the claim released; claimed CPUs {format_cpu_list(pinned.claimed())}",
    )


def test_a_claim_that_does_not_fit_leaves_the_pod_pending(pinned: Pinned) -> None:
    """Two claims, one free CPU: the second pod waits, with the scheduler's reason."""
    pinned.run_claim_pod("first")
    before = Checkpoint(pinned.factory.dirs.checkpoint).load()
    pinned.cp.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{pinned.namespace}/resourceclaimtemplates",
        claim_template("second", pinned.driver, claims_capacity(pinned.policy)),
    )
    pinned.create("second", claims=[{"name": "cpus", "resourceClaimTemplateName": "second"}])
    events = poll(
        lambda: e if (e := pod_events(pinned.cp, pinned.namespace, "second")) else None,
        60,
        lambda: "an event saying why pod second is not scheduled",
    )
    assert any(
        "cannot allocate all claims" in e or "Insufficient" in e or "didn't" in e for e in events
    ), events
    pod = pinned.cp.request("GET", f"/api/v1/namespaces/{pinned.namespace}/pods/second")
    assert pod["status"]["phase"] == "Pending"
    assert Checkpoint(pinned.factory.dirs.checkpoint).load() == before, "nothing allocated"


def test_the_claim_s_cpu_and_memory_are_in_the_pod_s_cgroup_limits(
    pinned: Pinned, cluster_profile: ClusterProfile
) -> None:
    """The devices map the node's cpu (and memory): the scheduler accounts the claim in the
    pod's status, and the kubelet adds it to the pod's requests and to the limits the
    container declares, as the cgroup files say; a container that declares none gets none.
    Without DRANodeAllocatableResources the cgroups hold what the containers declare."""
    capacity = claims_capacity(pinned.policy) or {}
    mapped = cluster_profile.on("DRANodeAllocatableResources")
    claimed_cpu = 1000 if mapped else 0  # millicores
    claimed_memory = int(parse_quantity(capacity.get("memory", "0"))) if mapped else 0
    requests = {"cpu": "100m", "memory": "32Mi"}
    limits = {"cpu": "200m", "memory": "64Mi"}

    pod = pinned.run_claim_pod("requests-only", resources={"requests": requests})
    statuses = pod["status"].get("nodeAllocatableResourceClaimStatuses") or []
    if mapped:
        (status,) = statuses
        assert status["resourceClaimName"] == pinned.claim_of(pod)["metadata"]["name"]
        assert {m["name"]: parse_quantity(m["quantity"]) for m in status["mapping"]} == (
            {"cpu": 1, "memory": claimed_memory} if claimed_memory else {"cpu": 1}
        )
    else:
        assert statuses == []
    container, pod_cgroup = pinned.cgroups("requests-only")
    # The pod's share of CPU time is its requests with the claim's CPU (MilliCPUToShares).
    assert read_int(pod_cgroup["cpu"], "cpu.shares") == (100 + claimed_cpu) * 1024 // 1000
    for directory in (container, pod_cgroup):
        assert read_int(directory["cpu"], "cpu.cfs_quota_us") == -1, directory
        assert read_int(directory["memory"], "memory.limit_in_bytes") >= UNLIMITED_MEMORY
    pinned.cp.request("DELETE", f"/api/v1/namespaces/{pinned.namespace}/pods/requests-only")
    poll(lambda: True if not pinned.claimed() else None, 60, lambda: "the claim released")

    pinned.run_claim_pod("limited", resources={"requests": requests, "limits": limits})
    container, pod_cgroup = pinned.cgroups("limited")
    period = read_int(container["cpu"], "cpu.cfs_period_us")
    cpu_limit = (200 + claimed_cpu) * period // 1000  # the kubelet's MilliCPUToQuota
    memory_limit = (64 << 20) + claimed_memory
    for directory in (container, pod_cgroup):
        assert read_int(directory["cpu"], "cpu.cfs_quota_us") == cpu_limit, directory
        assert read_int(directory["memory"], "memory.limit_in_bytes") == memory_limit, directory


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_nodedra_restarts_keep_every_cpuset(pinned: Pinned, how: signal.Signals) -> None:
    pod = pinned.run_claim_pod("claimer")
    cpus, _ = pinned.grants(pinned.claim_of(pod)["metadata"]["uid"])
    pinned.create("plain")
    wait_pod_running(pinned.cp, pinned.namespace, "plain")
    pinned.wait_runs_on("plain", pinned.online - cpus)
    before = Checkpoint(pinned.factory.dirs.checkpoint).load()

    if how == signal.SIGTERM:
        assert pinned.nodedra.terminate() == 0
    else:
        pinned.nodedra.kill()
    # Away: a pod without claims is created unpinned (the runtime goes on without us).
    pinned.create("meanwhile")
    wait_pod_running(pinned.cp, pinned.namespace, "meanwhile")
    assert pinned.runs_on("meanwhile") == pinned.online

    pinned.start_nodedra()
    assert Checkpoint(pinned.factory.dirs.checkpoint).load() == before, "nothing lost or given"
    assert pinned.runs_on("claimer") == cpus
    assert pinned.runs_on("plain") == pinned.online - cpus
    pinned.wait_runs_on("meanwhile", pinned.online - cpus)


@pytest.mark.parametrize("daemon", ["runtime", "kubelet"])
def test_runtime_and_kubelet_restarts_keep_every_cpuset(pinned: Pinned, daemon: str) -> None:
    pod = pinned.run_claim_pod("claimer")
    cpus, _ = pinned.grants(pinned.claim_of(pod)["metadata"]["uid"])
    pinned.create("plain")
    wait_pod_running(pinned.cp, pinned.namespace, "plain")
    pinned.wait_runs_on("plain", pinned.online - cpus)
    if daemon == "runtime":
        pinned.node.restart_runtime()
    else:
        pinned.node.restart_kubelet()
        pinned.node.wait_pods_synced()
    pinned.nodedra.wait_ready(pinned.cp, pinned.node.node_name, pinned.driver)
    assert pinned.runs_on("claimer") == cpus
    assert pinned.runs_on("plain") == pinned.online - cpus
    pinned.create("after")
    wait_pod_running(pinned.cp, pinned.namespace, "after")
    assert pinned.runs_on("after") == pinned.online - cpus
