"""The topology-aware policy's ``isolatedCPUs``: offered, preferred, reserved.

The fixture machine isolates cores 26 and 27 (CPUs 26, 27, 54, 55), all on NUMA node 3
(CPUs 21-27 and 49-55).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from nodedra.policy import PolicyError, TopologyAwarePolicy, parse_config
from nodedra.policy.allocatable import FIELD
from nodedra.topology import read_topology
from tests.unit.policy.conftest import FIXTURES, Host, ask, claim, topology

SHAPE = "two-socket-smt2-numa4"
ISOLATED = frozenset({26, 27, 54, 55})
NODE_3 = frozenset({*range(21, 28), *range(49, 56)})


def policy(host: Host | None = None, **options: Any) -> TopologyAwarePolicy:
    config = {"policy": "topology-aware", "options": options}
    p = TopologyAwarePolicy(topology(SHAPE), parse_config(config))
    p.start(host or Host(), {})
    return p


def cpus(p: TopologyAwarePolicy, uid: str) -> frozenset[int]:
    return frozenset().union(*(g.cpus for g in p.grants(uid)))


def devices(host: Host) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in host.published[-1]}


def test_the_fixture_isolates_two_cores_of_node_3() -> None:
    topo = topology(SHAPE)
    assert topo.isolated == ISOLATED
    assert topo.nodes[3].cpus == NODE_3


def test_offered_publishes_what_it_always_did(host: Host) -> None:
    policy(host)
    offered = host.published[-1]
    policy(other := Host(), isolatedCPUs="preferred")
    assert other.published[-1] == offered
    assert "isolated" not in devices(host)["cpudevnuma003"]["attributes"]
    assert devices(host)["cpudevnuma003"]["capacity"]["cpu"]["value"] == "14"


def test_offered_claims_take_them_like_any_other_cpu() -> None:
    p = policy()
    p.allocate_claim(claim("a"), [ask("cpudevnuma003", cpu="2")])
    assert not cpus(p, "a") & ISOLATED, "the picker's order (layout) reaches them last"
    p.allocate_claim(claim("b"), [ask("cpudevnuma003", cpu="12")])
    assert cpus(p, "b") >= ISOLATED


def test_preferred_claims_take_the_free_isolated_cpus_first() -> None:
    p = policy(isolatedCPUs="preferred")
    p.allocate_claim(claim("a"), [ask("cpudevnuma003", cpu="2")])
    assert cpus(p, "a") in ({26, 54}, {27, 55}), "one whole isolated core"
    p.allocate_claim(claim("b"), [ask("cpudevnuma003", cpu="4")])
    assert ISOLATED - cpus(p, "a") < cpus(p, "b"), "the other isolated core, then others"
    p.allocate_claim(claim("c"), [ask("cpudevnuma003", cpu="2")])
    assert not cpus(p, "c") & ISOLATED
    p.allocate_claim(claim("d"), [ask("cpudevnuma000", cpu="2")])
    assert not cpus(p, "d") & ISOLATED, "no isolated CPU on node 0"


def test_preferred_with_whole_cores_falls_back_where_isolated_cpus_split_cores(
    tmp_path: Path,
) -> None:
    """Isolating 26 and 27 alone leaves no isolated whole core: the picker's choice."""
    root = tmp_path / "sysfs"
    shutil.copytree(FIXTURES / SHAPE, root)
    (root / "devices/system/cpu/isolated").write_text("26-27\n")
    config = {
        "policy": "topology-aware",
        "fullPhysicalCores": True,
        "options": {"isolatedCPUs": "preferred"},
    }
    p = TopologyAwarePolicy(read_topology(root), parse_config(config))
    p.start(Host(), {})
    p.allocate_claim(claim("a"), [ask("cpudevnuma003", cpu="4")])
    granted = cpus(p, "a")
    assert len(granted) == 4
    assert all(cpu + 28 in granted or cpu - 28 in granted for cpu in granted), "whole cores"


def test_reserved_makes_them_a_device_of_their_own(host: Host) -> None:
    policy(host, isolatedCPUs="reserved")
    published = devices(host)
    assert sorted(published) == [
        "cpudevnuma000",
        "cpudevnuma001",
        "cpudevnuma002",
        "cpudevnuma003",
        "cpudevnuma003isolated",
    ]
    rest, own = published["cpudevnuma003"], published["cpudevnuma003isolated"]
    assert rest["capacity"]["cpu"]["value"] == "10"
    assert own["capacity"]["cpu"]["value"] == "4"
    assert set(own["capacity"]) == {"cpu"}, "the node's memory is offered once"
    assert set(own[FIELD]) == {"cpu"}
    assert own["attributes"]["isolated"] == {"bool": True}
    assert own["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 3}
    assert all(
        d["attributes"]["isolated"] == {"bool": False}
        for name, d in published.items()
        if name != "cpudevnuma003isolated"
    )


def test_reserved_isolated_cpus_go_only_to_claims_of_their_device() -> None:
    p = policy(isolatedCPUs="reserved")
    p.allocate_claim(claim("rest"), [ask("cpudevnuma003", cpu="10", memory="1Gi")])
    assert cpus(p, "rest") == NODE_3 - ISOLATED
    with pytest.raises(PolicyError, match="2 CPUs asked for, only 0 free on cpudevnuma003"):
        p.allocate_claim(claim("more"), [ask("cpudevnuma003", cpu="2")])
    p.allocate_claim(
        claim("dpdk"),
        [
            ask("cpudevnuma003isolated", "workers", cpu="2"),
            ask("cpudevnuma002", "main", cpu="1", memory="1Gi"),
        ],
    )
    workers, main = p.grants("dpdk")
    assert workers.cpus <= ISOLATED
    assert len(workers.cpus) == 2
    assert (workers.mems, workers.memory) == (frozenset({3}), 0)
    assert main.mems == {2}
    assert main.memory == 1 << 30


def test_reserved_memory_is_not_consumed_from_the_isolated_device() -> None:
    p = policy(isolatedCPUs="reserved")
    with pytest.raises(PolicyError, match="a capacity cpudevnuma003isolated does not offer"):
        p.allocate_claim(claim("a"), [ask("cpudevnuma003isolated", cpu="2", memory="1Gi")])
    assert not p.claim_uids()


def test_reserved_device_taken_whole_without_consumable_capacity() -> None:
    p = policy(isolatedCPUs="reserved")
    p.allocate_claim(claim("a"), [ask("cpudevnuma003isolated")])
    ((grant),) = p.grants("a")
    assert (grant.cpus, grant.memory) == (ISOLATED, 0)


@pytest.mark.parametrize(
    ("before", "after", "device"),
    [("reserved", "offered", "cpudevnuma003isolated"), ("preferred", "reserved", "cpudevnuma003")],
)
def test_switching_reserved_is_refused_while_claims_hold_isolated_cpus(
    before: str, after: str, device: str
) -> None:
    p = policy(isolatedCPUs=before)
    p.allocate_claim(claim("a"), [ask(device, cpu="2")])
    assert cpus(p, "a") <= ISOLATED
    switched = parse_config({"policy": "topology-aware", "options": {"isolatedCPUs": after}})
    with pytest.raises(PolicyError, match=r"claim a holds isolated CPUs .* switch it back"):
        p.reconfigure(switched)
    assert p.config.isolated_cpus == before
    restarted = TopologyAwarePolicy(topology(SHAPE), switched)
    with pytest.raises(PolicyError, match="claim a holds isolated CPUs"):
        restarted.start(Host(), p.snapshot())
    p.release_claim("a")
    p.reconfigure(switched)
    assert p.config.isolated_cpus == after


def test_an_unknown_mode_is_refused_naming_the_modes() -> None:
    with pytest.raises(ValueError, match=r"isolatedCPUs: 'always' is not one of \['offered'"):
        parse_config({"policy": "topology-aware", "options": {"isolatedCPUs": "always"}})
