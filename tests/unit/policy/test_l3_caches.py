"""CPUs chosen by shared L3 cache, on the EPYC-like fixtures (8 CPUs an L3 cache, 8 caches a
socket; a NUMA node holds 8 caches with NPS1, 2 with NPS4)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from nodedra.policy import StaticPolicy, TopologyAwarePolicy, parse_config
from nodedra.policy.topology_aware import device_name
from nodedra.topology.model import Topology
from tests.unit.policy.conftest import Host, ask, claim, topology

NPS1, NPS4 = "epyc-2s-nps1", "epyc-2s-nps4"


def policy(shape: str, **config: object) -> TopologyAwarePolicy:
    p = TopologyAwarePolicy(topology(shape), parse_config({"policy": "topology-aware", **config}))
    p.start(Host(), {})
    return p


def cpus_of(p: TopologyAwarePolicy, uid: str) -> frozenset[int]:
    return frozenset(c for g in p.grants(uid) for c in g.cpus)


def caches_of(topo: Topology, cpus: frozenset[int]) -> set[int | None]:
    return {topo.cpus[c].l3_cache for c in cpus}


def fewest_caches(topo: Topology, free: frozenset[int], count: int) -> int:
    """The fewest caches ``count`` of ``free`` fit in: the fullest caches first."""
    per_cache = sorted(Counter(topo.cpus[c].l3_cache for c in free).values(), reverse=True)
    taken = 0
    for spanned, size in enumerate(per_cache, start=1):
        taken += size
        if taken >= count:
            return spanned
    raise AssertionError(f"{count} CPUs do not fit in {len(free)}")


def test_a_claim_of_one_cache_takes_a_whole_free_one_not_the_rest_of_a_split_one() -> None:
    """Whole cores in layout order (the picker before caches) would have taken cache 0's six
    free CPUs and two of cache 1's: two caches where one does."""
    topo = topology(NPS1)
    p = policy(NPS1, reservedCPUs="")
    dev = device_name(0)
    p.allocate_claim(claim("small"), [ask(dev, cpu="2")])
    assert caches_of(topo, cpus_of(p, "small")) == {0}
    p.allocate_claim(claim("eight"), [ask(dev, cpu="8")])
    assert caches_of(topo, cpus_of(p, "eight")) == {1}
    assert cpus_of(p, "eight") == set(topo.l3_caches()[1])
    # Smaller claims go where they fit most tightly: the rest of cache 0.
    p.allocate_claim(claim("four"), [ask(dev, cpu="4")])
    assert caches_of(topo, cpus_of(p, "four")) == {0}


def test_a_claim_bigger_than_a_cache_takes_whole_caches_then_the_tightest_fit() -> None:
    topo = topology(NPS1)
    p = policy(NPS1, reservedCPUs="")
    dev = device_name(0)
    p.allocate_claim(claim("a"), [ask(dev, cpu="5")])  # cache 0: 3 free
    p.allocate_claim(claim("b"), [ask(dev, cpu="19")])
    b = cpus_of(p, "b")
    # Two whole caches and the 3 CPUs left in cache 0: three caches, the fewest possible,
    # and every other cache stays whole.
    assert Counter(topo.cpus[c].l3_cache for c in b) == {0: 3, 1: 8, 2: 8}
    for cache in range(3, 8):
        assert not set(topo.l3_caches()[cache]) & (b | cpus_of(p, "a"))


@pytest.mark.parametrize("shape", [NPS1, NPS4])
@pytest.mark.parametrize("whole_cores", [False, True], ids=["threads", "whole-cores"])
@pytest.mark.parametrize("seed", range(5))
def test_on_a_fragmented_node_every_claim_spans_the_fewest_caches(
    shape: str, whole_cores: bool, seed: int
) -> None:
    """Claims of 1 to 24 CPUs come and go at random on one NUMA node; each spans the fewest
    L3 caches its free CPUs allow."""
    topo = topology(shape)
    p = policy(shape, reservedCPUs="", fullPhysicalCores=whole_cores)
    node = topo.nodes[0]
    dev = device_name(0)
    step = 2 if whole_cores else 1
    rng = random.Random(seed)
    held: list[str] = []
    spanned = best = 0
    for round_ in range(400):
        taken = frozenset(c for uid in held for c in cpus_of(p, uid))
        free = node.cpus - taken
        if whole_cores:  # a claim of whole cores can use only wholly free cores
            free = frozenset(c for c in free if topo.cpus[c].siblings <= free)
        if held and (len(free) < step or rng.random() < 0.4):
            p.release_claim(held.pop(rng.randrange(len(held))))
            continue
        count = min(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24]), len(free))
        count -= count % step
        if count == 0:
            continue
        uid = f"c{round_}"
        p.allocate_claim(claim(uid), [ask(dev, cpu=str(count))])
        held.append(uid)
        got = cpus_of(p, uid)
        assert len(got) == count
        fewest = fewest_caches(topo, free, count)
        assert len(caches_of(topo, got)) == fewest, f"claim {uid} of {count} CPUs"
        spanned += len(caches_of(topo, got))
        best += fewest
    assert best > 0
    assert spanned == best


def test_static_devices_carry_their_l3_cache() -> None:
    topo = topology(NPS4)
    p = StaticPolicy(topo, parse_config({"policy": "static", "reservedCPUs": "0"}))
    host = Host()
    p.start(host, {})
    devices = {d["name"]: d for d in host.published[-1]}
    assert devices["cpu084"]["attributes"]["l3Cache"] == {"int": 5}
    assert devices["cpu020"]["attributes"]["l3Cache"] == {"int": 5}
    assert devices["cpu024"]["attributes"]["l3Cache"] == {"int": 6}
    for device in devices.values():
        assert "l3Cache" in device["attributes"]
    plain = StaticPolicy(topology("two-socket-smt2-numa4"), parse_config({"policy": "static"}))
    plain.start(host, {})
    assert not any("l3Cache" in d["attributes"] for d in host.published[-1])
