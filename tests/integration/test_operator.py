"""The operator, `nodedra run`, as a process of its own against the real peers.

Every test runs `python -m nodedra run` (the real main program, not the library) with the
credentials its DaemonSet pod would have: a ServiceAccount token bound to a Pod on the test
node, so the ClusterRole and the ValidatingAdmissionPolicy of manifests/ apply for real. The
kubelet is the kubelet's own plugin manager and DRA manager (the kubelet harness); pods are
scheduled and their claims allocated by the real kube-scheduler and kube-controller-manager.
nodedra reads the sysfs of a two-socket, four-NUMA-node machine (tests/fixtures/sysfs), so
its four devices offer 14 CPUs each, less the reserved ones.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodedra.lib.quantity import parse_quantity
from nodedra.resmgr.checkpoint import Checkpoint
from nodedra.topology import parse_cpu_list
from tests.conftest import KubeletFactory, NodedraFactory
from tests.peers.cluster import (
    poll,
    resource_slices,
)
from tests.peers.controlplane import ControlPlane, write_kubeconfig
from tests.peers.kubelet import KubeletHarness
from tests.peers.nodedra_node import (
    MANIFESTS,
    SAMPLES,
    SERVICE_ACCOUNT_USER,
    TOPOLOGY_AWARE,
    NodedraProcess,
    ResourcePaths,
    apply_objects,
    delete_pod,
    dry_run_create_slice,
    env_of_spec,
    kube_request,
    load_manifests,
    manifest_files,
    pod_identity,
    prepared_cpus,
    registrations,
    start_claim_pod,
    wait_claim_status,
)
from tests.peers.ports import LOOPBACK, free_port
from tests.peers.profile import ClusterProfile

DEVICES = 4
#: CPUs of each NUMA node of the fixture machine.
NUMA_CPUS = {
    0: parse_cpu_list("0-6,28-34"),
    1: parse_cpu_list("7-13,35-41"),
    2: parse_cpu_list("14-20,42-48"),
    3: parse_cpu_list("21-27,49-55"),
}
#: Less than the DaemonSet's terminationGracePeriodSeconds (60): nodedra must be well within.
GRACE = 20.0
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


@pytest.fixture
def kubelet(ready_node: str, kubelet_factory: KubeletFactory) -> KubeletHarness:
    """The node's kubelet, past its start-up wipe of the node's slices."""
    harness = kubelet_factory(ready_node)
    harness.wait_slice_wipe("")
    return harness


def devices_by_name(cp: ControlPlane, node: str) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d
        for s in resource_slices(cp, node, TOPOLOGY_AWARE)
        for d in s["spec"].get("devices") or []
    }


def cpu_capacity(cp: ControlPlane, node: str) -> dict[str, str]:
    return {n: d["capacity"]["cpu"]["value"] for n, d in devices_by_name(cp, node).items()}


def wait_cpu_capacity(cp: ControlPlane, node: str, expected: dict[str, str]) -> None:
    seen: dict[str, str] = {}

    def check() -> bool | None:
        nonlocal seen
        seen = cpu_capacity(cp, node)
        return True if seen == expected else None

    poll(check, 20, lambda: f"cpu capacities {expected}, seen {seen}")


def errors_in(nodedra: NodedraProcess) -> list[str]:
    return [line for line in nodedra.log_text().splitlines() if " ERROR " in line]


# -- start-up and shutdown ---------------------------------------------------------------------


def test_starts_registers_publishes_and_stops_cleanly(
    nodedra_installed: ControlPlane, kubelet: KubeletHarness, nodedra_factory: NodedraFactory
) -> None:
    """A DaemonSet pod's whole life: what the kubelet and the cluster see of it, then SIGTERM."""
    cp = nodedra_installed
    node = kubelet.node_name
    identity = nodedra_factory.identity(node)
    nodedra = nodedra_factory(kubelet, identity=identity)

    plugin = nodedra.wait_serving(cp, kubelet, TOPOLOGY_AWARE, DEVICES)

    # Registered the kubelet's way, which chose the v1 service.
    assert plugin.endpoint == str(nodedra.dra_socket)
    assert plugin.versions == DRA_SERVICES
    assert plugin.chosen_service == "v1.DRAPlugin"
    for path in (nodedra.dra_socket, nodedra.registration_socket(TOPOLOGY_AWARE)):
        assert stat.S_ISSOCK(path.stat().st_mode), path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path

    # The slices: one pool named after the node, owned by the Node, the reserved CPU left out.
    slices = resource_slices(cp, node, TOPOLOGY_AWARE)
    node_uid = cp.request("GET", f"/api/v1/nodes/{node}")["metadata"]["uid"]
    assert {s["spec"]["pool"]["name"] for s in slices} == {node}
    for item in slices:
        (owner,) = item["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", node, node_uid)
    assert cpu_capacity(cp, node) == {
        "cpudevnuma000": "13",
        "cpudevnuma001": "14",
        "cpudevnuma002": "14",
        "cpudevnuma003": "14",
    }

    # Those slices were written with the pod's token: it is nodedra's ServiceAccount, its
    # node is the one the admission policy lets it write slices of, and it may (RBAC and
    # the admission policy: a server-side dry run passes both) write this node's slices.
    status, review = kube_request(
        cp,
        identity.token,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert status == 201, review
    user = review["status"]["userInfo"]
    assert user["username"] == SERVICE_ACCOUNT_USER
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [node]
    assert dry_run_create_slice(cp, identity.token, node)[0] == 201
    nodedra.wait_for_log(f"ResourceSlices of pool {node}: 1 created")

    # Health and metrics.
    status, body = nodedra.healthz()
    assert status == 200
    assert json.loads(body)["nodedra"]["started"] is True
    status, body = nodedra.readyz()
    assert status == 200, body
    readiness = json.loads(body)
    preflight = readiness.pop("preflight")
    assert set(preflight) == {
        "kubelet-cpu-manager",
        "kubelet-memory-topology-managers",
        "reserved-cpus",
        "container-runtime",
        "other-cpu-drivers",
        "feature-gates",
        "numa-attribute",
    }
    assert "fail" not in preflight.values(), preflight
    assert readiness == {
        "ready": True,
        "driver": TOPOLOGY_AWARE,
        "serving": True,
        "registered": True,
        "published": True,
        "runtime": None,
        "problems": [],
    }
    assert nodedra.metric("nodedra_devices_published") == DEVICES
    assert nodedra.metric("nodedra_claims_held") == 0
    # Nothing went wrong on the way (kopf's listing of CRDs was an ERROR every few seconds).
    assert errors_in(nodedra) == []

    # SIGTERM, as the kubelet stops the pod.
    assert nodedra.terminate(timeout=GRACE) == 0
    assert not nodedra.dra_socket.exists()
    assert not nodedra.registration_socket(TOPOLOGY_AWARE).exists()
    kubelet.wait_unregistered(TOPOLOGY_AWARE)
    assert registrations(kubelet) == []
    # The slices stay for the next instance (the kubelet wipes them only 30 s later).
    assert len(devices_by_name(cp, node)) == DEVICES
    state = Checkpoint(nodedra.dirs.checkpoint).load()
    assert state is not None
    assert (state.policy, state.driver, dict(state.claims)) == (
        "topology-aware",
        TOPOLOGY_AWARE,
        {},
    )
    assert errors_in(nodedra) == []


# -- the ResourceSlice watch ---------------------------------------------------------------------


def test_deleted_slices_come_back_through_the_watch(
    nodedra_installed: ControlPlane, kubelet: KubeletHarness, nodedra_factory: NodedraFactory
) -> None:
    """Slices someone deletes come back at once: the watch, not the 30 s resync, notices."""
    cp = nodedra_installed
    node = kubelet.node_name
    # The periodic resync could not explain a return: only the watch of our slices can.
    nodedra = nodedra_factory(kubelet, env={"NODEDRA_RESYNC_PERIOD": "3600"})
    nodedra.wait_serving(cp, kubelet, TOPOLOGY_AWARE, DEVICES)
    before = {s["metadata"]["uid"] for s in resource_slices(cp, node, TOPOLOGY_AWARE)}

    selector = urllib.parse.urlencode(
        {"fieldSelector": f"spec.nodeName={node},spec.driver={TOPOLOGY_AWARE}"}
    )
    cp.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices?{selector}")

    def back() -> list[dict[str, Any]] | None:
        slices = resource_slices(cp, node, TOPOLOGY_AWARE)
        uids = {s["metadata"]["uid"] for s in slices}
        devices = sum(len(s["spec"].get("devices") or []) for s in slices)
        return slices if devices == DEVICES and not uids & before else None

    slices = poll(back, 10, lambda: "the deleted slices to be published again")
    assert {s["spec"]["pool"]["name"] for s in slices} == {node}
    assert len(devices_by_name(cp, node)) == DEVICES
    assert nodedra.alive()


# -- live reconfiguration ------------------------------------------------------------------------


def test_config_changes_apply_live_and_bad_ones_are_refused(
    nodedra_installed: ControlPlane, kubelet: KubeletHarness, nodedra_factory: NodedraFactory
) -> None:
    """ConfigMap edits reach a running node; a bad edit is refused loudly and changes nothing."""
    cp = nodedra_installed
    node = kubelet.node_name
    nodedra = nodedra_factory(kubelet, env={"NODEDRA_CONFIG_POLL": "0.5"})
    nodedra.wait_serving(cp, kubelet, TOPOLOGY_AWARE, DEVICES)
    assert cpu_capacity(cp, node)["cpudevnuma000"] == "13"

    # More reserved CPUs, on two NUMA nodes: those devices offer fewer.
    nodedra_factory.write_config({"policy": "topology-aware", "reservedCPUs": "0-3,7"})
    wait_cpu_capacity(
        cp,
        node,
        {
            "cpudevnuma000": "10",
            "cpudevnuma001": "13",
            "cpudevnuma002": "14",
            "cpudevnuma003": "14",
        },
    )
    nodedra.wait_for_log("applied")
    applied = {"result": "applied"}
    assert nodedra.metric("nodedra_config_reloads_total", applied) == 1

    # A file that does not parse, then one the policy refuses: both are refused and said so,
    # and the devices in force stay.
    nodedra_factory.write_config("policy: topology-aware\nreservedCPU: '0'\n")
    line = nodedra.wait_for_log("refused")
    assert "unknown keys ['reservedCPU']" in line
    nodedra_factory.write_config({"policy": "topology-aware", "reservedCPUs": "0-55"})
    poll(
        lambda: nodedra.metric("nodedra_config_reloads_total", {"result": "refused"}) == 2 or None,
        20,
        lambda: f"two refused reloads:\n{nodedra.process.tail()}",
    )
    refusals = [line for line in errors_in(nodedra) if "refused" in line]
    assert len(refusals) == 2, refusals
    assert cpu_capacity(cp, node) == {
        "cpudevnuma000": "10",
        "cpudevnuma001": "13",
        "cpudevnuma002": "14",
        "cpudevnuma003": "14",
    }
    assert nodedra.metric("nodedra_devices_published") == DEVICES

    # And the watcher still takes good ones.
    nodedra_factory.write_config({"policy": "topology-aware", "reservedCPUs": ""})
    wait_cpu_capacity(cp, node, {f"cpudevnuma00{i}": "14" for i in range(4)})
    assert nodedra.metric("nodedra_config_reloads_total", applied) == 2
    assert nodedra.alive()


# -- claims, end to end ---------------------------------------------------------------------------


def expected_grant(
    profile: ClusterProfile, result: dict[str, Any], device: dict[str, Any]
) -> tuple[int, int]:
    """CPUs and bytes a result of 2 CPUs and 128Mi gets: that, or without consumable
    capacity (the request is dropped) the whole device, less the reserved CPU 0."""
    if profile.on("DRAConsumableCapacity"):
        consumed = {k: parse_quantity(v) for k, v in result["consumedCapacity"].items()}
        # The huge pages of the device, asked for by no one, are consumed as none.
        assert {k: n for k, n in consumed.items() if n} == {"cpu": 2, "memory": 128 << 20}, consumed
        return 2, 128 << 20
    assert "consumedCapacity" not in result
    numa = int(result["device"].removeprefix("cpudevnuma"))
    return len(NUMA_CPUS[numa] - {0}), int(parse_quantity(device["capacity"]["memory"]["value"]))


def status_writes(nodedra: NodedraProcess, more_than: float) -> float:
    """Wait until nodedra counts more than ``more_than`` claim status writes; the count.

    It counts after the server answered, so after the status is seen; a watch event older
    than the write, arriving just after it, may cost one more (harmless) write.
    """
    labels = {"result": "written"}

    def counted() -> float:
        return nodedra.metric("nodedra_claim_status_writes_total", labels) or 0.0

    count = poll(
        lambda: counted() if counted() > more_than else None,
        10,
        lambda: f"more than {more_than} status writes, counted {counted()}",
    )
    assert nodedra.metric("nodedra_claim_status_writes_total", {"result": "failed"}) == 0
    return count


def test_pod_claim_is_prepared_and_described_in_its_status(
    workload_controllers: ControlPlane,
    cluster_profile: ClusterProfile,
    namespace: str,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
) -> None:
    """A pod's claim, scheduler to kubelet: the CPUs it gets, and the status that says so.
    Without DRAConsumableCapacity the claim's capacity request is dropped, and it gets the
    whole device: every CPU of the NUMA node but the reserved one, and all its memory."""
    cp = workload_controllers
    node = kubelet.node_name
    nodedra = nodedra_factory(kubelet)
    nodedra.wait_serving(cp, kubelet, TOPOLOGY_AWARE, DEVICES)

    claim = start_claim_pod(cp, namespace, node, "consumer", {"cpu": "2", "memory": "128Mi"})
    uid = claim["metadata"]["uid"]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (TOPOLOGY_AWARE, node)
    numa = int(result["device"].removeprefix("cpudevnuma"))
    want_cpus, want_memory = expected_grant(
        cluster_profile, result, devices_by_name(cp, node)[result["device"]]
    )

    containers = kubelet.prepare(namespace, "consumer")

    assert containers == {"demo": [f"{TOPOLOGY_AWARE}/device=claim-{uid}-0"]}
    spec_path = nodedra.dirs.spec_path(TOPOLOGY_AWARE, uid)
    spec = yaml.safe_load(spec_path.read_text())
    assert spec["kind"] == f"{TOPOLOGY_AWARE}/device"
    assert [d["name"] for d in spec["devices"]] == [f"claim-{uid}-0"]
    env = env_of_spec(spec)
    key = uid.replace("-", "_") + "_0"
    assert set(env) == {f"DRA_CPUSET_{key}", f"DRA_MEMSET_{key}", f"DRA_MEMORY_{key}"}
    cpus = parse_cpu_list(env[f"DRA_CPUSET_{key}"])
    assert len(cpus) == want_cpus
    assert cpus <= NUMA_CPUS[numa] - {0}  # inside the device's NUMA node, not the reserved CPU
    assert env[f"DRA_MEMSET_{key}"] == str(numa)
    assert env[f"DRA_MEMORY_{key}"] == str(want_memory)

    # nodedra describes what the claim got in its status.
    (entry,) = wait_claim_status(
        cp, namespace, claim["metadata"]["name"], TOPOLOGY_AWARE, present=True
    )
    assert (entry["pool"], entry["device"]) == (node, result["device"])
    assert entry["data"] == {
        "cpus": env[f"DRA_CPUSET_{key}"],
        "mems": str(numa),
        "memory": want_memory,
    }
    assert entry.get("shareID") == result.get("shareID")
    assert nodedra.metric("nodedra_claim_watch_lists_total") == 1  # one list per start
    written = status_writes(nodedra, 0)
    assert nodedra.metric("nodedra_requests_total", {"kind": "prepare", "result": "ok"}) == 1
    assert nodedra.metric("nodedra_claims_held") == 1
    assert nodedra.metric("nodedra_cpus_allocated", {"numa_node": str(numa)}) == want_cpus
    state = Checkpoint(nodedra.dirs.checkpoint).load()
    assert state is not None
    assert set(state.claims) == {uid}

    kubelet.unprepare(namespace, "consumer")

    assert not spec_path.exists()
    wait_claim_status(cp, namespace, claim["metadata"]["name"], TOPOLOGY_AWARE, present=False)
    status_writes(nodedra, written)
    assert nodedra.metric("nodedra_requests_total", {"kind": "unprepare", "result": "ok"}) == 1
    assert nodedra.metric("nodedra_claims_held") == 0
    state = Checkpoint(nodedra.dirs.checkpoint).load()
    assert state is not None
    assert dict(state.claims) == {}
    assert errors_in(nodedra) == []


# -- rolling update -------------------------------------------------------------------------------


def test_a_lost_socket_shuts_it_down_from_the_monitor_thread(
    control_plane: ControlPlane, kubelet: KubeletHarness, nodedra_factory: NodedraFactory
) -> None:
    """Someone removes nodedra's DRA socket: the kubelet can no longer reach it, which it
    cannot repair. The socket monitor (a thread of its own) asks for a shutdown, kopf stops
    gracefully, and the process exits non-zero saying why, for the DaemonSet to restart."""
    nodedra = nodedra_factory(kubelet)
    nodedra.wait_serving(control_plane, kubelet, TOPOLOGY_AWARE, DEVICES)
    socket = nodedra.dra_socket
    socket.unlink()
    assert nodedra.wait_exit(60) == 1
    log = nodedra.log_text()
    assert f"socket {socket} was removed or replaced by someone else" in log
    assert "nodedra run: stopped: dra: gRPC server:" in log
    assert not nodedra.registration_socket(TOPOLOGY_AWARE).exists()


def test_a_claim_gone_from_the_api_is_reported_and_released_when_asked(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
) -> None:
    """A claim deleted before the kubelet unprepared it: counted as an orphan after the
    grace period, and with --release-orphans its CPUs and its spec are given back."""
    cp = workload_controllers
    env = {
        "NODEDRA_RELEASE_ORPHANS": "true",
        "NODEDRA_ORPHAN_GRACE": "1",
        "NODEDRA_CONFIG_POLL": "0.5",
    }
    nodedra = nodedra_factory(kubelet, env=env)
    nodedra.wait_serving(cp, kubelet, TOPOLOGY_AWARE, DEVICES)
    claim = start_claim_pod(cp, namespace, kubelet.node_name, "orphan", {"cpu": "1"})
    uid = claim["metadata"]["uid"]
    kubelet.prepare(namespace, "orphan")
    spec_path = nodedra.dirs.spec_path(TOPOLOGY_AWARE, uid)
    assert spec_path.exists()

    # Gone from the API server while still prepared (the kubelet never unprepares it). The
    # controller-manager's claim controller deletes a template's claim with its pod, so it may
    # well be gone before we ask: either way, it is gone.
    claim_path = (
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/"
        f"{claim['metadata']['name']}"
    )
    cp.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/orphan?gracePeriodSeconds=0")
    cp.delete_if_present(claim_path)

    poll(
        lambda: True if not spec_path.exists() else None,
        30,
        lambda: f"the orphaned claim {uid} to be released",
    )
    assert nodedra.metric("nodedra_claims_held") == 0
    state = Checkpoint(nodedra.dirs.checkpoint).load()
    assert state is not None
    assert state.claims == {}
    assert f"claim {uid} is held here but its ResourceClaim has been gone" in nodedra.log_text()


def test_rolling_update_hands_over_without_unregistering(
    workload_controllers: ControlPlane,
    namespace: str,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
    cluster_profile: ClusterProfile,
) -> None:
    """maxSurge 1: the new pod serves beside the old one and takes over its claims (three
    claims of 2 CPUs: the node's 8 allocatable CPUs hold them all)."""
    cp = workload_controllers
    node = kubelet.node_name
    old = nodedra_factory(kubelet, pod_uid="a")
    old.wait_serving(cp, kubelet, TOPOLOGY_AWARE, DEVICES)
    first = start_claim_pod(cp, namespace, node, "first", {"cpu": "2", "memory": "64Mi"})
    kubelet.prepare(namespace, "first")
    first_uid = first["metadata"]["uid"]

    # The new pod starts beside the old one, on the same directories, with sockets of its own.
    new = nodedra_factory(kubelet, pod_uid="b")
    new.wait_serving(cp, kubelet, TOPOLOGY_AWARE, DEVICES)
    assert {p.endpoint for p in registrations(kubelet) if p.driver == TOPOLOGY_AWARE} == {
        str(old.dra_socket),
        str(new.dra_socket),
    }
    assert old.dra_socket != new.dra_socket
    assert (old.dirs.plugin / "serialize.lock").exists()

    # While both run, the kubelet asks the newer one, which knows what the older one granted.
    during = start_claim_pod(cp, namespace, node, "during", {"cpu": "2", "memory": "64Mi"})
    during_uid = during["metadata"]["uid"]
    kubelet.prepare(namespace, "during")
    assert new.metric("nodedra_requests_total", {"kind": "prepare", "result": "ok"}) == 1
    assert not prepared_cpus(new, first_uid) & prepared_cpus(new, during_uid)
    wait_claim_status(cp, namespace, during["metadata"]["name"], TOPOLOGY_AWARE, present=True)

    # The old one goes: its registration goes with it, the driver's stays, and its last save
    # keeps what the new one committed meanwhile.
    assert old.terminate(timeout=GRACE) == 0
    assert not old.dra_socket.exists()
    assert new.dra_socket.exists()
    poll(
        lambda: [p.endpoint for p in registrations(kubelet)] == [str(new.dra_socket)] or None,
        20,
        lambda: f"only {new.dra_socket} registered; registrations {registrations(kubelet)}",
    )
    assert len(devices_by_name(cp, node)) == DEVICES
    state = Checkpoint(new.dirs.checkpoint).load()
    assert state is not None
    assert set(state.claims) == {first_uid, during_uid}
    assert new.dirs.spec_path(TOPOLOGY_AWARE, during_uid).exists()
    # Both described the claim the same way: its status entry is still there.
    wait_claim_status(cp, namespace, during["metadata"]["name"], TOPOLOGY_AWARE, present=True)

    # The new one serves the next pod, and releases what the old one prepared.
    second = start_claim_pod(cp, namespace, node, "second", {"cpu": "2", "memory": "64Mi"})
    second_uid = second["metadata"]["uid"]
    assert kubelet.prepare(namespace, "second") == {
        "demo": [f"{TOPOLOGY_AWARE}/device=claim-{second_uid}-0"]
    }
    assert new.metric("nodedra_requests_total", {"kind": "prepare", "result": "ok"}) == 2
    held = [prepared_cpus(new, uid) for uid in (first_uid, during_uid, second_uid)]
    assert sum(map(len, held)) == len(frozenset().union(*held)), "no CPU is held twice"
    if cluster_profile.on("DRAConsumableCapacity"):  # else each claim has a whole device
        assert [len(cpus) for cpus in held] == [2, 2, 2]
    kubelet.unprepare(namespace, "first")
    assert not new.dirs.spec_path(TOPOLOGY_AWARE, first_uid).exists()
    assert new.metric("nodedra_claims_held") == 2
    state = Checkpoint(new.dirs.checkpoint).load()
    assert state is not None
    assert set(state.claims) == {during_uid, second_uid}
    assert errors_in(new) == []
    assert errors_in(old) == []


# -- mistakes people make ------------------------------------------------------------------------


def test_without_a_node_name_it_says_so(tmp_path: Path) -> None:
    """The one setting without a default: a DaemonSet without the downward API fails clearly."""
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run(
        [sys.executable, "-m", "nodedra", "run", "--kubeconfig", str(tmp_path / "none")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "no node name: pass --node-name or set NODE_NAME" in done.stderr


def test_unreachable_api_server_stops_it_with_the_address(
    nodedra_installed: ControlPlane,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
    peer_workdir: Path,
) -> None:
    """A wrong kubeconfig or a dead API server: stop before registering, say where it looked."""
    cp = nodedra_installed
    closed = f"https://{LOOPBACK}:{free_port()}"
    kubeconfig = write_kubeconfig(
        peer_workdir / "closed.kubeconfig", closed, cp.ca.pair.cert, "nobody", token="x"
    )
    nodedra = nodedra_factory(kubelet, kubeconfig=kubeconfig)

    assert nodedra.wait_exit(60) == 1
    assert f"nodedra run: cannot start: cannot reach the API server at {closed}" in (
        nodedra.log_text()
    )
    assert registrations(kubelet) == []


def test_unwritable_state_dir_stops_it_naming_the_flag(
    nodedra_installed: ControlPlane,
    kubelet: KubeletHarness,
    nodedra_factory: NodedraFactory,
    peer_workdir: Path,
) -> None:
    """A bad hostPath: stop before registering, naming the flag to fix."""
    regular_file = peer_workdir / "a-file"
    regular_file.write_text("")
    nodedra = nodedra_factory(kubelet, state_dir=regular_file / "state")

    assert nodedra.wait_exit(60) == 1
    assert (
        f"nodedra run: cannot start: --state-dir {regular_file / 'state'} is not writable"
    ) in nodedra.log_text()
    assert registrations(kubelet) == []
    assert list(kubelet.registry_dir.iterdir()) == []


def test_metrics_port_in_use_stops_it_before_it_registers(
    nodedra_installed: ControlPlane, kubelet: KubeletHarness, nodedra_factory: NodedraFactory
) -> None:
    """A busy port stops the start-up before the kubelet knows nodedra, leaving it nothing."""
    with socket.socket() as busy:
        busy.bind((LOOPBACK, 0))
        busy.listen()
        address = f"{LOOPBACK}:{busy.getsockname()[1]}"
        nodedra = nodedra_factory(kubelet, metrics_port=busy.getsockname()[1])

        assert nodedra.wait_exit(60) == 1
    assert (
        f"nodedra run: cannot start: --metrics-address {address}: cannot serve metrics there"
    ) in nodedra.log_text()
    # Nothing was left for the kubelet: no registration socket, no DRA socket.
    assert list(kubelet.registry_dir.iterdir()) == []
    assert not nodedra.dra_socket.exists()
    assert registrations(kubelet) == []


# -- the manifests -------------------------------------------------------------------------------


@pytest.fixture
def cleanup_paths(control_plane: ControlPlane) -> Iterator[list[str]]:
    """API paths to delete after the test (what an apply of the samples created)."""
    paths: list[str] = []
    yield paths
    for path in reversed(paths):
        control_plane.delete_if_present(path)


def test_every_manifest_is_accepted_by_the_api_server(
    workload_controllers: ControlPlane, ready_node: str, cleanup_paths: list[str]
) -> None:
    """`kubectl apply -k manifests/` and `-k manifests/samples/` work on a real API server."""
    cp = workload_controllers
    paths = ResourcePaths(cp)
    objects = load_manifests(manifest_files(MANIFESTS)) + load_manifests(manifest_files(SAMPLES))
    # The DaemonSet and the samples start pods: make sure they go, so that no other test's
    # node gets one, and no pod another test makes in namespace nodedra is adopted (and
    # deleted) by the DaemonSet. The admin's part stays, its namespace too: the other tests
    # use them.
    for obj in objects:
        starts_pods = obj["kind"] in ("DaemonSet", "Pod", "ResourceClaimTemplate", "Namespace")
        ours = obj["kind"] == "Namespace" and obj["metadata"]["name"] == "nodedra"
        if starts_pods and not ours:
            cleanup_paths.append(paths.of(obj))

    applied = apply_objects(cp, objects)

    assert [(o["kind"], o["metadata"]["name"]) for o in applied] == [
        (o["kind"], o["metadata"]["name"]) for o in objects
    ]
    assert all(o["metadata"].get("uid") for o in applied)
    # The DaemonSet's pod passes admission (Pod Security "privileged" for its host paths,
    # its priority class) and is created for the node.
    pods: list[dict[str, Any]] = []

    def daemon_pod() -> dict[str, Any] | None:
        nonlocal pods
        pods = cp.request(
            "GET",
            "/api/v1/namespaces/nodedra/pods?labelSelector=app.kubernetes.io/name%3Dnodedra",
        )["items"]
        ours = [p for p in pods if p["metadata"].get("ownerReferences")]
        return ours[0] if ours else None

    pod = poll(daemon_pod, 30, lambda: f"a pod of the DaemonSet; pods: {pods}")
    cleanup_paths.insert(0, f"/api/v1/namespaces/nodedra/pods/{pod['metadata']['name']}")
    assert pod["spec"]["serviceAccountName"] == "nodedra"
    assert pod["spec"]["priorityClassName"] == "system-node-critical"


def access(cp: ControlPlane, **attributes: str) -> bool:
    """Whether nodedra's ServiceAccount may do it (a SubjectAccessReview, as admin)."""
    review = cp.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": SERVICE_ACCOUNT_USER,
                "groups": [
                    "system:serviceaccounts",
                    "system:serviceaccounts:nodedra",
                    "system:authenticated",
                ],
                "resourceAttributes": attributes,
            },
        },
    )
    return bool(review["status"]["allowed"])


GROUP = "resource.k8s.io"
ALLOWED = [
    *(
        {"group": GROUP, "resource": "resourceslices", "verb": v}
        for v in ("get", "list", "watch", "create", "update", "delete")
    ),
    *(
        {"group": GROUP, "resource": "resourceclaims", "verb": v, "namespace": "any"}
        for v in ("get", "list", "watch")
    ),
    {"group": GROUP, "resource": "resourceclaims", "verb": "list"},  # cluster-wide watch
    {
        "group": GROUP,
        "resource": "resourceclaims",
        "subresource": "status",
        "verb": "patch",
        "namespace": "any",
    },
    {
        "group": GROUP,
        "resource": "resourceclaims",
        "subresource": "driver",
        "verb": "associated-node:patch",
        "name": TOPOLOGY_AWARE,
        "namespace": "any",
    },
    {
        "group": GROUP,
        "resource": "resourceclaims",
        "subresource": "driver",
        "verb": "associated-node:patch",
        "name": "static.nri.io",
        "namespace": "any",
    },
    {"group": "", "resource": "nodes", "verb": "get", "name": "any"},
    {"group": "events.k8s.io", "resource": "events", "verb": "create", "namespace": "default"},
]
DENIED = [
    {"group": "", "resource": "secrets", "verb": "get", "namespace": "nodedra"},
    {"group": "", "resource": "secrets", "verb": "list", "namespace": "kube-system"},
    {"group": "", "resource": "secrets", "verb": "list"},
    {"group": "", "resource": "pods", "verb": "list"},
    {"group": "", "resource": "pods", "verb": "list", "namespace": "nodedra"},
    {"group": "", "resource": "pods", "subresource": "exec", "verb": "create", "namespace": "x"},
    {"group": "", "resource": "configmaps", "verb": "get", "namespace": "kube-system"},
    {"group": "", "resource": "configmaps", "verb": "list", "namespace": "default"},
    {"group": GROUP, "resource": "resourceslices", "verb": "patch"},
    {"group": GROUP, "resource": "resourceslices", "verb": "deletecollection"},
    {"group": GROUP, "resource": "resourceclaims", "verb": "update", "namespace": "any"},
    {
        "group": GROUP,
        "resource": "resourceclaims",
        "subresource": "status",
        "verb": "update",
        "namespace": "any",
    },
    {"group": GROUP, "resource": "resourceclaims", "subresource": "binding", "verb": "patch"},
    # Describing claims of other nodes, or of another driver.
    {
        "group": GROUP,
        "resource": "resourceclaims",
        "subresource": "driver",
        "verb": "arbitrary-node:patch",
        "name": TOPOLOGY_AWARE,
        "namespace": "any",
    },
    {
        "group": GROUP,
        "resource": "resourceclaims",
        "subresource": "driver",
        "verb": "associated-node:patch",
        "name": "gpu.example.com",
        "namespace": "any",
    },
    {"group": "", "resource": "nodes", "verb": "update", "name": "any"},
    {"group": "", "resource": "nodes", "verb": "patch", "name": "any"},
    {"group": "", "resource": "nodes", "verb": "list"},
    {"group": "", "resource": "nodes", "subresource": "status", "verb": "patch", "name": "any"},
    {"group": "rbac.authorization.k8s.io", "resource": "clusterroles", "verb": "escalate"},
    {"group": "rbac.authorization.k8s.io", "resource": "clusterroles", "verb": "bind"},
    {"group": "rbac.authorization.k8s.io", "resource": "clusterrolebindings", "verb": "create"},
    {"group": "", "resource": "users", "verb": "impersonate"},
    {"group": "", "resource": "serviceaccounts", "verb": "impersonate", "namespace": "nodedra"},
    {
        "group": "",
        "resource": "serviceaccounts",
        "subresource": "token",
        "verb": "create",
        "namespace": "nodedra",
    },
    {"group": "apiextensions.k8s.io", "resource": "customresourcedefinitions", "verb": "list"},
    {"group": "coordination.k8s.io", "resource": "leases", "verb": "create", "namespace": "x"},
    {"group": "", "resource": "events", "verb": "create", "namespace": "x"},
    {"group": "events.k8s.io", "resource": "events", "verb": "update", "namespace": "default"},
    {"group": "events.k8s.io", "resource": "events", "verb": "list", "namespace": "default"},
    {"group": "*", "resource": "*", "verb": "*"},
    {"group": GROUP, "resource": "*", "verb": "*"},
]


def _describe(attributes: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in attributes.items())


def test_cluster_role_allows_exactly_what_nodedra_does(nodedra_installed: ControlPlane) -> None:
    """Least privilege, asked of the real authorizer: everything nodedra does and no more."""
    cp = nodedra_installed
    denied = [_describe(a) for a in ALLOWED if not access(cp, **a)]
    allowed = [_describe(a) for a in DENIED if access(cp, **a)]
    assert (denied, allowed) == ([], [])


def test_admission_policy_keeps_nodedra_to_its_own_node(
    nodedra_installed: ControlPlane, ready_node: str, peer_workdir: Path
) -> None:
    """RBAC cannot limit a node agent to its node's slices; the admission policy does."""
    cp = nodedra_installed
    identity = pod_identity(cp, ready_node, peer_workdir)
    try:
        # Its own node's slice passes RBAC and the policy (a server-side dry run: nothing kept).
        assert dry_run_create_slice(cp, identity.token, ready_node)[0] == 201

        # Another node's is refused, by the policy (RBAC allows creating slices).
        def refused() -> dict[str, Any] | None:
            status, answer = dry_run_create_slice(cp, identity.token, "some-other-node")
            return answer if status == 403 else None

        answer = poll(refused, 20, lambda: "the admission policy to refuse another node's slice")
        assert "ValidatingAdmissionPolicy 'nodedra-resourceslices'" in answer["message"]
        assert (
            f'nodedra on node "{ready_node}" may only create ResourceSlices of its own node, '
            'not one of node "some-other-node"'
        ) in answer["message"]

        # A token of the ServiceAccount that no pod is bound to names no node: refused too.
        plain = cp.request(
            "POST",
            "/api/v1/namespaces/nodedra/serviceaccounts/nodedra/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
        )["status"]["token"]
        status, answer = dry_run_create_slice(cp, plain, ready_node)
        assert status == 403, answer
        assert "only with a pod-bound token that names its node" in answer["message"]
    finally:
        delete_pod(cp, identity.pod_name)
