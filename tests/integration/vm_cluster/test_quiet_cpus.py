"""Quiet CPUs on the guest: device interrupts, unbound kernel work and the host's processes
keep off a claim's CPU.

nodedra is deployed from deploy/overlays/quiet-cpus/ (the host's /proc/irq and workqueue directory
mounted writable, its /run/dbus); this module turns ``quietCPUs`` on in the running deployment's
ConfigMap, claims a CPU of NUMA node 1, and reads the guest's own files: each interrupt's
``smp_affinity_list``, ``/proc/irq/default_smp_affinity``, the workqueues' ``cpumask``, what
systemd says of its top-level units' ``AllowedCPUs``, and where the kubelet's and containerd's
processes may run. Interrupts the kernel manages itself (the virtio queues') refuse, and
nodedra's ``/status`` must name each of them. The noise probe runs in the claim's container
with the feature off, then on. The feature is turned off live (everything given back) and
on again, and the claim released. Runs after test_cluster and test_hugepages, and leaves the
feature on and no claim behind for test_restarts (which kills nodedra and reboots the guest
with it on).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra.quiet.cpumask import parse_mask
from nodedra.topology import parse_cpu_list
from tests.integration.vm_cluster import (
    CLAIMS,
    HOST_UNITS,
    PODS_UNIT,
    SERVICES,
    TEST_NAMESPACE,
    claim_pod,
    edit_config,
    host_processes,
    numa1_claim,
)
from tests.peers.cluster import poll
from tests.peers.noise import Window, measure, write_results
from tests.peers.pods import container_id, create_pod, wait_pod_running
from tests.peers.vm import MACHINE_ARGS
from tests.peers.vm_cluster import CTR, VMCluster

pytestmark = pytest.mark.timeout(1800)

#: The deployed file's example, commented out, and the same in force.
OFF = "# quietCPUs:\n#   interrupts: true\n#   unboundWork: true\n#   hostProcesses: true"
ON = "quietCPUs:\n  interrupts: true\n  unboundWork: true\n  hostProcesses: true"
RECORD = "/var/lib/nodedra/quiet-cpus.json"
#: The noise probe's window, seconds: 5 in the test run (the assertions count interrupts and
#: tasks, which need no longer), 10 for tox -e bench-quiet's figures.
PROBE_SECONDS = float(os.environ.get("NODEDRA_NOISE_SECONDS") or 5)
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


def turn(cluster: VMCluster, old: str, new: str, on: bool) -> None:
    """quietCPUs turned on or off in the ConfigMap, nodedra's /status saying so, and (off)
    its record gone."""
    edit_config(cluster, old, new)
    poll(
        lambda: True if bool(quiet_status(cluster).get("interrupts")) is on else None,
        120,
        lambda: (
            f"quietCPUs {'on' if on else 'off'} in nodedra's /status:\n{cluster.nodedra_logs()}"
        ),
        2.0,
    )
    if not on:  # everything given back: nothing left on record
        poll(
            lambda: True if cluster.vm.run(f"test -e {RECORD}").returncode else None,
            120,
            lambda: f"quietCPUs off, its record gone:\n{cluster.nodedra_logs()}",
            2.0,
        )


def assert_kept_off(
    deployed: VMCluster, cpu: int, before: dict[str, frozenset[int]]
) -> dict[str, Any]:
    """The kernel's sources narrowed off ``cpu`` (those that can be) and /status naming the
    rest, with why; the status."""

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
    return status


def assert_quiet(deployed: VMCluster, noisy: Window, quiet: Window, status: dict[str, Any]) -> None:
    """The probe's windows, quietCPUs off and on, reported (and kept, for tox -e
    bench-quiet); on, the claimed CPU had only what /status names as left."""
    results = os.environ.get("NODEDRA_NOISE_RESULTS")
    if results:  # tox -e bench-quiet: the figures kept
        about = {
            "probe_seconds": PROBE_SECONDS,
            "node": "the VM node: QEMU TCG, " + " ".join(MACHINE_ARGS[2:6]),
            "kernel": deployed.vm.run("uname -r").check().strip(),
            "left_named_by_nodedra": status["left"],
        }
        write_results(Path(results), {"quietCPUs off": noisy, "quietCPUs on": quiet}, about)
    print(f"[vm] noise probe, quietCPUs off: {json.dumps(noisy.summary())}")
    print(f"[vm] noise probe, quietCPUs on: {json.dumps(quiet.summary())}")
    # Off, the probe sees the host's tasks there (the load's, the services'): it is not blind.
    assert set(noisy.foreign) - set(noisy.kernel_threads), noisy.summary()
    passes = deployed.metric("nodedra_quiet_cpu_passes_total")
    seconds = deployed.metric("nodedra_quiet_cpu_pass_seconds_total")
    assert passes >= 1
    each = seconds / passes * 1000
    print(f"[vm] quietCPUs: {passes:.0f} passes since the restart, {each:.1f} ms each")
    # On: no device interrupt there but those named as left, no task but kernel threads
    # (named: the CPU's own, and those the kernel runs near the work it follows, as the
    # disk's journal thread after the disk's interrupt); and the load ran (the disk's and the
    # network's interrupts counted on the other CPUs).
    left_irqs = {entry["source"].split()[1] for entry in status["left"]}
    assert {line.split()[0] for line in quiet.device_interrupts} <= left_irqs, quiet.summary()
    assert quiet.foreign == quiet.kernel_threads, quiet.summary()
    others = set(quiet.kernel_threads) - set(quiet.cpu_kernel_threads)
    print(f"[vm] quietCPUs on: kernel threads not bound to CPU {quiet.cpu}: {sorted(others)}")
    for window in (noisy, quiet):
        assert window.load_interrupts, window.summary()


def wait_host_processes(deployed: VMCluster, want: dict[str, frozenset[int]], what: str) -> None:
    """Until systemd's units and the services' processes are on ``want``."""
    poll(
        lambda: True if host_processes(deployed) == want else None,
        120,
        lambda: f"{what}: {host_processes(deployed)}\n{quiet_status(deployed)}",
        2.0,
    )


@contextlib.contextmanager
def running_claim(deployed: VMCluster, name: str) -> Iterator[dict[str, Any]]:
    """The pod ``name`` running with its claim ``name`` of NUMA node 1; both deleted
    afterwards if the test did not, so that a failure leaves test_restarts no claim."""
    cp = deployed.cp
    cp.request("POST", CLAIMS, numa1_claim(name))
    try:
        create_pod(cp, TEST_NAMESPACE, claim_pod(name, name))
        yield wait_pod_running(cp, TEST_NAMESPACE, name, timeout=300)
    finally:
        cp.delete_if_present(f"/api/v1/namespaces/{TEST_NAMESPACE}/pods/{name}")
        cp.delete_if_present(f"{CLAIMS}/{name}")


@pytest.fixture
def quiet_pod(deployed: VMCluster) -> Iterator[dict[str, Any]]:
    """The pod ``quiet`` running with its claim (quietCPUs still off)."""
    with running_claim(deployed, "quiet") as pod:
        yield pod


def test_host_work_keeps_off_a_claimed_cpu_while_it_is_held(
    deployed: VMCluster, quiet_pod: dict[str, Any]
) -> None:
    cp = deployed.cp
    pod = quiet_pod
    before = sources(deployed)
    processes_before = host_processes(deployed)
    online = processes_before["kubelet"]
    assert processes_before == {
        **dict.fromkeys(HOST_UNITS, frozenset()),
        PODS_UNIT: processes_before[PODS_UNIT],  # the kubelet's own setting
        **dict.fromkeys(SERVICES, online),
    }
    (cpu,) = parse_cpu_list(deployed.allowed(pod, "workload")[0])
    # The node as it is today: the claim's CPU kept from other containers only.
    noisy = measure(deployed, container_id(pod), cpu, PROBE_SECONDS)

    turn(deployed, OFF, ON, on=True)

    status = assert_kept_off(deployed, cpu, before)
    # The host's processes: systemd keeps its slices (the kubelet's and containerd's too) off
    # the CPU; the pods' slice is left to the pinning.
    narrowed = {
        **dict.fromkeys(HOST_UNITS, online - {cpu}),
        PODS_UNIT: processes_before[PODS_UNIT],
        **dict.fromkeys(SERVICES, online - {cpu}),
    }
    wait_host_processes(deployed, narrowed, f"off CPU {cpu}")
    status = quiet_status(deployed)
    assert (status["hostProcesses"], status["unavailable"]) == (True, {}), status

    quiet = measure(deployed, container_id(pod), cpu, PROBE_SECONDS)
    assert_quiet(deployed, noisy, quiet, status)

    # Turned off live, the claim still held: everything as before, the record gone.
    turn(deployed, ON, OFF, on=False)
    assert sources(deployed) == before
    # systemd writes a unit's cpuset from its own loop, after it answered.
    wait_host_processes(deployed, processes_before, "given back")

    # On again, then the claim released: everything as before, the originals kept on record.
    turn(deployed, OFF, ON, on=True)
    wait_host_processes(deployed, narrowed, "narrowed again")
    cp.request("DELETE", f"/api/v1/namespaces/{TEST_NAMESPACE}/pods/quiet")
    cp.request("DELETE", f"{CLAIMS}/quiet")
    poll(
        lambda: True if sources(deployed) == before else None,
        180,
        lambda: f"every source back as before:\n{sources(deployed)}\n{before}",
        2.0,
    )
    wait_host_processes(deployed, processes_before, "released")
    assert deployed.vm.run(f"test -e {RECORD}").returncode == 0, "on: the originals kept"


#: ``setup`` asked of the guest's irqbalance from nodedra's container (which mounts the
#: host's /run), with root's credentials as irqbalance-ui sends them; one line for the shell.
IRQBALANCE_SETUP = (
    "import glob, os, socket, struct; "
    'path = max(glob.glob("/host/run/irqbalance/irqbalance*.sock"), key=os.path.getmtime); '
    "s = socket.socket(socket.AF_UNIX); s.connect(path); "
    's.sendmsg([b"setup"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, '
    'struct.pack("iII", os.getpid(), 0, 0))]); '
    "print(s.recv(4096).decode())"
)


def irqbalance_banned(cluster: VMCluster) -> frozenset[int] | None:
    """The CPUs the guest's irqbalance bans now, as it answers; None if it does not."""
    (nodedra,) = cluster.nodedra_pods()
    done = cluster.vm.run(
        f"{CTR} task exec --exec-id irqbalance-$$ {container_id(nodedra, 'nodedra')} "
        f"python -c '{IRQBALANCE_SETUP}'"
    )
    found = re.search(r"BANNED ([0-9a-fA-F,]+)", done.output)
    return parse_mask(found[1]) if done.returncode == 0 and found else None


def test_irqbalance_is_told_to_keep_interrupts_off_a_claimed_cpu(deployed: VMCluster) -> None:
    """irqbalance started on the node (quietCPUs on): claimed, its CPU is banned through
    irqbalance's socket, and no interrupt the kernel lets move is left there; released, it
    bans what it banned before."""
    vm = deployed.vm
    vm.run("systemctl start irqbalance", timeout=120).check()
    try:
        before = poll(
            lambda: irqbalance_banned(deployed),
            60,
            lambda: f"irqbalance answering: {vm.run('systemctl status irqbalance').output}",
            2.0,
        )
        with running_claim(deployed, "balanced") as pod:
            (cpu,) = parse_cpu_list(deployed.allowed(pod, "workload")[0])
            poll(
                lambda: True if irqbalance_banned(deployed) == before | {cpu} else None,
                120,
                lambda: (
                    f"irqbalance banning CPU {cpu}: {irqbalance_banned(deployed)}\n"
                    f"{deployed.nodedra_logs()}"
                ),
                2.0,
            )

            def off_but_named() -> dict[str, Any] | None:
                status = quiet_status(deployed)
                named = {
                    "irq/" + e["source"].split()[1]
                    for e in status["left"]
                    if e["source"].startswith("IRQ ")
                }
                still = {
                    s
                    for s, cpus in sources(deployed).items()
                    if cpu in cpus and s not in ("irq/default", "workqueue")
                }
                return status if still <= named and status["claimed"] == str(cpu) else None

            status = poll(
                off_but_named, 120, lambda: f"interrupts off CPU {cpu}: {sources(deployed)}", 2.0
            )
            assert not [e for e in status["left"] if e["source"].startswith("irqbalance")]
        poll(
            lambda: True if irqbalance_banned(deployed) == before else None,
            120,
            lambda: (
                f"irqbalance banning {before} again: {irqbalance_banned(deployed)}\n"
                f"{deployed.nodedra_logs()}"
            ),
            2.0,
        )
    finally:
        vm.run("systemctl stop irqbalance", timeout=120)
