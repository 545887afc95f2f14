"""The topology model: immutable values that refuse shapes the kernel would never report."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping

import pytest

from nodedra.topology import (
    CPU,
    NUMANode,
    Topology,
    format_cpu_list,
    parse_cpu_list,
    read_topology,
)

from .sysfs_trees import FIXTURES, SHAPES


def cpu(
    cpu_id: int,
    *,
    node: int = 0,
    core: int | None = None,
    siblings: set[int] | None = None,
    isolated: bool = False,
) -> CPU:
    return CPU(
        id=cpu_id,
        package=0,
        die=0,
        cluster=None,
        core=cpu_id if core is None else core,
        node=node,
        siblings=frozenset({cpu_id} if siblings is None else siblings),
        core_type=None,
        isolated=isolated,
    )


def node(node_id: int, cpus: set[int], distances: Mapping[int, int] | None = None) -> NUMANode:
    return NUMANode(
        id=node_id,
        cpus=frozenset(cpus),
        memory=1 << 30,
        distances={node_id: 10} if distances is None else distances,
        hugepages={2 << 20: 0},
    )


def two_cpus() -> Topology:
    return Topology(
        cpus={1: cpu(1, core=0, siblings={0, 1}), 0: cpu(0, core=0, siblings={0, 1})},
        nodes={0: node(0, {0, 1})},
        offline=frozenset({2}),
        isolated=frozenset(),
    )


def test_values_are_frozen() -> None:
    topology = two_cpus()
    with pytest.raises(dataclasses.FrozenInstanceError):
        topology.offline = frozenset()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        topology.cpus[0].core = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        topology.cpus[5] = cpu(5)  # type: ignore[index]
    with pytest.raises(TypeError):
        topology.nodes[0].distances[1] = 20  # type: ignore[index]
    with pytest.raises(TypeError):
        topology.nodes[0].hugepages[1 << 30] = 1  # type: ignore[index]


def test_values_do_not_share_the_callers_collections() -> None:
    distances = {0: 10}
    cpus = {0: cpu(0)}
    siblings = {0}
    first = NUMANode(id=0, cpus={0}, memory=0, distances=distances, hugepages={})  # type: ignore[arg-type]
    topology = Topology(cpus=cpus, nodes={0: first}, offline=frozenset(), isolated=frozenset())
    solo = CPU(0, 0, 0, None, 0, 0, siblings, None, False)  # type: ignore[arg-type]
    distances[1] = 20
    cpus[1] = cpu(1)
    siblings.add(1)
    assert first.distances == {0: 10}
    assert set(topology.cpus) == {0}
    assert solo.siblings == {0}
    assert isinstance(first.cpus, frozenset)
    assert isinstance(solo.siblings, frozenset)


def test_equal_values_hash_alike() -> None:
    assert two_cpus() == two_cpus()
    assert hash(two_cpus()) == hash(two_cpus())
    assert len({two_cpus(), two_cpus()}) == 1
    assert hash(node(0, {1}, {0: 10, 1: 20})) == hash(node(0, {1}, {1: 20, 0: 10}))
    assert node(0, {1}) != node(0, {2})


def test_mappings_are_in_id_order() -> None:
    topology = two_cpus()
    assert list(topology.cpus) == [0, 1]
    assert topology.cpu_ids == (0, 1)
    assert list(node(0, set(), {2: 30, 0: 10, 1: 20}).distances) == [0, 1, 2]


def test_core_key_tells_packages_apart() -> None:
    a = dataclasses.replace(cpu(0, core=3), package=0)
    b = dataclasses.replace(cpu(1, core=3), package=1)
    assert a.core == b.core
    assert a.core_key != b.core_key
    assert a.core_key == (0, 0, 3)
    assert b.core_key == (1, 0, 3)


def test_helpers() -> None:
    topology = two_cpus()
    assert topology.cores() == {(0, 0, 0): (0, 1)}
    assert topology.packages() == {0: (0, 1)}
    assert topology.smt_enabled
    assert topology.threads_per_core == 2
    assert topology.node_of(1) == topology.nodes[0]
    with pytest.raises(KeyError, match="cpu 2 is not an online CPU"):
        topology.node_of(2)
    empty = Topology(cpus={}, nodes={}, offline=frozenset(), isolated=frozenset())
    assert empty.threads_per_core == 0
    assert not empty.smt_enabled
    assert empty.cores() == {}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: cpu(0, siblings={1}), "cpu 0 is not among its siblings"),
        (
            lambda: dataclasses.replace(cpu(0), core_type="turbo"),  # type: ignore[arg-type]
            "unknown core type 'turbo'",
        ),
        (lambda: dataclasses.replace(node(0, set()), memory=-1), "negative memory"),
        (lambda: NUMANode(0, frozenset(), 0, {0: 10}, {0: 1}), "bad huge pages"),
        (lambda: NUMANode(0, frozenset(), 0, {0: 10}, {4096: -1}), "bad huge pages"),
        (
            lambda: Topology({1: cpu(0)}, {0: node(0, {0})}, frozenset(), frozenset()),
            "cpu 0 is filed under id 1",
        ),
        (
            lambda: Topology({0: cpu(0, node=1)}, {0: node(0, {0})}, frozenset(), frozenset()),
            "cpu 0 claims node 1",
        ),
        (
            lambda: Topology({0: cpu(0)}, {0: node(0, set())}, frozenset(), frozenset()),
            "cpu 0 claims node 0, which does not list it",
        ),
        (
            lambda: Topology({0: cpu(0)}, {0: node(0, {0, 1})}, frozenset(), frozenset()),
            r"node 0 lists cpus \[1\]",
        ),
        (
            lambda: Topology({0: cpu(0)}, {1: node(0, {0})}, frozenset(), frozenset()),
            "node 0 is filed under id 1",
        ),
        (
            lambda: Topology(
                {0: cpu(0, siblings={0, 1})}, {0: node(0, {0})}, frozenset(), frozenset()
            ),
            "siblings that are not online",
        ),
        (
            lambda: Topology({0: cpu(0)}, {0: node(0, {0})}, frozenset({0}), frozenset()),
            r"cpus \[0\] are both online and offline",
        ),
        (
            lambda: Topology({0: cpu(0)}, {0: node(0, {0})}, frozenset(), frozenset({0})),
            "disagrees with the isolated list",
        ),
        (
            lambda: Topology(
                {0: cpu(0, isolated=True)}, {0: node(0, {0})}, frozenset(), frozenset()
            ),
            "disagrees with the isolated list",
        ),
    ],
)
def test_impossible_values_are_refused(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("shape", SHAPES)
def test_to_json_is_plain_json_and_agrees_with_the_topology(shape: str) -> None:
    topology = read_topology(FIXTURES / shape)
    document = topology.to_json()
    assert json.loads(json.dumps(document)) == document
    assert set(document) == {"cpus", "numa_nodes"}
    cpus, nodes = document["cpus"], document["numa_nodes"]
    assert isinstance(cpus, list)
    assert isinstance(nodes, list)
    assert [entry["id"] for entry in cpus] == list(topology.cpu_ids)  # type: ignore[index,call-overload]
    assert [entry["id"] for entry in nodes] == sorted(topology.nodes)  # type: ignore[index,call-overload]
    for entry in cpus:
        assert isinstance(entry, dict)
        model = topology.cpus[entry["id"]]  # type: ignore[index]
        assert entry == {
            "id": model.id,
            "package": model.package,
            "die": model.die,
            "cluster": model.cluster,
            "core": model.core,
            "node": model.node,
            "siblings": sorted(model.siblings),
            "siblings_cpulist": format_cpu_list(model.siblings),
            "core_type": model.core_type,
            "isolated": model.isolated,
            "l3_cache": model.l3_cache,
        }
    for entry in nodes:
        assert isinstance(entry, dict)
        model_node = topology.nodes[entry["id"]]  # type: ignore[index]
        assert entry["cpus"] == sorted(model_node.cpus)
        assert isinstance(entry["cpulist"], str)
        assert parse_cpu_list(entry["cpulist"]) == model_node.cpus
        assert entry["memory"] == model_node.memory
        assert entry["distances"] == {str(k): v for k, v in model_node.distances.items()}
        assert entry["hugepages"] == {str(k): v for k, v in model_node.hugepages.items()}


def test_to_json_of_the_two_socket_machine() -> None:
    document = read_topology(FIXTURES / "two-socket-smt2-numa4").to_json()
    nodes = document["numa_nodes"]
    assert isinstance(nodes, list)
    assert nodes[3] == {
        "id": 3,
        "cpus": [*range(21, 28), *range(49, 56)],
        "cpulist": "21-27,49-55",
        "memory": 128 << 30,
        "distances": {"0": 21, "1": 21, "2": 11, "3": 10},
        "hugepages": {"2097152": 0, "1073741824": 0},
    }
    cpus = document["cpus"]
    assert isinstance(cpus, list)
    assert cpus[54] == {
        "id": 54,
        "package": 1,
        "die": 0,
        "cluster": None,
        "core": 12,
        "node": 3,
        "siblings": [26, 54],
        "siblings_cpulist": "26,54",
        "core_type": None,
        "isolated": True,
        "l3_cache": None,
    }
    text = json.dumps(document, sort_keys=True)
    assert "frozenset" not in text
