"""The topology-aware policy on the fixture machines."""

from __future__ import annotations

import pytest

from nodedra.policy import PolicyConfig, PolicyError, TopologyAwarePolicy, parse_config
from nodedra.policy.protocol import NUMA_NODE_ATTRIBUTE
from nodedra.policy.topology_aware import MEMORY_STEP, device_name
from nodedra.topology.cpulist import format_cpu_list, parse_cpu_list
from nodedra.topology.model import Topology
from tests.unit.policy.conftest import SHAPES, Host, ask, claim, topology

TWO_SOCKETS = "two-socket-smt2-numa4"


def policy(
    shape: str = TWO_SOCKETS, host: Host | None = None, **config: object
) -> TopologyAwarePolicy:
    p = TopologyAwarePolicy(topology(shape), parse_config({"policy": "topology-aware", **config}))
    p.start(host or Host(), {})
    return p


def env(edits: dict[str, list[str]]) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in edits["env"])


def cpus_of(p: TopologyAwarePolicy, uid: str) -> frozenset[int]:
    return frozenset(c for g in p.grants(uid) for c in g.cpus)


@pytest.mark.parametrize("shape", SHAPES)
def test_one_device_per_node_with_cpus(shape: str, host: Host) -> None:
    topo = topology(shape)
    p = policy(shape, host)
    devices = host.published[-1]
    nodes_with_cpus = sorted(n.id for n in topo.nodes.values() if n.cpus)
    assert [d["name"] for d in devices] == [device_name(n) for n in nodes_with_cpus]
    for device in devices:
        node = topo.nodes[device["attributes"][NUMA_NODE_ATTRIBUTE]["int"]]
        assert device["capacity"]["cpu"]["value"] == str(len(node.cpus))
        memory = int(device["capacity"]["memory"]["value"])
        assert memory % MEMORY_STEP == 0
        # What the huge page pools leave: the kernel counts them in the node's MemTotal.
        left = max(node.memory - sum(size * n for size, n in node.hugepages.items()), 0)
        assert left - MEMORY_STEP < memory <= left
        assert device["allowMultipleAllocations"] is True
        assert device["attributes"]["smtEnabled"] == {"bool": topo.smt_enabled}
    assert p.devices() == devices


def test_memory_only_node_has_no_device(host: Host) -> None:
    topo = topology("snc-memory-only")
    memory_only = [n.id for n in topo.nodes.values() if not n.cpus]
    assert memory_only, "the fixture has a memory-only node"
    names = {d["name"] for d in policy("snc-memory-only", host).devices()}
    assert not names & {device_name(n) for n in memory_only}


def test_reserved_cpus_and_memory_are_not_offered() -> None:
    topo = topology(TWO_SOCKETS)
    node = min(topo.nodes.values(), key=lambda n: n.id)
    reserved = sorted(node.cpus)[:2]
    p = policy(reservedCPUs=",".join(map(str, reserved)), options={"reservedMemory": "1Gi"})
    device = next(d for d in p.devices() if d["name"] == device_name(node.id))
    assert device["capacity"]["cpu"]["value"] == str(len(node.cpus) - 2)
    assert int(device["capacity"]["memory"]["value"]) <= node.memory - (1 << 30)
    assert not p.grantable & set(reserved)


def whole_cores(topo: Topology, cpus: frozenset[int]) -> int:
    return sum(1 for c in cpus if topo.cpus[c].siblings <= cpus) // topo.threads_per_core


def test_whole_cores_first_inside_the_node() -> None:
    topo = topology(TWO_SOCKETS)
    assert topo.threads_per_core == 2
    p = policy()
    node = min(topo.nodes.values(), key=lambda n: n.id)
    dev = device_name(node.id)
    p.allocate_claim(claim("a"), [ask(dev, cpu="4")])
    a = cpus_of(p, "a")
    assert len(a) == 4
    assert a <= node.cpus
    assert whole_cores(topo, a) == 2
    p.allocate_claim(claim("b"), [ask(dev, cpu="3")])
    b = cpus_of(p, "b")
    assert whole_cores(topo, b) == 1
    # The next single CPU comes from the core b split, not from a whole one.
    p.allocate_claim(claim("c"), [ask(dev, cpu="1")])
    (c,) = cpus_of(p, "c")
    assert topo.cpus[c].siblings & b


def test_edits_name_what_each_result_got() -> None:
    topo = topology(TWO_SOCKETS)
    nodes = sorted(topo.nodes)
    p = policy()
    edits = p.allocate_claim(
        claim("u-1"),
        [
            ask(device_name(nodes[0]), "a", cpu="2", memory="1Gi"),
            ask(device_name(nodes[1]), "b", cpu="1"),
        ],
    )
    assert len(edits) == 2
    first, second = env(edits[0]), env(edits[1])
    assert set(first).isdisjoint(second)
    assert first["DRA_MEMSET_u_1_0"] == str(nodes[0])
    assert first["DRA_MEMORY_u_1_0"] == str(1 << 30)
    assert second["DRA_MEMORY_u_1_1"] == "0"
    grants = p.grants("u-1")
    assert parse_cpu_list(first["DRA_CPUSET_u_1_0"]) == grants[0].cpus
    assert parse_cpu_list(second["DRA_CPUSET_u_1_1"]) == grants[1].cpus
    assert len(grants[0].cpus) == 2


def test_the_workload_is_told_its_devices_and_what_each_result_got() -> None:
    nodes = sorted(topology(TWO_SOCKETS).nodes)
    p = policy(fullPhysicalCores=True)
    p.allocate_claim(
        claim("u-1"),
        [
            ask(device_name(nodes[0]), "a", cpu="2", memory="1Gi"),
            ask(device_name(nodes[1]), cpu="2"),
        ],
    )
    first, second = p.result_attributes("u-1")
    grants = p.grants("u-1")
    device = next(d for d in p.devices() if d["name"] == device_name(nodes[0]))
    assert first == {
        **device["attributes"],
        "cpus": {"string": format_cpu_list(grants[0].cpus)},
        "memoryNodes": {"string": str(nodes[0])},
        "memory": {"int": 1 << 30},
    }
    assert first["fullPhysicalCores"] == {"bool": True}
    assert "memory" not in second  # a result without memory is not told it has 0 bytes
    assert second["cpus"] == {"string": format_cpu_list(grants[1].cpus)}
    with pytest.raises(KeyError):
        p.result_attributes("unknown")


def test_reprepare_answers_the_same_and_allocates_nothing_more() -> None:
    p = policy()
    dev = device_name(min(topology(TWO_SOCKETS).nodes))
    results = [ask(dev, cpu="3", memory="2Mi")]
    first = p.allocate_claim(claim("a"), results)
    free = p.free_cpus()
    assert p.allocate_claim(claim("a"), results) == first
    assert p.free_cpus() == free
    with pytest.raises(PolicyError, match="differs from what it was prepared with"):
        p.allocate_claim(claim("a"), [ask(dev, cpu="4", memory="2Mi")])


def test_whole_device_without_consumed_capacity() -> None:
    topo = topology(TWO_SOCKETS)
    node = min(topo.nodes.values(), key=lambda n: n.id)
    p = policy()
    p.allocate_claim(claim("all"), [ask(device_name(node.id))])
    (grant,) = p.grants("all")
    assert grant.cpus == node.cpus
    assert grant.memory == p.offered_memory(node)
    p.release_claim("all")
    p.allocate_claim(claim("one"), [ask(device_name(node.id), cpu="1")])
    with pytest.raises(PolicyError, match="takes the whole of"):
        p.allocate_claim(claim("all"), [ask(device_name(node.id))])


@pytest.mark.parametrize(
    ("consumed", "message"),
    [
        ({"memory": "1Gi"}, "consumed no cpu"),
        ({"cpu": "0"}, "'0' is not a positive whole number"),
        ({"cpu": "-2"}, "'-2' is not a positive whole number"),
        ({"cpu": "1500m"}, "'1500m' is not a positive whole number"),
        ({"cpu": "lots"}, "not a quantity"),
        ({"cpu": "1000"}, "which offers"),
        ({"cpu": "1", "memory": "0.5"}, "not a whole number of bytes"),
        ({"cpu": "1", "memory": "-1Gi"}, "not a whole number of bytes"),
        ({"cpu": "1", "memory": "100Ti"}, "bytes of memory asked for, only"),
    ],
)
def test_consumed_capacity_is_validated(consumed: dict[str, str], message: str) -> None:
    p = policy()
    dev = device_name(min(topology(TWO_SOCKETS).nodes))
    with pytest.raises(PolicyError, match=message) as caught:
        p.allocate_claim(claim("a"), [ask(dev, **consumed)])
    assert f"result 0 (request req, device {dev})" in str(caught.value)
    assert p.claim_uids() == frozenset()
    assert p.free_cpus() == p.grantable


def test_driver_qualified_capacity_names() -> None:
    p = policy()
    dev = device_name(min(topology(TWO_SOCKETS).nodes))
    p.allocate_claim(claim("a"), [ask(dev, **{"topology-aware.nri.io/cpu": "2"})])
    assert len(cpus_of(p, "a")) == 2


def test_unknown_device_and_failed_claims_leave_nothing() -> None:
    p = policy()
    dev = device_name(min(topology(TWO_SOCKETS).nodes))
    with pytest.raises(PolicyError, match="unknown device cpudevnuma099"):
        p.allocate_claim(claim("a"), [ask("cpudevnuma099", cpu="1")])
    node_cpus = len(topology(TWO_SOCKETS).nodes[min(topology(TWO_SOCKETS).nodes)].cpus)
    with pytest.raises(PolicyError, match=r"result 1 .*only"):
        p.allocate_claim(claim("a"), [ask(dev, cpu="2"), ask(dev, cpu=str(node_cpus - 1))])
    assert p.claim_uids() == frozenset()
    assert p.free_cpus() == p.grantable


def test_exhaustion_and_release() -> None:
    topo = topology(TWO_SOCKETS)
    node = min(topo.nodes.values(), key=lambda n: n.id)
    dev = device_name(node.id)
    p = policy()
    for i in range(len(node.cpus)):
        p.allocate_claim(claim(f"c{i}"), [ask(dev, cpu="1")])
    with pytest.raises(PolicyError, match="only 0 free"):
        p.allocate_claim(claim("more"), [ask(dev, cpu="1")])
    p.release_claim("c3")
    p.release_claim("c3")
    p.release_claim("never-seen")
    p.allocate_claim(claim("more"), [ask(dev, cpu="1")])


def test_reconfigure_refuses_claimed_cpus_and_keeps_the_old_config(host: Host) -> None:
    p = policy(host=host)
    dev = device_name(min(topology(TWO_SOCKETS).nodes))
    p.allocate_claim(claim("a"), [ask(dev, cpu="2")])
    held = sorted(cpus_of(p, "a"))
    before = p.config
    with pytest.raises(PolicyError, match=rf"can't reserve CPUs {held[0]}.*held by claims \['a'\]"):
        p.reconfigure(PolicyConfig(reserved_cpus=frozenset(held[:1])))
    assert p.config is before
    free = sorted(p.free_cpus())[:2]
    published = len(host.published)
    p.reconfigure(PolicyConfig(reserved_cpus=frozenset(free)))
    assert p.config.reserved_cpus == set(free)
    assert len(host.published) == published + 1
    with pytest.raises(PolicyError, match="changing the policy takes a restart"):
        p.reconfigure(PolicyConfig(policy="static"))


def test_reserving_every_cpu_is_refused() -> None:
    topo = topology(TWO_SOCKETS)
    everything = ",".join(map(str, topo.cpu_ids))
    with pytest.raises(PolicyError, match="reserve every online CPU"):
        policy(reservedCPUs=everything)


def test_restore_from_snapshot() -> None:
    p = policy()
    dev = device_name(min(topology(TWO_SOCKETS).nodes))
    p.allocate_claim(claim("a"), [ask(dev, cpu="3", memory="4Mi")])
    snapshot = p.snapshot()
    again = TopologyAwarePolicy(topology(TWO_SOCKETS), p.config)
    again.start(Host(), snapshot)
    assert again.snapshot() == snapshot
    assert again.free_cpus() == p.free_cpus()
    assert again.allocate_claim(claim("a"), [ask(dev, cpu="3", memory="4Mi")]) == p.allocate_claim(
        claim("a"), [ask(dev, cpu="3", memory="4Mi")]
    )


def test_restore_refuses_reserving_claimed_cpus() -> None:
    p = policy()
    dev = device_name(min(topology(TWO_SOCKETS).nodes))
    p.allocate_claim(claim("a"), [ask(dev, cpu="1")])
    (cpu,) = cpus_of(p, "a")
    again = TopologyAwarePolicy(topology(TWO_SOCKETS), PolicyConfig(reserved_cpus=frozenset({cpu})))
    with pytest.raises(PolicyError, match="held by claims"):
        again.start(Host(), p.snapshot())


# Whole physical cores (fullPhysicalCores) ------------------------------------------------


def is_whole(topo: Topology, cpus: frozenset[int]) -> bool:
    return all(topo.cpus[c].siblings <= cpus for c in cpus)


def test_whole_cores_are_taken_a_core_at_a_time() -> None:
    """SMT2: the cpu capacity starts at a core and steps by a core (the scheduler rounds 3 up
    to 4), and the core of a reserved thread is not offered."""
    topo = topology(TWO_SOCKETS)
    p = policy(reservedCPUs="0", fullPhysicalCores=True)
    first = min(topo.nodes.values(), key=lambda n: n.id)
    device = next(d for d in p.devices() if d["name"] == device_name(first.id))
    offered = first.cpus - topo.cpus[0].siblings
    assert device["capacity"]["cpu"] == {
        "value": str(len(offered)),
        "requestPolicy": {"default": "2", "validRange": {"min": "2", "step": "2"}},
    }
    assert device["attributes"]["fullPhysicalCores"] == {"bool": True}
    p.allocate_claim(claim("a"), [ask(device["name"], cpu="4")])
    assert len(cpus_of(p, "a")) == 4
    assert is_whole(topo, cpus_of(p, "a"))
    assert not cpus_of(p, "a") & topo.cpus[0].siblings
    with pytest.raises(PolicyError, match="3 CPUs are no whole number of the free cores"):
        p.allocate_claim(claim("b"), [ask(device["name"], cpu="3")])
    assert p.claim_uids() == {"a"}


def test_whole_cores_on_a_hybrid_node_step_by_one_cpu() -> None:
    """P-cores of two threads beside E-cores of one: any count whole cores make is granted."""
    topo = topology("hybrid-pe")
    p = policy("hybrid-pe", fullPhysicalCores=True)
    (device,) = p.devices()
    assert device["capacity"]["cpu"]["requestPolicy"]["validRange"] == {"min": "1", "step": "1"}
    p.allocate_claim(claim("a"), [ask(device["name"], cpu="3")])
    assert len(cpus_of(p, "a")) == 3
    assert is_whole(topo, cpus_of(p, "a"))
    p.allocate_claim(claim("b"), [ask(device["name"], cpu="4")])
    assert len(cpus_of(p, "b")) == 4
    assert is_whole(topo, cpus_of(p, "b"))


def test_switching_whole_cores_on_is_refused_while_a_claim_holds_half_a_core() -> None:
    topo = topology(TWO_SOCKETS)
    host = Host()
    p = policy(host=host)
    dev = device_name(min(topo.nodes))
    p.allocate_claim(claim("half"), [ask(dev, cpu="1")])
    whole = parse_config({"policy": "topology-aware", "fullPhysicalCores": True})
    with pytest.raises(PolicyError, match=r"claim half holds CPUs .* would not grant"):
        p.reconfigure(whole)
    p.release_claim("half")
    p.allocate_claim(claim("two"), [ask(dev, cpu="2")])  # one whole core
    p.reconfigure(whole)
    assert p.config.full_physical_cores
    p.reconfigure(parse_config({"policy": "topology-aware"}))  # off: always fine
