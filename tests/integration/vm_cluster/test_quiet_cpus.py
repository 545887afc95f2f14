"""Quiet CPUs on the guest: device interrupts and unbound kernel work keep off a claim's CPU.

nodedra is deployed from deploy/overlays/quiet-cpus/ (the host's /proc/irq and workqueue directory
mounted writable); this module turns ``quietCPUs`` on in the running deployment's ConfigMap,
claims a CPU of NUMA node 1, and reads the guest's own files: each interrupt's
``smp_affinity_list``, ``/proc/irq/default_smp_affinity`` and the workqueues' ``cpumask``.
Interrupts the kernel manages itself (the virtio queues') refuse, and nodedra's ``/status``
must name each of them. Runs after test_cluster and test_hugepages, and leaves the feature off
and no claim behind for test_restarts.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodedra.quiet.cpumask import parse_mask
from nodedra.topology import parse_cpu_list
from tests.integration.vm_cluster import CLAIMS, TEST_NAMESPACE, claim_pod, edit_config, numa1_claim
from tests.peers.cluster import poll
from tests.peers.pods import create_pod, wait_pod_running
from tests.peers.vm_cluster import VMCluster

pytestmark = pytest.mark.timeout(1800)

#: The deployed file's example, commented out, and the same in force.
OFF = "# quietCPUs:\n#   interrupts: true\n#   unboundWork: true"
ON = "quietCPUs:\n  interrupts: true\n  unboundWork: true"
RECORD = "/var/lib/nodedra/quiet-cpus.json"
REFUSED = "Input/output error (the kernel keeps it where it is)"
ONLY_THERE = "allowed no CPU outside the claims before"
READ_SOURCES = (
    "cd /proc/irq && for irq in [0-9]*; do echo irq/$irq $(cat $irq/smp_affinity_list); done; "
    "echo irq/default $(cat default_smp_affinity); "
    "echo workqueue $(cat /sys/devices/virtual/workqueue/cpumask)"
)


def sources(cluster: VMCluster) -> dict[str, frozenset[int]]:
    """Every source of work the guest's kernel lets nodedra steer, with its CPUs."""
    found = {}
    for line in cluster.vm.run(READ_SOURCES).check().splitlines():
        source, cpus = line.split(" ", 1)
        masked = source in ("irq/default", "workqueue")
        found[source] = parse_mask(cpus) if masked else parse_cpu_list(cpus)
    return found


def quiet_status(cluster: VMCluster) -> dict[str, Any]:
    status: dict[str, Any] = cluster.nodedra_status()["quiet_cpus"]
    return status


def test_host_work_keeps_off_a_claimed_cpu_while_it_is_held(deployed: VMCluster) -> None:
    cp = deployed.cp
    before = sources(deployed)
    edit_config(deployed, OFF, ON)
    poll(
        lambda: True if quiet_status(deployed).get("interrupts") else None,
        120,
        lambda: f"quietCPUs on in nodedra's /status:\n{deployed.nodedra_logs()}",
        2.0,
    )

    cp.request("POST", CLAIMS, numa1_claim("quiet"))
    create_pod(cp, TEST_NAMESPACE, claim_pod("quiet", "quiet"))
    pod = wait_pod_running(cp, TEST_NAMESPACE, "quiet", timeout=300)
    (cpu,) = parse_cpu_list(deployed.allowed(pod, "workload")[0])

    def kept_off() -> tuple[dict[str, frozenset[int]], dict[str, Any]] | None:
        status = quiet_status(deployed)
        if status.get("claimed") != str(cpu):
            return None
        now = sources(deployed)
        return (now, status) if cpu not in now["workqueue"] else None

    now, status = poll(
        kept_off, 120, lambda: f"CPU {cpu} kept quiet:\n{deployed.nodedra_logs()}", 2.0
    )
    assert now["workqueue"] == before["workqueue"] - {cpu}
    assert now["irq/default"] == before["irq/default"] - {cpu}
    moved = [s for s in before if s.startswith("irq/") and cpu in before[s] and cpu not in now[s]]
    assert moved, f"no interrupt moved off CPU {cpu}: {now}"
    # Whatever still may run there is named, with why: the kernel refused to move it (the
    # timer's, the managed queues of virtio devices), or it had only this CPU before.
    still = sorted(s for s, cpus in now.items() if cpu in cpus)
    named = [entry["source"] for entry in status["left"]]
    assert len(named) == len(still), (still, status)
    for entry in status["left"]:
        source = "irq/" + entry["source"].split()[1]
        assert source in still, (entry, still)
        if entry["why"] != REFUSED:
            assert (entry["why"], before[source]) == (ONLY_THERE, frozenset({cpu})), entry
    states = {"state": "off_claims"}, {"state": "left"}
    assert [deployed.metric("nodedra_quiet_cpu_sources", s) for s in states] == [
        status["sources"] - len(named),
        len(named),
    ]
    print(f"[vm] quiet CPU {cpu}: {len(moved)} interrupts moved off; left there: {status['left']}")

    cp.request("DELETE", f"/api/v1/namespaces/{TEST_NAMESPACE}/pods/quiet")
    cp.request("DELETE", f"{CLAIMS}/quiet")
    poll(
        lambda: True if sources(deployed) == before else None,
        180,
        lambda: f"every source back as before:\n{sources(deployed)}\n{before}",
        2.0,
    )
    assert deployed.vm.run(f"test -e {RECORD}").returncode == 0, "on: the originals kept"

    edit_config(deployed, ON, OFF)
    poll(
        lambda: True if deployed.vm.run(f"test -e {RECORD}").returncode else None,
        120,
        lambda: f"quietCPUs off, its record gone:\n{deployed.nodedra_logs()}",
        2.0,
    )
    assert sources(deployed) == before
