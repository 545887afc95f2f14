"""The CPU map shows which cores share an L3 cache, where a NUMA node holds several, and
the isolated CPUs kept for claims."""

from __future__ import annotations

from nodedra import cpumap, status
from nodedra.policy import Grant
from nodedra.resmgr.pinning import Books, Holdings, Reservation
from tests.unit.policy.conftest import topology


def test_a_node_of_several_l3_caches_is_drawn_cache_by_cache() -> None:
    topo = topology("epyc-2s-nps4")
    grant = Grant("cpus", "cpudevnuma000", frozenset({4, 5, 68, 69}), 0, frozenset({0}))
    books = Books(
        grants={"uid-a": (grant,)},
        reservations={"uid-a": Reservation("shop", "cpus", frozenset())},
        online=frozenset(topo.cpus),
        allocated=grant.cpus,
    )
    cpu_map = status.build(
        Holdings(books, frozenset({0, 64}), None, {}, True),
        topo,
        node="n1",
        driver="topology-aware.nri.io",
        pinning="required",
    )
    node0 = cpu_map["numa_nodes"][0]
    assert [core["l3_cache"] for core in node0["cores"]] == [0] * 4 + [1] * 4
    lines = cpumap.render_text(cpu_map, width=60).splitlines()
    start = lines.index("NUMA node 0: CPUs 0-7,64-71, memory 64 GiB")
    assert lines[start + 1 : start + 7] == [
        "  L3 cache 0:",
        "  [  0:R  64:R] [  1:.  65:.] [  2:.  66:.] [  3:.  67:.]",
        "  L3 cache 1:",
        "  [  4:A  68:A] [  5:A  69:A] [  6:.  70:.] [  7:.  71:.]",
        "",
        "NUMA node 1: CPUs 8-15,72-79, memory 64 GiB",
    ]
    assert lines[start + 7] == "  L3 cache 2:"


def test_cores_without_a_known_cache_are_drawn_as_before_and_isolated_cpus_apart() -> None:
    topo = topology("two-socket-smt2-numa4")
    books = Books(
        grants={},
        reservations={},
        online=frozenset(topo.cpus),
        allocated=frozenset(),
        isolated=topo.isolated,
    )
    holdings = Holdings(books, frozenset(), None, {}, True)
    cpu_map = status.build(holdings, topo, node="n1", driver="static.nri.io", pinning="required")
    assert {core["l3_cache"] for n in cpu_map["numa_nodes"] for core in n["cores"]} == {None}
    text = cpumap.render_text(cpu_map)
    assert "L3 cache" not in text
    assert "  [ 0:. 28:.] [ 1:. 29:.]" in text
    assert topo.isolated == {26, 27, 54, 55}
    assert "[26:- 54:-] [27:- 55:-]" in text
    assert "- isolated, for claims" in text
    assert cpu_map["shared"] == "0-25,28-53"
