"""Restarts on the VM node: containerd, nodedra's container, a reboot, and a power cut while
a claim is being prepared.

With nodedra deployed and no other claim held (test_cluster gives its claim back), the keeper
pod holds a claim on NUMA node 1 through all of them and must come out of each on the CPU and
memory node its claim was given. quietCPUs is on (test_quiet_cpus left it so): the host's
processes keep off the keeper's CPU across nodedra's death and the reboot. What survives
what: nodedra's checkpoint (``/var/lib/nodedra``) and the kubelet's (``/var/lib/kubelet``)
are on the guest's disk, the CDI specs (``/var/run/cdi``) on its tmpfs, gone at every boot.
"""

from __future__ import annotations

import base64
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from nodedra.lib.faults import CRASH_AT, PREPARE_CHECKPOINT
from nodedra.resmgr.checkpoint import FILE_NAME, Checkpoint
from nodedra.topology import format_cpu_list, parse_cpu_list
from tests.integration.vm_cluster import (
    CLAIMS,
    HOST_UNITS,
    SERVICES,
    TEST_NAMESPACE,
    claim_pod,
    host_processes,
    numa1_claim,
)
from tests.peers.cluster import get_pod, poll
from tests.peers.deployment import NAMESPACE, ToolError, rollout_status
from tests.peers.pods import container_id, create_pod, wait_pod_running
from tests.peers.vm_cluster import VMCluster

pytestmark = pytest.mark.timeout(1800)

#: (CPUs, memory nodes) a container may use, as its /proc/<pid>/status says.
Placement = tuple[str, str]
NUMA1_CPUS = frozenset({2, 3})
NUMA1 = {"numa_node": "1"}
#: Left on /run before the reboot: gone after it, as the CDI specs are.
MARKER = "/run/nodedra-test-before-reboot"


def _create_claim_pod(cluster: VMCluster, name: str) -> None:
    """A claim ``name`` on NUMA node 1 and the pod ``name`` using it."""
    cluster.cp.request("POST", CLAIMS, numa1_claim(name))
    create_pod(cluster.cp, TEST_NAMESPACE, claim_pod(name, name))


@pytest.fixture(scope="module")
def keeper(deployed: VMCluster) -> Placement:
    """The keeper pod running with its claim: where its container runs."""
    _create_claim_pod(deployed, "keeper")
    pod = wait_pod_running(deployed.cp, TEST_NAMESPACE, "keeper", timeout=300)
    cpus, mems = deployed.allowed(pod, "workload")
    assert mems == "1", mems
    assert len(parse_cpu_list(cpus)) == 1, cpus
    assert parse_cpu_list(cpus) <= NUMA1_CPUS, cpus
    return cpus, mems


def assert_in_place(cluster: VMCluster, pinned: dict[str, Placement]) -> None:
    """Each pod of ``pinned`` on its claim's CPUs and memory nodes, nodedra on the rest of
    the machine."""
    claimed: set[int] = set()
    for name, placement in pinned.items():
        cluster.wait_allowed(TEST_NAMESPACE, name, "workload", placement)
        claimed |= parse_cpu_list(placement[0])
    shared = (format_cpu_list(frozenset(range(4)) - claimed), "0-1")
    (nodedra,) = cluster.nodedra_pods()
    cluster.wait_allowed(NAMESPACE, nodedra["metadata"]["name"], "nodedra", shared)


def assert_host_processes_off(cluster: VMCluster, cpus: str) -> None:
    """systemd's slices (and the kubelet and containerd in them) on every CPU but ``cpus``:
    quietCPUs at work (the pods' slice is the kubelet's, test_quiet_cpus shows it untouched)."""
    off = frozenset(range(4)) - parse_cpu_list(cpus)
    want = dict.fromkeys((*HOST_UNITS, *SERVICES), off)

    def host() -> dict[str, frozenset[int]]:
        return {k: v for k, v in host_processes(cluster).items() if k in want}

    poll(
        lambda: True if host() == want else None,
        120,
        lambda: f"host processes off {cpus}: {host()}\n{cluster.nodedra_logs()}",
        2.0,
    )


def _newest_nodedra_status(cluster: VMCluster) -> dict[str, Any]:
    """The container status of the newest nodedra pod (``{}`` before it has one)."""
    statuses = cluster.nodedra_pods()[-1]["status"].get("containerStatuses") or [{}]
    status: dict[str, Any] = statuses[0]
    return status


def test_a_containerd_restart_moves_no_container(deployed: VMCluster, keeper: Placement) -> None:
    """containerd restarts without its containers (their shims stay); nodedra connects to
    the new containerd and synchronizes, and nothing moves."""
    synchronize = {"event": "Synchronize", "result": "ok"}
    syncs = deployed.metric("nodedra_nri_events_total", synchronize)
    keeper_id = container_id(get_pod(deployed.cp, TEST_NAMESPACE, "keeper"))
    (nodedra,) = deployed.nodedra_pods()
    deployed.vm.run("systemctl restart containerd", timeout=180).check()

    def synchronized_again() -> bool | None:
        try:
            connected = deployed.metric("nodedra_nri_connected") == 1
            again = deployed.metric("nodedra_nri_events_total", synchronize) > syncs
        except ToolError:  # kubectl exec goes through the kubelet to containerd
            return None
        return True if connected and again else None

    poll(synchronized_again, 180, lambda: "nodedra synchronized with the new containerd", 2.0)
    assert container_id(get_pod(deployed.cp, TEST_NAMESPACE, "keeper")) == keeper_id
    (after,) = deployed.nodedra_pods()
    assert container_id(after, "nodedra") == container_id(nodedra, "nodedra")
    assert_in_place(deployed, {"keeper": keeper})


def test_nodedra_killed_comes_back_holding_its_claim(
    deployed: VMCluster, keeper: Placement
) -> None:
    """SIGKILL, as the OOM killer sends it: the kubelet starts nodedra's container again,
    which takes its claim back from the checkpoint. What quietCPUs narrowed stays narrowed
    meanwhile, and the new one goes on from its record."""
    assert_host_processes_off(deployed, keeper[0])
    (pod,) = deployed.nodedra_pods()
    restarts = deployed.nodedra_restarts()
    deployed.vm.run(f"kill -KILL {deployed.pid(pod, 'nodedra')}").check()
    assert_host_processes_off(deployed, keeper[0])
    deployed.wait_nodedra_ready(restarts=restarts + 1)
    assert_host_processes_off(deployed, keeper[0])
    assert deployed.metric("nodedra_claims_held") == 1
    assert deployed.metric("nodedra_cpus_allocated", NUMA1) == 1
    assert_in_place(deployed, {"keeper": keeper})
    # What an admin reads with kubectl exec: the claim it took back, on the keeper's CPU.
    (claim,) = deployed.nodedra_status()["claims"]
    assert (claim["namespace"], claim["name"], claim["cpus"]) == (
        TEST_NAMESPACE,
        "keeper",
        keeper[0],
    )
    assert [pod["name"] for pod in claim["pods"]] == ["keeper"]


def test_after_a_reboot_every_pod_runs_again_on_its_claim(
    deployed: VMCluster, keeper: Placement
) -> None:
    """``systemctl reboot``: the disk kept, /run fresh. The kubelet prepares the keeper's
    claim again (its checkpoint keeps the claim, not that it was prepared); nodedra, holding
    it in its checkpoint, gives the same CPU and writes the CDI spec the reboot took. The
    boot gave systemd its defaults back; nodedra drops the record of the boot before and
    keeps the host's processes off the claim again."""
    vm = deployed.vm
    claim = deployed.cp.request("GET", f"{CLAIMS}/keeper")
    spec = f"/var/run/cdi/*{claim['metadata']['uid']}.yaml"
    vm.run(f"ls {spec} && touch {MARKER}").check()
    (nodedra,) = deployed.nodedra_pods()
    old = {
        "keeper": container_id(get_pod(deployed.cp, TEST_NAMESPACE, "keeper")),
        "nodedra": container_id(nodedra, "nodedra"),
    }
    boot_id = vm.boot_id
    started = time.monotonic()
    vm.reboot()
    booted = time.monotonic() - started
    assert vm.boot_id != boot_id
    assert vm.run(f"test -e {MARKER}").returncode != 0, "/run was kept across the reboot"

    name = nodedra["metadata"]["name"]
    deployed.wait_running_anew(NAMESPACE, name, "nodedra", old["nodedra"])
    deployed.wait_running_anew(TEST_NAMESPACE, "keeper", "workload", old["keeper"])
    print(
        f"[vm] reboot: guest up {booted:.1f}s after systemctl reboot, every pod running "
        f"{time.monotonic() - started:.1f}s after it"
    )
    assert_in_place(deployed, {"keeper": keeper})
    vm.run(f"ls {spec}").check()
    assert deployed.metric("nodedra_claims_held") == 1
    assert deployed.metric("nodedra_cpus_allocated", NUMA1) == 1
    prepared = {"kind": "prepare", "result": "ok"}
    prepares = deployed.metric("nodedra_requests_total", prepared)
    print(f"[vm] since the boot the kubelet had {prepares:.0f} claim(s) prepared")
    assert prepares >= 1, "the CDI spec is back without a prepare"
    assert deployed.nodedra_get("/readyz")[0] == 200
    assert_host_processes_off(deployed, keeper[0])


def test_a_power_cut_while_a_claim_is_prepared_gives_nothing_twice(
    deployed: VMCluster, keeper: Placement, tmp_path: Path
) -> None:
    """nodedra dies inside a prepare, right after its checkpoint's new state is written in
    place (not synced, the kubelet told nothing), and the guest loses power. After the boot
    the claim's pod runs on the NUMA node's other CPU: the claim is held once, whichever
    state the power cut left."""
    point = PREPARE_CHECKPOINT.written
    deployed.kubectl("-n", NAMESPACE, "set", "env", "daemonset/nodedra", f"{CRASH_AT}={point}")
    rollout_status(deployed.kubectl, timeout=600)
    _create_claim_pod(deployed, "cut")
    status = poll(
        lambda: _newest_nodedra_status(deployed).get("restartCount") or None,
        300,
        lambda: f"nodedra dead at {point}:\n{deployed.nodedra_logs()}",
        2.0,
    )
    died = _newest_nodedra_status(deployed)["lastState"]["terminated"]
    assert died["exitCode"] == 128 + signal.SIGKILL, died
    crashing = deployed.nodedra_pods()[-1]
    claim = deployed.cp.request("GET", f"{CLAIMS}/cut")

    deployed.vm.power_off()
    # With the node off, the admin takes the crash point out of the DaemonSet and removes
    # the crashing pod for good: the pod made after the boot is the fixed one.
    deployed.kubectl("-n", NAMESPACE, "set", "env", "daemonset/nodedra", f"{CRASH_AT}-")
    deployed.kubectl(
        "-n", NAMESPACE, "delete", "pod", crashing["metadata"]["name"],
        "--force", "--grace-period=0",
    )  # fmt: skip
    deployed.vm.start()
    # Read before nodedra is back (the kubelet is still starting): what the power cut left.
    uid = claim["metadata"]["uid"]
    saved = deployed.vm.run(f"base64 -w0 /var/lib/nodedra/{FILE_NAME}").check()
    (tmp_path / FILE_NAME).write_bytes(base64.b64decode(saved))
    state = Checkpoint(tmp_path / FILE_NAME).load()
    held = state is not None and uid in state.claims
    print(f"[vm] power cut {status} restart(s) after the crash; the claim on disk: {held}")

    deployed.wait_nodedra_ready()
    cut = wait_pod_running(deployed.cp, TEST_NAMESPACE, "cut", timeout=600)
    cut_placement = deployed.allowed(cut, "workload")
    other = format_cpu_list(NUMA1_CPUS - parse_cpu_list(keeper[0]))
    assert cut_placement == (other, "1"), f"the cut claim's pod runs on {cut_placement}"
    assert_in_place(deployed, {"keeper": keeper, "cut": cut_placement})
    assert deployed.metric("nodedra_claims_held") == 2
    assert deployed.metric("nodedra_cpus_allocated", NUMA1) == 2
