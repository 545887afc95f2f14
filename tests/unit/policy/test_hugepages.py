"""Huge pages per NUMA node: offered, granted, never promised twice, kept across a restart.

The two-socket fixture's nodes have uneven pools: node 0 1024 pages of 2 MiB and 4 of
1 GiB, node 1 512 of 2 MiB, node 2 8 of 1 GiB, node 3 none.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodedra.dra.probes import NODE_ALLOCATABLE_RESOURCES
from nodedra.lib.quantity import binary_quantity
from nodedra.policy import ConfigError, PolicyError, TopologyAwarePolicy, parse_config
from nodedra.policy.ledger import Grant, Ledger
from nodedra.policy.topology_aware import device_name
from tests.unit.policy.conftest import Host, ask, claim, topology

SHAPE = "two-socket-smt2-numa4"
MI, GI = 1 << 20, 1 << 30
PAGE_2M, PAGE_1G = 2 * MI, GI
NODE0, NODE1, NODE2, NODE3 = (device_name(n) for n in range(4))


def policy(**config: Any) -> TopologyAwarePolicy:
    p = TopologyAwarePolicy(topology(SHAPE), parse_config({"policy": "topology-aware", **config}))
    p.start(Host(), {})
    return p


def capacities(p: TopologyAwarePolicy) -> dict[str, dict[str, Any]]:
    """Device -> its huge page capacities."""
    return {
        d["name"]: {k: v for k, v in d["capacity"].items() if k.startswith("hugepages_")}
        for d in p.devices()
    }


def env(edits: dict[str, list[str]]) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in edits["env"])


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (4096, "4Ki"), (PAGE_2M, "2Mi"), (PAGE_1G, "1Gi"), (3 * MI, "3Mi"), (1000, "1000")],
)
def test_page_sizes_are_named_as_the_kubelet_names_them(value: int, text: str) -> None:
    assert binary_quantity(value) == text


def test_each_node_offers_each_page_size_it_has_in_bytes_a_page_at_a_time() -> None:
    def offer(total: int, page: int) -> dict[str, Any]:
        return {
            "value": str(total),
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "step": str(page)}},
        }

    assert capacities(policy()) == {
        NODE0: {"hugepages_2Mi": offer(2 * GI, PAGE_2M), "hugepages_1Gi": offer(4 * GI, PAGE_1G)},
        NODE1: {"hugepages_2Mi": offer(GI, PAGE_2M)},
        NODE2: {"hugepages_1Gi": offer(8 * GI, PAGE_1G)},
        NODE3: {},
    }


def test_memory_offered_is_what_the_huge_page_pools_leave() -> None:
    topo = topology(SHAPE)
    memory = {d["name"]: int(d["capacity"]["memory"]["value"]) for d in policy().devices()}
    assert memory[NODE0] == topo.nodes[0].memory - 2 * GI - 4 * GI
    assert memory[NODE3] == topo.nodes[3].memory


def test_a_reservation_per_node_is_kept_out_in_whole_pages() -> None:
    p = policy(options={"reservedHugepages": {"2Mi": "3Mi", "1Gi": "9Gi"}})
    offered = {
        device: {name: c["value"] for name, c in caps.items()}
        for device, caps in capacities(p).items()
    }
    assert offered == {
        NODE0: {"hugepages_2Mi": str(2 * GI - 4 * MI), "hugepages_1Gi": "0"},
        NODE1: {"hugepages_2Mi": str(GI - 4 * MI)},
        NODE2: {"hugepages_1Gi": "0"},
        NODE3: {},
    }
    # Nothing left: the one value the range holds is 0 (a step would exceed it).
    assert capacities(p)[NODE2]["hugepages_1Gi"]["requestPolicy"] == {
        "default": "0",
        "validRange": {"min": "0"},
    }


def test_none_are_offered_without_the_node_allocatable_mapping() -> None:
    """The kubelet lets a container use only the huge pages its pod accounts for."""
    offered = capacities(policy(nodeAllocatable=False))
    assert offered == {device: {} for device in (NODE0, NODE1, NODE2, NODE3)}


def test_nor_where_the_api_server_would_drop_the_mapping() -> None:
    (device, *_) = policy().devices()
    bare = NODE_ALLOCATABLE_RESOURCES.without(device)
    assert "nodeAllocatableResources" not in bare
    assert sorted(bare["capacity"]) == ["cpu", "memory"]


def test_a_claim_gets_its_huge_pages_from_its_node_and_is_told_so() -> None:
    p = policy()
    edits = p.allocate_claim(
        claim("u-1"), [ask(NODE0, cpu="1", memory="64Mi", hugepages_2Mi="64Mi", hugepages_1Gi="0")]
    )
    (grant,) = p.grants("u-1")
    assert grant.hugepages == ((PAGE_2M, 64 * MI),)
    assert grant.mems == {0}
    told = env(edits[0])
    assert told["DRA_HUGEPAGES_2Mi_u_1_0"] == str(64 * MI)
    assert not any(name.startswith("DRA_HUGEPAGES_1Gi") for name in told)
    (attributes,) = p.result_attributes("u-1")
    assert attributes["hugepages_2Mi"] == {"int": 64 * MI}
    assert "hugepages_1Gi" not in attributes


def test_driver_qualified_capacity_names_count_too() -> None:
    p = policy()
    p.allocate_claim(
        claim("u"), [ask(NODE2, cpu="1", **{"topology-aware.nri.io/hugepages_1Gi": "2Gi"})]
    )
    assert p.grants("u")[0].hugepages == ((PAGE_1G, 2 * GI),)


def test_huge_pages_are_never_promised_twice() -> None:
    p = policy()
    p.allocate_claim(claim("a"), [ask(NODE1, cpu="1", hugepages_2Mi="768Mi")])
    with pytest.raises(PolicyError, match=r"268435456 free on cpudevnuma001"):
        p.allocate_claim(claim("b"), [ask(NODE1, cpu="1", hugepages_2Mi="512Mi")])
    assert "b" not in p.claim_uids()
    # Another node's pool of the same size is its own.
    p.allocate_claim(claim("c"), [ask(NODE0, cpu="1", hugepages_2Mi="2Gi")])
    # Given back, they are free again.
    p.release_claim("a")
    p.allocate_claim(claim("b"), [ask(NODE1, cpu="1", hugepages_2Mi="1Gi")])


def test_the_results_of_one_claim_share_their_node_s_pool() -> None:
    p = policy()
    with pytest.raises(PolicyError, match=r"result 1 .*hugepages_2Mi"):
        p.allocate_claim(
            claim("a"),
            [
                ask(NODE1, "x", cpu="1", hugepages_2Mi="768Mi"),
                ask(NODE1, "y", cpu="1", hugepages_2Mi="768Mi"),
            ],
        )
    assert not p.claim_uids()


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        ("3Mi", "not a whole number of pages"),
        ("1.5", "not a whole number of bytes"),
        ("-2Mi", "not a whole"),
    ],
)
def test_an_amount_that_is_no_whole_pages_fails_the_claim(amount: str, message: str) -> None:
    p = policy()
    with pytest.raises(PolicyError, match=message):
        p.allocate_claim(claim("a"), [ask(NODE1, cpu="1", hugepages_2Mi=amount)])
    assert not p.claim_uids()


def test_a_claim_of_the_whole_device_is_told_of_no_huge_pages() -> None:
    """Devices are taken whole where the API server drops consumable capacity, and with it
    (before 1.36, or gates off) the mappings that would let the container use huge pages."""
    p = policy()
    edits = p.allocate_claim(claim("all"), [ask(NODE0)])
    assert p.grants("all")[0].hugepages == ()
    assert not any(entry.startswith("DRA_HUGEPAGES") for entry in edits[0]["env"])


def test_the_whole_device_is_not_granted_while_a_claim_holds_some_of_its_pages() -> None:
    p = policy()
    p.allocate_claim(claim("a"), [ask(NODE0, cpu="1", hugepages_1Gi="1Gi")])
    p.release_claim("a")
    p.allocate_claim(claim("a"), [ask(NODE0, cpu="1", hugepages_1Gi="1Gi")])
    with pytest.raises(PolicyError, match="or huge pages are held by other claims"):
        p.allocate_claim(claim("all"), [ask(NODE0)])


def test_a_claim_seen_before_must_ask_for_the_same_huge_pages() -> None:
    p = policy()
    p.allocate_claim(claim("a"), [ask(NODE0, cpu="1", hugepages_2Mi="64Mi")])
    p.allocate_claim(claim("a"), [ask(NODE0, cpu="1", hugepages_2Mi="64Mi")])
    with pytest.raises(PolicyError, match="differs from what it was prepared with"):
        p.allocate_claim(claim("a"), [ask(NODE0, cpu="1", hugepages_2Mi="128Mi")])


def test_the_checkpoint_keeps_them() -> None:
    p = policy()
    p.allocate_claim(claim("a"), [ask(NODE1, cpu="1", hugepages_2Mi="1Gi")])
    p.allocate_claim(claim("b"), [ask(NODE0, cpu="1")])
    snapshot = p.snapshot()
    assert snapshot["a"]["grants"][0]["hugepages"] == {str(PAGE_2M): GI}
    assert "hugepages" not in snapshot["b"]["grants"][0]  # older readers see what they know
    restarted = policy()
    restarted.restore(snapshot)
    with pytest.raises(PolicyError, match="only 0 free"):
        restarted.allocate_claim(claim("c"), [ask(NODE1, cpu="1", hugepages_2Mi="2Mi")])
    assert restarted.grants("a") == p.grants("a")


def test_a_checkpoint_of_before_huge_pages_reads_as_none() -> None:
    grant = Grant.from_json(
        {"request": "r", "device": NODE0, "cpus": "1", "memory": 0, "mems": "0"}
    )
    assert grant.hugepages == ()


@pytest.mark.parametrize("pages", [{"2097152": 0}, {"2097152": -2}, {"x": 1}, [1], {"0": 2}])
def test_malformed_huge_pages_in_a_checkpoint_are_refused(pages: object) -> None:
    record = {
        "request": "r",
        "device": NODE0,
        "cpus": "1",
        "memory": 0,
        "mems": "0",
        "hugepages": pages,
    }
    with pytest.raises(PolicyError, match="malformed grant"):
        Ledger.from_json({"u": {"grants": [record]}})


@pytest.mark.parametrize(
    ("reserved", "message"),
    [
        ("64Mi", "must map page sizes"),
        ({"2Mi": "-1"}, "not a whole, non-negative"),
        ({"0": "2Mi"}, "is not a size"),
        ({"2Mi": True}, "not a quantity"),
        ({"huge": "2Mi"}, "page size"),
    ],
)
def test_bad_reservations_are_refused(reserved: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"policy": "topology-aware", "options": {"reservedHugepages": reserved}})


def test_the_static_policy_takes_no_reservation_of_huge_pages() -> None:
    with pytest.raises(ConfigError, match="not options of policy static"):
        parse_config({"policy": "static", "options": {"reservedHugepages": {"2Mi": "2Mi"}}})
