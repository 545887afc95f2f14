"""read_topology on broken sysfs trees: errors name the file and say what is wrong with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodedra.topology import TopologyError, read_topology

from .sysfs_trees import CopyTree

CPU_DIR = "devices/system/cpu"
NODE_DIR = "devices/system/node"


def expect_error(root: Path, relative: str, problem: str) -> TopologyError:
    """read_topology(root) fails on ``root/relative`` with ``problem`` in the message."""
    path = root / relative
    with pytest.raises(TopologyError) as caught:
        read_topology(root)
    error = caught.value
    assert str(error).startswith(f"cannot read {path}: ")
    assert re.search(problem, error.problem), error.problem
    assert error.path == str(path)
    assert isinstance(error, ValueError)
    return error


def test_missing_online_file(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("single-socket-nosmt")
    (root / CPU_DIR / "online").unlink()
    error = expect_error(root, f"{CPU_DIR}/online", "No such file or directory")
    assert str(error) == f"cannot read {root}/{CPU_DIR}/online: No such file or directory"


def test_missing_sysfs_root(tmp_path: Path) -> None:
    expect_error(tmp_path / "nowhere", f"{CPU_DIR}/online", "No such file")


def test_empty_online_file(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("single-socket-nosmt")
    (root / CPU_DIR / "online").write_text("\n")
    expect_error(root, f"{CPU_DIR}/online", "lists no CPUs")


def test_garbled_online_file(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("single-socket-nosmt")
    (root / CPU_DIR / "online").write_text("0-x\n")
    expect_error(root, f"{CPU_DIR}/online", r"^bad cpu list '0-x\\n': '0-x' is not a CPU")


def test_garbled_core_id(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("single-socket-nosmt")
    (root / CPU_DIR / "cpu5/topology/core_id").write_text("five\n")
    error = expect_error(root, f"{CPU_DIR}/cpu5/topology/core_id", "is not an integer")
    assert error.problem == "'five' is not an integer"


@pytest.mark.parametrize("text", ["", "\n", "1_0\n", "+3\n", "3 4\n", "0x3\n", "\u0663\n"])
def test_core_id_must_be_one_plain_integer(sysfs_copy: CopyTree, text: str) -> None:
    root = sysfs_copy("single-socket-nosmt")
    (root / CPU_DIR / "cpu2/topology/core_id").write_text(text, encoding="utf-8")
    expect_error(root, f"{CPU_DIR}/cpu2/topology/core_id", "not")


def test_missing_core_id(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("single-socket-nosmt")
    (root / CPU_DIR / "cpu3/topology/core_id").unlink()
    expect_error(root, f"{CPU_DIR}/cpu3/topology/core_id", "No such file")


def test_online_cpu_without_topology(sysfs_copy: CopyTree) -> None:
    # offline-cpus: cpu5 has no topology/ directory; claiming it is online must fail on it.
    root = sysfs_copy("offline-cpus")
    (root / CPU_DIR / "online").write_text("0-6\n")
    (root / CPU_DIR / "offline").write_text("7\n")
    (root / NODE_DIR / "node0/cpulist").write_text("0-6\n")
    expect_error(root, f"{CPU_DIR}/cpu5/topology/physical_package_id", "No such file")


def test_no_sibling_list_at_all(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("vm-nonuma-legacy")
    (root / CPU_DIR / "cpu1/topology/thread_siblings_list").unlink()
    expect_error(root, f"{CPU_DIR}/cpu1/topology/thread_siblings_list", "No such file")


def test_cpu_both_online_and_offline(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("offline-cpus")
    (root / CPU_DIR / "offline").write_text("4-5,7\n")
    expect_error(root, f"{CPU_DIR}/offline", "cpus 4 are also listed as online")


def test_online_cpu_in_no_node(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    (root / NODE_DIR / "node1/cpulist").write_text("4-7,12-13\n")
    expect_error(root, NODE_DIR, "online cpus 14-15 are in no node's cpulist")


def test_cpu_in_two_nodes(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    (root / NODE_DIR / "node1/cpulist").write_text("3-7,12-15\n")
    expect_error(root, f"{NODE_DIR}/node1/cpulist", "cpu 3 is also in node 0's cpulist")


def test_missing_node_cpulist(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    (root / NODE_DIR / "node2/cpulist").unlink()
    expect_error(root, f"{NODE_DIR}/node2/cpulist", "No such file")


def test_meminfo_without_memtotal(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    (root / NODE_DIR / "node1/meminfo").write_text("Node 1 MemFree:   1024 kB\n")
    expect_error(root, f"{NODE_DIR}/node1/meminfo", "no 'Node 1 MemTotal: <n> kB' line")


def test_meminfo_of_another_node(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    (root / NODE_DIR / "node1/meminfo").write_text("Node 0 MemTotal:   1024 kB\n")
    expect_error(root, f"{NODE_DIR}/node1/meminfo", "MemTotal line is for node 0")


def test_distance_count_must_match_the_nodes(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    (root / NODE_DIR / "node0/distance").write_text("10 12\n")
    expect_error(root, f"{NODE_DIR}/node0/distance", "2 distances for 3 online nodes")


def test_garbled_distance(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    (root / NODE_DIR / "node2/distance").write_text("30 far 10\n")
    expect_error(root, f"{NODE_DIR}/node2/distance", "'far' is not an integer")


def test_garbled_nr_hugepages(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    path = f"{NODE_DIR}/node2/hugepages/hugepages-1048576kB/nr_hugepages"
    (root / path).write_text("lots\n")
    expect_error(root, path, "'lots' is not an integer")


def test_no_node_list_at_all(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("snc-memory-only")
    for name in ("online", "has_cpu", "has_memory"):
        (root / NODE_DIR / name).unlink()
    expect_error(root, f"{NODE_DIR}/online", "nor has_cpu or has_memory")


def test_cpu_in_two_hybrid_pmus(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("hybrid-pe")
    (root / "devices/cpu_atom/cpus").write_text("11-19\n")
    expect_error(root, "devices/cpu_atom/cpus", "cpu 11 is also listed by another hybrid PMU")


def test_non_ascii_file(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("single-socket-nosmt")
    (root / CPU_DIR / "isolated").write_bytes(b"\xff\n")
    expect_error(root, f"{CPU_DIR}/isolated", "not ASCII text")


def test_unreadable_directory_in_place_of_a_file(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("single-socket-nosmt")
    (root / CPU_DIR / "offline").unlink()
    (root / CPU_DIR / "offline").mkdir()
    expect_error(root, f"{CPU_DIR}/offline", "Is a directory")
