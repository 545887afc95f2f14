"""The VM node (tests.peers.vm) is the node it claims to be, read from inside the guest.

Later tests put containerd, the kubelet and nodedra on this guest and trust that it is shaped
like a production server: systemd as init, every cgroup controller on the unified hierarchy,
two NUMA nodes, SMT siblings, huge pages on each node, and cpusets that confine. Each of those
is checked here, once, on one boot shared by the module's tests.
"""

from __future__ import annotations

from tests.peers.vm import VMNode


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
