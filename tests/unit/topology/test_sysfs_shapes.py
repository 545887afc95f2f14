"""read_topology on each generated sysfs tree gives exactly the machine the shape describes."""

from __future__ import annotations

import pytest

from nodedra.topology import CPU, NUMANode, Topology, TopologyError, read_topology

from .sysfs_trees import FIXTURES, SHAPES, CopyTree

GIB = 1 << 30
HUGE_2M = 2 << 20
HUGE_1G = 1 << 30


def read(shape: str) -> Topology:
    return read_topology(FIXTURES / shape)


def test_single_socket_nosmt() -> None:
    topology = read("single-socket-nosmt")
    assert topology.cpu_ids == tuple(range(8))
    assert topology.packages() == {0: tuple(range(8))}
    assert topology.cores() == {(0, 0, core): (core,) for core in range(8)}
    assert not topology.smt_enabled
    assert topology.threads_per_core == 1
    assert topology.offline == frozenset()
    assert topology.isolated == frozenset()
    assert topology.nodes == {
        0: NUMANode(
            id=0,
            cpus=frozenset(range(8)),
            memory=16 * GIB,
            distances={0: 10},
            hugepages={HUGE_2M: 0, HUGE_1G: 0},
        )
    }
    assert topology.cpus[5] == CPU(
        id=5,
        package=0,
        die=0,
        cluster=None,
        core=5,
        node=0,
        siblings=frozenset({5}),
        core_type=None,
        isolated=False,
    )


def test_two_socket_smt2_numa4() -> None:
    topology = read("two-socket-smt2-numa4")
    assert topology.cpu_ids == tuple(range(56))
    assert topology.packages() == {
        0: (*range(14), *range(28, 42)),
        1: (*range(14, 28), *range(42, 56)),
    }
    cores = topology.cores()
    assert len(cores) == 28
    # Core ids restart in each package: core 0 exists twice, told apart by the package.
    assert cores[(0, 0, 0)] == (0, 28)
    assert cores[(1, 0, 0)] == (14, 42)
    assert cores[(1, 0, 13)] == (27, 55)
    assert all(len(threads) == 2 for threads in cores.values())
    assert topology.smt_enabled
    assert topology.threads_per_core == 2
    for cpu in topology.cpus.values():
        sibling = cpu.id + 28 if cpu.id < 28 else cpu.id - 28
        assert cpu.siblings == {cpu.id, sibling}
        assert cpu.package == (cpu.id % 28) // 14
        assert cpu.node == (cpu.id % 28) // 7
        assert cpu.die == 0
        assert cpu.cluster is None
        assert cpu.core_type is None
    expected_cpus = {
        0: {*range(0, 7), *range(28, 35)},
        1: {*range(7, 14), *range(35, 42)},
        2: {*range(14, 21), *range(42, 49)},
        3: {*range(21, 28), *range(49, 56)},
    }
    assert {n: set(node.cpus) for n, node in topology.nodes.items()} == expected_cpus
    assert {n: node.memory for n, node in topology.nodes.items()} == {
        0: 96 * GIB,
        1: 96 * GIB,
        2: 128 * GIB,
        3: 128 * GIB,
    }
    assert topology.nodes[0].distances == {0: 10, 1: 11, 2: 21, 3: 21}
    assert topology.nodes[3].distances == {0: 21, 1: 21, 2: 11, 3: 10}
    for a in range(4):
        for b in range(4):
            assert topology.nodes[a].distances[b] == topology.nodes[b].distances[a]
    assert {n: dict(node.hugepages) for n, node in topology.nodes.items()} == {
        0: {HUGE_2M: 1024, HUGE_1G: 4},
        1: {HUGE_2M: 512, HUGE_1G: 0},
        2: {HUGE_2M: 0, HUGE_1G: 8},
        3: {HUGE_2M: 0, HUGE_1G: 0},
    }
    assert topology.isolated == {26, 27, 54, 55}
    assert {cpu.id for cpu in topology.cpus.values() if cpu.isolated} == {26, 27, 54, 55}
    assert topology.node_of(55).id == 3
    assert topology.node_of(28) is topology.nodes[0]


def test_snc_with_a_memory_only_node() -> None:
    topology = read("snc-memory-only")
    assert len(topology.cpus) == 16
    assert topology.packages() == {0: tuple(range(16))}
    assert set(topology.nodes) == {0, 1, 2}
    assert topology.nodes[0].cpus == {0, 1, 2, 3, 8, 9, 10, 11}
    assert topology.nodes[1].cpus == {4, 5, 6, 7, 12, 13, 14, 15}
    memory_only = topology.nodes[2]
    assert memory_only.cpus == frozenset()
    assert memory_only.memory == 256 * GIB
    assert memory_only.distances == {0: 30, 1: 30, 2: 10}
    assert topology.nodes[0].distances == {0: 10, 1: 12, 2: 30}
    # The memory-only node is farther from every CPU than the other SNC node is.
    assert all(
        node.distances[2] > max(node.distances[n] for n in (0, 1))
        for node in (topology.nodes[0], topology.nodes[1])
    )
    assert {cpu.node for cpu in topology.cpus.values()} == {0, 1}
    assert topology.cpus[3].siblings == {3, 11}
    assert topology.cpus[3].core_key == (0, 0, 3)
    assert topology.cpus[12].core_key == (0, 0, 4)
    assert topology.threads_per_core == 2


def test_hybrid_p_and_e_cores() -> None:
    topology = read("hybrid-pe")
    assert topology.cpu_ids == tuple(range(20))
    p_cores = [topology.cpus[cpu] for cpu in range(12)]
    e_cores = [topology.cpus[cpu] for cpu in range(12, 20)]
    assert {cpu.core_type for cpu in p_cores} == {"performance"}
    assert {cpu.core_type for cpu in e_cores} == {"efficiency"}
    for cpu in p_cores:
        assert cpu.siblings == {cpu.id & ~1, cpu.id | 1}
    for cpu in e_cores:
        assert cpu.siblings == {cpu.id}
    assert [cpu.cluster for cpu in e_cores] == [24] * 4 + [28] * 4
    assert len({cpu.cluster for cpu in p_cores}) == 6
    cores = topology.cores()
    assert len(cores) == 14
    assert sorted(len(threads) for threads in cores.values()) == [1] * 8 + [2] * 6
    assert topology.threads_per_core == 2
    assert topology.smt_enabled
    assert topology.packages() == {0: tuple(range(20))}
    assert topology.nodes[0].cpus == frozenset(range(20))
    assert topology.nodes[0].memory == 32 * GIB


def test_offline_cpus() -> None:
    topology = read("offline-cpus")
    assert topology.cpu_ids == (0, 1, 2, 3, 4, 6)
    assert topology.offline == {5, 7}
    assert topology.nodes[0].cpus == {0, 1, 2, 3, 4, 6}
    # A core whose second thread is offline runs one thread; the others still two.
    assert topology.cpus[1].siblings == {1}
    assert topology.cpus[3].siblings == {3}
    assert topology.cpus[0].siblings == {0, 4}
    assert topology.cpus[6].siblings == {2, 6}
    assert topology.cores() == {
        (0, 0, 0): (0, 4),
        (0, 0, 1): (1,),
        (0, 0, 2): (2, 6),
        (0, 0, 3): (3,),
    }
    assert topology.threads_per_core == 2
    with pytest.raises(KeyError, match="cpu 5 is not an online CPU"):
        topology.node_of(5)


def test_vm_without_numa_on_an_old_kernel() -> None:
    topology = read("vm-nonuma-legacy")
    assert topology.cpu_ids == (0, 1, 2, 3)
    # physical_package_id -1 reads as package 0; no die_id is die 0; no cluster_id is None.
    assert {(cpu.package, cpu.die, cpu.cluster) for cpu in topology.cpus.values()} == {(0, 0, None)}
    # thread_siblings_list stands in for the missing core_cpus_list.
    assert all(cpu.siblings == {cpu.id} for cpu in topology.cpus.values())
    assert topology.offline == frozenset()
    assert topology.isolated == frozenset()
    # Without NUMA there is one node 0 with every CPU, memory unknown (0), global huge pages.
    assert topology.nodes == {
        0: NUMANode(
            id=0,
            cpus=frozenset({0, 1, 2, 3}),
            memory=0,
            distances={0: 10},
            hugepages={HUGE_2M: 128},
        )
    }


@pytest.mark.parametrize(("shape", "per_node"), [("epyc-2s-nps1", 8), ("epyc-2s-nps4", 2)])
def test_epyc_l3_caches(shape: str, per_node: int) -> None:
    """8 L3 caches of 4 cores (8 CPUs) a socket, whole in NUMA nodes of 8 or 2 caches."""
    topology = read(shape)
    caches = topology.l3_caches()
    assert list(caches) == list(range(16))
    assert caches[5] == (*range(20, 24), *range(84, 88))
    for cache, cpus in caches.items():
        assert {topology.cpus[c].package for c in cpus} == {cache // 8}
        assert len({topology.cpus[c].node for c in cpus}) == 1
    for node in topology.nodes.values():
        assert len({topology.cpus[c].l3_cache for c in node.cpus}) == per_node
    assert topology.cpus[84].l3_cache == 5


def test_shapes_without_caches_have_no_l3() -> None:
    for shape in ("two-socket-smt2-numa4", "vm-nonuma-legacy"):
        topology = read(shape)
        assert topology.l3_caches() == {}
        assert all(cpu.l3_cache is None for cpu in topology.cpus.values())


def test_an_l3_cache_without_an_id_is_named_by_its_first_cpu(sysfs_copy: CopyTree) -> None:
    """Kernels before 4.16 have no ``id`` file; the L3 is found by its level, any index."""
    root = sysfs_copy("epyc-2s-nps4")
    for cache in (root / "devices/system/cpu").glob("cpu*/cache/index2"):
        (cache / "id").unlink()
        cache.rename(cache.with_name("index7"))
    topology = read_topology(root)
    assert topology.cpus[84].l3_cache == 20
    assert topology.l3_caches()[20] == (*range(20, 24), *range(84, 88))
    assert len(topology.l3_caches()) == 16


def test_an_l3_cache_that_says_nothing_is_refused(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("epyc-2s-nps1")
    cache = root / "devices/system/cpu/cpu3/cache/index2"
    (cache / "id").unlink()
    (cache / "shared_cpu_list").unlink()
    with pytest.raises(TopologyError, match=r"cpu3/cache/index2.*neither an id nor"):
        read_topology(root)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_is_consistent(shape: str) -> None:
    topology = read(shape)
    assert topology.cpus, "a machine has at least one online CPU"
    for cpu_id, cpu in topology.cpus.items():
        assert topology.node_of(cpu_id).id == cpu.node
        assert cpu.siblings == set(topology.cores()[cpu.core_key])
    assert sorted(cpu for node in topology.nodes.values() for cpu in node.cpus) == list(
        topology.cpu_ids
    )
    for node in topology.nodes.values():
        assert node.distances[node.id] == 10
        assert set(node.distances) == set(topology.nodes)


def test_every_shape_is_tested() -> None:
    trees = {
        path.name
        for path in FIXTURES.iterdir()
        if path.is_dir() and not path.name.startswith(("_", "."))  # not __pycache__
    }
    assert trees == set(SHAPES)


def test_reads_afresh_each_time(sysfs_copy: CopyTree) -> None:
    root = sysfs_copy("offline-cpus")
    before = read_topology(root)
    (root / "devices/system/cpu/isolated").write_text("2\n")
    after = read_topology(root)
    assert before.isolated == frozenset()
    assert after.isolated == {2}
    assert after.cpus[2].isolated
    assert not before.cpus[2].isolated
