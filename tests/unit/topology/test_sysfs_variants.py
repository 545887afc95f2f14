"""What read_topology makes of the ways kernels and architectures differ from the fixtures."""

from __future__ import annotations

from nodedra.topology import read_topology

from .sysfs_trees import CopyTree

CPU_DIR = "devices/system/cpu"
NODE_DIR = "devices/system/node"


def test_node_list_falls_back_to_has_cpu_and_has_memory(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    (root / NODE_DIR / "online").unlink()
    topology = read_topology(root)
    assert set(topology.nodes) == {0, 1, 2}
    assert topology.nodes[2].cpus == frozenset()
    assert topology.nodes[2].distances == {0: 30, 1: 30, 2: 10}


def test_node_list_from_has_memory_alone(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    (root / NODE_DIR / "online").unlink()
    (root / NODE_DIR / "has_cpu").unlink()
    assert set(read_topology(root).nodes) == {0, 1, 2}


def test_negative_ids_mean_unknown(sysfs_copy: CopyTree) -> None:
    # arm64 without cluster information reports cluster_id -1; die_id -1 is the kernel's
    # default where an architecture defines no dies.
    root = sysfs_copy("hybrid-pe")
    (root / CPU_DIR / "cpu12/topology/cluster_id").write_text("-1\n")
    (root / CPU_DIR / "cpu12/topology/die_id").write_text("-1\n")
    (root / CPU_DIR / "cpu12/topology/physical_package_id").write_text("-1\n")
    cpu = read_topology(root).cpus[12]
    assert (cpu.package, cpu.die, cpu.cluster) == (0, 0, None)


def test_lists_may_name_offline_cpus(sysfs_copy: CopyTree) -> None:
    # Outside x86 a node's cpulist, and a CPU's siblings, can keep an offlined CPU.
    root = sysfs_copy("offline-cpus")
    (root / NODE_DIR / "node0/cpulist").write_text("0-7\n")
    (root / CPU_DIR / "cpu1/topology/core_cpus_list").write_text("1,5\n")
    topology = read_topology(root)
    assert topology.nodes[0].cpus == {0, 1, 2, 3, 4, 6}
    assert topology.cpus[1].siblings == {1}


def test_core_cpus_list_wins_over_thread_siblings_list(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("offline-cpus")
    (root / CPU_DIR / "cpu0/topology/thread_siblings_list").write_text("garbage\n")
    assert read_topology(root).cpus[0].siblings == {0, 4}


def test_missing_offline_and_isolated_files(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    (root / CPU_DIR / "offline").unlink()
    (root / CPU_DIR / "isolated").unlink()
    topology = read_topology(root)
    assert topology.offline == frozenset()
    assert topology.isolated == frozenset()
    assert not any(cpu.isolated for cpu in topology.cpus.values())


def test_isolated_may_name_offline_cpus(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("offline-cpus")
    (root / CPU_DIR / "isolated").write_text("3,7\n")
    topology = read_topology(root)
    assert topology.isolated == {3, 7}
    assert [cpu.id for cpu in topology.cpus.values() if cpu.isolated] == [3]


def test_hugepages(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    hugepages = root / NODE_DIR / "node0/hugepages"
    (hugepages / "hugepages-64kB").mkdir()
    (hugepages / "hugepages-64kB/nr_hugepages").write_text("3\n")
    (hugepages / "README").write_text("a file a later kernel might add\n")
    (root / NODE_DIR / "node1/hugepages/hugepages-2048kB/nr_hugepages").unlink()
    (root / NODE_DIR / "node1/hugepages/hugepages-2048kB").rmdir()
    for size in ("2048kB", "1048576kB"):
        (root / NODE_DIR / f"node2/hugepages/hugepages-{size}/nr_hugepages").unlink()
        (root / NODE_DIR / f"node2/hugepages/hugepages-{size}").rmdir()
    (root / NODE_DIR / "node2/hugepages").rmdir()
    nodes = read_topology(root).nodes
    assert nodes[0].hugepages == {64 << 10: 3, 2 << 20: 256, 1 << 30: 0}
    assert list(nodes[0].hugepages) == [64 << 10, 2 << 20, 1 << 30]
    assert nodes[1].hugepages == {1 << 30: 0}
    assert nodes[2].hugepages == {}


def test_low_power_e_cores(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("hybrid-pe")
    (root / "devices/cpu_atom/cpus").write_text("12-17\n")
    (root / "devices/cpu_lowpower").mkdir()
    (root / "devices/cpu_lowpower/cpus").write_text("18-19\n")
    cpus = read_topology(root).cpus
    assert {cpus[cpu].core_type for cpu in range(12, 20)} == {"efficiency"}
    assert cpus[0].core_type == "performance"


def test_cpus_no_hybrid_pmu_lists_have_no_core_type(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("hybrid-pe")
    (root / "devices/cpu_atom/cpus").write_text("12-15\n")
    cpus = read_topology(root).cpus
    assert cpus[15].core_type == "efficiency"
    assert cpus[16].core_type is None


def test_root_may_be_a_str_or_a_path(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("single-socket-nosmt")
    from_str = read_topology(str(root))
    assert len(from_str.cpus) == 8
    assert read_topology(root) == from_str
