"""Huge pages a claim consumed or holds that its device does not offer (any more).

An allocation may consume pages of a size its NUMA node has none of now: written by another
allocator, made before a reboot that emptied the pool, or before ``nodeAllocatable`` was
switched off. Its containers could not map them (the kubelet's hugetlb limit would refuse),
so nodedra never prepares it as if it had them: it refuses, and says which capacity and why.
Claims that already hold pages keep them, and are named wherever they are short.

The two-socket fixture's nodes: node 0 1024 pages of 2 MiB and 4 of 1 GiB, node 1 512 of
2 MiB, node 2 8 of 1 GiB, node 3 none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from nodedra.policy import (
    PolicyError,
    Shortfall,
    StaticPolicy,
    TopologyAwarePolicy,
    parse_config,
)
from nodedra.policy.topology_aware import device_name
from nodedra.topology.model import Topology
from tests.unit.policy.conftest import Host, ask, claim, topology

SHAPE = "two-socket-smt2-numa4"
MI, GI = 1 << 20, 1 << 30
PAGE_2M, PAGE_1G = 2 * MI, GI
NODE0, NODE1, NODE2, NODE3 = (device_name(n) for n in range(4))


def booted_with(pools: dict[int, dict[int, int]]) -> Topology:
    """The fixture machine, its huge page pools (node -> page size -> pages) replaced."""
    topo = topology(SHAPE)
    nodes = {
        n: dataclasses.replace(node, hugepages=pools.get(n, node.hugepages))
        for n, node in topo.nodes.items()
    }
    return dataclasses.replace(topo, nodes=nodes)


def policy(topo: Topology | None = None, **config: Any) -> TopologyAwarePolicy:
    p = TopologyAwarePolicy(
        topo or topology(SHAPE), parse_config({"policy": "topology-aware", **config})
    )
    p.start(Host(), {})
    return p


# 1. consumed, not offered: refused, saying which and why -----------------------------------


@pytest.mark.parametrize(
    ("config", "device", "consumed", "message"),
    [
        (
            {},
            NODE1,
            {"hugepages_1Gi": "2Gi"},
            r"consumed hugepages_1Gi 2Gi, but cpudevnuma001 offers no 1Gi huge pages now: "
            r"NUMA node 1 has none",
        ),
        (
            {},
            NODE3,
            {"topology-aware.nri.io/hugepages_2Mi": "64Mi"},
            r"consumed topology-aware.nri.io/hugepages_2Mi 64Mi, but cpudevnuma003 offers no "
            r"2Mi huge pages now: NUMA node 3 has none",
        ),
        (
            {"nodeAllocatable": False},
            NODE0,
            {"hugepages_2Mi": "64Mi"},
            r"consumed hugepages_2Mi 64Mi, but cpudevnuma000 offers no 2Mi huge pages now: "
            r"nodeAllocatable is off",
        ),
        ({}, NODE0, {"gpu": "1"}, r"consumed gpu 1, a capacity cpudevnuma000 does not offer"),
        (
            {},
            NODE0,
            {"other.example.com/cpu": "2"},
            r"consumed other.example.com/cpu 2, a capacity cpudevnuma000 does not offer",
        ),
    ],
)
def test_consumed_capacity_the_device_does_not_offer_refuses_the_claim(
    config: dict[str, Any], device: str, consumed: dict[str, str], message: str
) -> None:
    p = policy(**config)
    with pytest.raises(PolicyError, match=rf"result 0 \(request req, device {device}\): {message}"):
        p.allocate_claim(claim("a"), [ask(device, cpu="1", **consumed)])
    assert not p.claim_uids()


def test_nothing_consumed_of_what_is_not_offered_is_granted_in_full() -> None:
    """The scheduler writes every capacity of a device, at its default (0) if not asked
    for: a claim allocated while 1Gi pages were offered consumed ``hugepages_1Gi: 0``."""
    p = policy(nodeAllocatable=False)
    p.allocate_claim(
        claim("a"), [ask(NODE0, cpu="1", hugepages_2Mi="0", hugepages_1Gi="0", future="0")]
    )
    assert p.grants("a")[0].hugepages == ()


def test_the_static_policy_refuses_consumed_capacity_too() -> None:
    """Its devices offer no capacity: a result that consumed some was never meant for it."""
    p = StaticPolicy(topology(SHAPE), parse_config({"policy": "static"}))
    p.start(Host(), {})
    result = ask("cpu002")
    consumed = dataclasses.replace(result, consumed_capacity={"hugepages_1Gi": "1Gi"})
    with pytest.raises(PolicyError, match=r"consumed hugepages_1Gi 1Gi, a capacity cpu002 does"):
        p.allocate_claim(claim("a"), [consumed])
    assert not p.claim_uids()
    p.allocate_claim(claim("a"), [dataclasses.replace(result, consumed_capacity={"x": "0"})])


# 2. held, no longer offered: a re-prepare says what changed --------------------------------


def test_a_re_prepare_says_which_pages_held_the_device_no_longer_offers() -> None:
    before = policy()
    results = [ask(NODE0, cpu="1", hugepages_1Gi="1Gi")]
    before.allocate_claim(claim("a"), results)
    after = policy(booted_with({0: {PAGE_2M: 1024}}))
    after.restore(before.snapshot())
    with pytest.raises(
        PolicyError,
        match=r"result 0 \(request req, device cpudevnuma000\): holds 1Gi of hugepages_1Gi, "
        r"which cpudevnuma000 no longer offers: NUMA node 0 has none",
    ):
        after.allocate_claim(claim("a"), results)
    assert after.grants("a") == before.grants("a")  # a failed re-prepare takes nothing back


def test_a_re_prepare_that_asks_for_other_pages_says_what_it_was_prepared_with() -> None:
    p = policy()
    p.allocate_claim(claim("a"), [ask(NODE0, cpu="1", hugepages_2Mi="64Mi")])
    with pytest.raises(
        PolicyError,
        match=r"differs from what it was prepared with: 1 CPUs, 0 bytes of memory, 64Mi of "
        r"hugepages_2Mi; it asks for 1 CPUs, 0 bytes of memory, 128Mi of hugepages_2Mi",
    ):
        p.allocate_claim(claim("a"), [ask(NODE0, cpu="1", hugepages_2Mi="128Mi")])


# 3. a live reconfiguration may not stop offering pages claims hold -------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"nodeAllocatable": False},
            r"hugepages_2Mi of cpudevnuma001: claims \['a', 'b'\] hold 768Mi, it would offer 0 "
            r"\(nodeAllocatable is off\)",
        ),
        (
            {"options": {"reservedHugepages": {"2Mi": "512Mi"}}},
            r"hugepages_2Mi of cpudevnuma001: claims \['a', 'b'\] hold 768Mi, it would offer "
            r"512Mi \(reservedHugepages keeps 512Mi of NUMA node 1's 1Gi\)",
        ),
    ],
)
def test_a_reconfiguration_that_stops_offering_held_pages_is_refused(
    config: dict[str, Any], message: str
) -> None:
    p = policy()
    p.allocate_claim(claim("a"), [ask(NODE1, cpu="1", hugepages_2Mi="512Mi")])
    p.allocate_claim(claim("b"), [ask(NODE1, cpu="1", hugepages_2Mi="256Mi")])
    p.allocate_claim(claim("c"), [ask(NODE0, cpu="1")])
    in_force = p.config
    with pytest.raises(PolicyError, match=message):
        p.reconfigure(parse_config({"policy": "topology-aware", **config}))
    assert p.config is in_force
    # What is left is enough: taken.
    p.reconfigure(
        parse_config(
            {"policy": "topology-aware", "options": {"reservedHugepages": {"2Mi": "256Mi"}}}
        )
    )
    assert p.devices()[1]["capacity"]["hugepages_2Mi"]["value"] == str(768 * MI)


def test_a_reconfiguration_is_not_refused_for_what_a_boot_took_already() -> None:
    before = policy()
    before.allocate_claim(claim("a"), [ask(NODE0, cpu="1", hugepages_1Gi="1Gi")])
    after = policy(booted_with({0: {PAGE_2M: 1024}}))
    after.restore(before.snapshot())
    spare = max(after.free_cpus())
    after.reconfigure(parse_config({"policy": "topology-aware", "reservedCPUs": str(spare)}))
    assert after.config.reserved_cpus == {spare}


# 4. held, short after a start: kept, and named ---------------------------------------------


def test_claims_holding_pages_the_node_no_longer_offers_are_kept_and_named() -> None:
    before = policy()
    before.allocate_claim(claim("gone"), [ask(NODE0, cpu="1", hugepages_1Gi="2Gi")])
    before.allocate_claim(claim("x"), [ask(NODE1, cpu="1", hugepages_2Mi="512Mi")])
    before.allocate_claim(claim("y"), [ask(NODE1, cpu="1", hugepages_2Mi="256Mi")])
    before.allocate_claim(claim("fine"), [ask(NODE2, cpu="1", hugepages_1Gi="1Gi")])
    after = TopologyAwarePolicy(
        booted_with({0: {PAGE_2M: 1024}, 1: {PAGE_2M: 256}}),
        parse_config({"policy": "topology-aware"}),
    )
    after.start(Host(), before.snapshot())
    assert after.claim_uids() == {"gone", "x", "y", "fine"}
    assert after.shortfalls() == [
        Shortfall("gone", NODE0, "hugepages_1Gi", 2 * GI, 2 * GI, 0, "NUMA node 0 has none"),
        Shortfall(
            "x", NODE1, "hugepages_2Mi", 512 * MI, 768 * MI, 512 * MI, "NUMA node 1 has 512Mi"
        ),
        Shortfall(
            "y", NODE1, "hugepages_2Mi", 256 * MI, 768 * MI, 512 * MI, "NUMA node 1 has 512Mi"
        ),
    ]
    assert str(after.shortfalls()[1]) == (
        "claim x holds 512Mi of hugepages_2Mi of cpudevnuma001, where claims hold 768Mi and "
        "it offers 512Mi now: NUMA node 1 has 512Mi"
    )
    after.release_claim("gone")
    after.release_claim("y")
    assert after.shortfalls() == []


def test_the_static_policy_holds_no_capacity_to_fall_short_of() -> None:
    p = StaticPolicy(topology(SHAPE), parse_config({"policy": "static"}))
    p.start(Host(), {})
    p.allocate_claim(claim("a"), [ask("cpu002")])
    assert p.shortfalls() == []
