"""The VM node (tests.peers.vm) is the node it claims to be, read from inside the guest.

Later tests put the kubelet and nodedra on this guest and trust that it is shaped like a
production server: systemd as init, every cgroup controller on the unified hierarchy, two NUMA
nodes, SMT siblings, huge pages on each node, cpusets that confine, and containerd pinning
through systemd. Each of those is checked here, once, on one boot shared by the module's tests.

This boot also isolates CPU 3 (``isolcpus=3``, as a latency-tuned server would), and
nodedra's image, run by the guest's containerd, reads it from the kernel. The VM cluster's
node boots without it: with CPU 3 isolated every one of its tests ran 1.3 to 2.7 times slower
under TCG. What is done with isolated CPUs (kept out of the shared pool, given to the claims
that ask) is tested through the real node and scheduler on a fixture (test_pinning,
test_isolated_cpus).

containerd's unit is not started at boot, so the module starts it. On cgroup v2 with systemd's
cgroup driver runc does not write the cpuset files itself first: it asks systemd for a
transient scope with ``AllowedCPUs`` and ``AllowedMemoryNodes``. What counts is read inside
the guest: the container's ``/proc/<pid>/status`` and its cgroup's ``cpuset.*.effective``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import VMNodeFactory
from tests.peers.image import DEFAULT_NAME
from tests.peers.pods import PAUSE_IMAGE, WORKLOAD_IMAGE
from tests.peers.vm import VMNode

ISOLATED = 3
"""The CPU this boot's kernel isolates."""


@pytest.fixture(scope="module")
def vm_node(vm_node_factory: VMNodeFactory) -> Iterator[VMNode]:
    """The guest, booted with CPU :data:`ISOLATED` isolated, for the module's tests."""
    with vm_node_factory(kernel_args=(f"isolcpus={ISOLATED}",)) as node:
        yield node


def test_systemd_is_pid_1_and_the_system_is_running(vm_node: VMNode) -> None:
    assert vm_node.run("cat /proc/1/comm").check().strip() == "systemd"
    state = vm_node.run("systemctl is-system-running").output.strip()
    failed = vm_node.run("systemctl --failed --no-legend --plain").output
    assert state == "running", f"systemd says {state!r}; failed units:\n{failed}"


def test_the_unified_hierarchy_has_the_pinning_controllers(vm_node: VMNode) -> None:
    assert vm_node.run("stat -f -c %T /sys/fs/cgroup").check().strip() == "cgroup2fs"
    controllers = vm_node.run("cat /sys/fs/cgroup/cgroup.controllers").check().split()
    for wanted in ("cpuset", "cpu", "memory", "hugetlb"):
        assert wanted in controllers, controllers


def test_two_numa_nodes_of_two_smt_siblings_with_huge_pages(vm_node: VMNode) -> None:
    def read(path: str) -> str:
        return vm_node.run(f"cat {path}").check().strip()

    nodes = vm_node.run("ls -d /sys/devices/system/node/node*").check().split()
    assert [n.rsplit("/", 1)[1] for n in nodes] == ["node0", "node1"]
    assert read("/sys/devices/system/node/node0/cpulist") == "0-1"
    assert read("/sys/devices/system/node/node1/cpulist") == "2-3"
    assert read("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") == "0-1"
    assert read("/sys/devices/system/cpu/cpu2/topology/thread_siblings_list") == "2-3"
    pages = "hugepages/hugepages-2048kB/nr_hugepages"
    per_node = [int(read(f"/sys/devices/system/node/node{n}/{pages}")) for n in (0, 1)]
    assert all(count > 0 for count in per_node), per_node
    assert sum(per_node) == 32


def test_a_cgroup_v2_cpuset_confines_a_process_to_numa_node_1(vm_node: VMNode) -> None:
    group = "/sys/fs/cgroup/nodedra-smoke"
    script = f"""set -e
echo +cpuset > /sys/fs/cgroup/cgroup.subtree_control
mkdir {group}
echo 2-3 > {group}/cpuset.cpus
echo 1 > {group}/cpuset.mems
sh -c 'echo $$ > {group}/cgroup.procs; grep -E "^(Cpus|Mems)_allowed_list" /proc/self/status'
"""
    try:
        status = vm_node.run(script).check()
    finally:
        vm_node.run(f"rmdir {group}")
    fields = dict(line.split(":\t") for line in status.strip().splitlines())
    assert fields == {"Cpus_allowed_list": "2-3", "Mems_allowed_list": "1"}, status


# -- containerd ----------------------------------------------------------------------------------

CTR = "ctr -n k8s.io"


@pytest.fixture(scope="module")
def containerd(vm_node: VMNode) -> VMNode:
    """The guest with containerd started and serving (the node's images are in its store
    from the image's build)."""
    started = time.monotonic()
    vm_node.run("systemctl start containerd", timeout=180).check()
    vm_node.run(f"{CTR} version", timeout=60).check()
    print(f"[vm] containerd serving {time.monotonic() - started:.1f}s after `systemctl start`")
    return vm_node


def test_containerd_runs_runc_with_systemd_cgroups_nri_and_cdi(containerd: VMNode) -> None:
    assert containerd.run("systemctl is-active containerd").output.strip() == "active"
    config = containerd.run("containerd config dump", timeout=120).check()
    assert "SystemdCgroup = true" in config, config
    assert "cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']" in config, config
    assert containerd.run("test -S /var/run/nri/nri.sock").returncode == 0, "no NRI socket"
    assert containerd.run("test -d /var/run/cdi").returncode == 0, "no /var/run/cdi"
    images = containerd.run(f"{CTR} images list --quiet").check().split()
    for image in (PAUSE_IMAGE, WORKLOAD_IMAGE, DEFAULT_NAME):
        assert image in images, images


def test_a_container_pinned_to_numa_node_1_through_systemd(containerd: VMNode) -> None:
    name = "nodedra-pinned"
    started = time.monotonic()
    containerd.run(
        f"{CTR} run -d --null-io --runc-systemd-cgroup --cgroup system.slice:nodedra:{name} "
        f"--cpuset-cpus 2-3 --cpuset-mems 1 {WORKLOAD_IMAGE} {name}",
        timeout=180,
    ).check()
    try:
        ran = time.monotonic() - started
        tasks = containerd.run(f"{CTR} tasks list").check()
        (pid,) = [line.split()[1] for line in tasks.splitlines() if line.startswith(name)]
        status = containerd.run(f"grep -E '^(Cpus|Mems)_allowed_list' /proc/{pid}/status").check()
        fields = dict(line.split(":\t") for line in status.strip().splitlines())
        assert fields == {"Cpus_allowed_list": "2-3", "Mems_allowed_list": "1"}, status
        cgroup = containerd.run(f"cat /proc/{pid}/cgroup").check().strip()
        # systemd's driver: a transient scope of the slice named in the cgroup path.
        assert cgroup == f"0::/system.slice/nodedra-{name}.scope", cgroup
        group = f"/sys/fs/cgroup{cgroup[3:]}"
        effective = containerd.run(
            f"cat {group}/cpuset.cpus.effective {group}/cpuset.mems.effective"
        ).check()
        assert effective.split() == ["2-3", "1"], effective
        unit = containerd.run(
            f"systemctl show -p AllowedCPUs -p AllowedMemoryNodes nodedra-{name}.scope"
        ).check()
        assert sorted(unit.split()) == ["AllowedCPUs=2-3", "AllowedMemoryNodes=1"], unit
        print(f"[vm] `ctr run -d` of the pinned container took {ran:.1f}s")
    finally:
        containerd.run(f"{CTR} tasks kill -s KILL {name}", timeout=60)
        containerd.run(
            f"for i in $(seq 50); do {CTR} tasks delete {name} && break; sleep 0.2; done; "
            f"{CTR} containers delete {name}",
            timeout=120,
        )


# -- an isolated CPU -----------------------------------------------------------------------------

CONFIG = "/etc/nodedra-isolated.yaml"


def topology(node: VMNode) -> dict[str, Any]:
    """``nodedra topology --json --config CONFIG`` in nodedra's image, run by the guest's
    containerd (its ``/sys`` is the guest kernel's, read-only)."""
    output = node.run(
        f"{CTR} run --rm --mount type=bind,src={CONFIG},dst={CONFIG},options=rbind:ro "
        f"{DEFAULT_NAME} topology nodedra topology --json --config {CONFIG}",
        timeout=180,
    ).check()
    data: dict[str, Any] = json.loads(output)
    return data


def test_nodedra_reads_the_cpu_the_kernel_isolates(containerd: VMNode) -> None:
    """The static devices (options are topology-aware's) and the topology-aware ones with
    ``isolatedCPUs: reserved``, from one run."""
    isolated = containerd.run("cat /sys/devices/system/cpu/isolated").check().strip()
    assert isolated == str(ISOLATED)
    containerd.run(f"printf 'options:\\n  isolatedCPUs: reserved\\n' > {CONFIG}").check()

    found = topology(containerd)
    assert [c["id"] for c in found["cpus"] if c["isolated"]] == [ISOLATED], found["cpus"]
    static = {d["name"]: d["attributes"]["isolated"] for d in found["devices"]["static"]}
    assert static == {f"cpu00{i}": {"bool": i == ISOLATED} for i in range(4)}, static
    devices = {
        d["name"]: (d["capacity"].get("cpu", {}).get("value"), d["attributes"]["isolated"])
        for d in found["devices"]["topology-aware"]
    }
    assert devices == {
        "cpudevnuma000": ("2", {"bool": False}),
        "cpudevnuma001": ("1", {"bool": False}),
        "cpudevnuma001isolated": ("1", {"bool": True}),
    }, devices
