"""The static policy: one device per grantable CPU."""

from __future__ import annotations

import pytest

from nodedra.dra import AllocationResult
from nodedra.policy import PolicyError, StaticPolicy, parse_config
from nodedra.policy.static import core_device_name, device_name
from nodedra.topology.cpulist import format_cpu_list
from tests.unit.policy.conftest import SHAPES, Host, claim, topology


def policy(shape: str, **config: object) -> StaticPolicy:
    p = StaticPolicy(topology(shape), parse_config({"policy": "static", **config}))
    p.start(Host(), {})
    return p


def cpu(device: str, request: str = "req") -> AllocationResult:
    return AllocationResult(request, "static.nri.io", "node", device)


@pytest.mark.parametrize("shape", SHAPES)
def test_one_device_per_grantable_cpu(shape: str) -> None:
    topo = topology(shape)
    p = policy(shape, reservedCPUs=str(topo.cpu_ids[0]))
    devices = p.devices()
    assert [d["name"] for d in devices] == [device_name(c) for c in topo.cpu_ids[1:]]
    for device in devices:
        one = topo.cpus[int(device["name"][3:])]
        attributes = device["attributes"]
        assert attributes["resource.kubernetes.io/numaNode"] == {"int": one.node}
        assert attributes["package"] == {"int": one.package}
        assert attributes["core"] == {"int": one.core}
        assert attributes["siblings"] == {"string": format_cpu_list(one.siblings)}
        assert ("coreType" in attributes) == (one.core_type is not None)
        assert len(attributes) <= 32


def test_hybrid_core_types() -> None:
    types = {d["attributes"]["coreType"]["string"] for d in policy("hybrid-pe").devices()}
    assert types == {"performance", "efficiency"}


def test_allocate_exact_cpus() -> None:
    p = policy("two-socket-smt2-numa4")
    edits = p.allocate_claim(claim("a"), [cpu("cpu003"), cpu("cpu031", "other")])
    assert [g.cpus for g in p.grants("a")] == [{3}, {31}]
    assert edits[0]["env"][0] == "DRA_CPUSET_a_0=3"
    assert edits[1]["env"][0] == "DRA_CPUSET_a_1=31"
    assert p.allocate_claim(claim("a"), [cpu("cpu003"), cpu("cpu031", "other")]) == edits


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (["cpu999"], "unknown device cpu999"),
        (["cpu0"], "unknown device cpu0"),
        (["cpu000"], "unknown device cpu000"),  # reserved
        (["gpu001"], "unknown device gpu001"),
        (["cpu002"], "CPU 2 is held by claim a"),
        (["cpu004", "cpu004"], "CPU 4 is held by claim this claim"),
    ],
)
def test_refusals_leave_nothing(devices: list[str], message: str) -> None:
    p = policy("two-socket-smt2-numa4", reservedCPUs="0")
    p.allocate_claim(claim("a"), [cpu("cpu002")])
    with pytest.raises(PolicyError, match=message):
        p.allocate_claim(claim("b"), [cpu(d) for d in devices])
    assert p.claim_uids() == {"a"}


def test_reprepare_with_another_device_is_refused() -> None:
    p = policy("single-socket-nosmt")
    p.allocate_claim(claim("a"), [cpu("cpu001")])
    with pytest.raises(PolicyError, match="differs from what it was prepared with"):
        p.allocate_claim(claim("a"), [cpu("cpu002")])


# Whole physical cores (fullPhysicalCores) ------------------------------------------------


def cores_of(shape: str) -> dict[tuple[int, int, int], frozenset[int]]:
    """Every physical core of a fixture machine: its online threads."""
    return {c.core_key: c.siblings for c in topology(shape).cpus.values()}


@pytest.mark.parametrize("shape", SHAPES)
def test_whole_cores_one_device_per_core(shape: str) -> None:
    """Every core is a device with all its online threads: two on SMT2, one without SMT,
    either on a hybrid machine, what is online of a core with an offline sibling."""
    p = policy(shape, fullPhysicalCores=True)
    devices = p.devices()
    cores = sorted(cores_of(shape).values(), key=min)
    assert [d["name"] for d in devices] == [core_device_name(c) for c in cores]
    for device, threads in zip(devices, cores, strict=True):
        attributes = device["attributes"]
        assert attributes["threads"] == {"int": len(threads)}
        assert attributes["siblings"] == {"string": format_cpu_list(threads)}
        # The node's allocatable drops by every thread of the core.
        assert device["nodeAllocatableResources"] == {
            "cpu": {"mapping": {"deviceMultiplier": str(len(threads))}}
        }
        assert len(attributes) <= 32


def test_whole_cores_on_each_shape() -> None:
    """What each fixture's cores hold, as the kernel's siblings lists say."""
    threads = {
        shape: sorted(len(c) for c in cores_of(shape).values())
        for shape in ("two-socket-smt2-numa4", "single-socket-nosmt", "hybrid-pe", "offline-cpus")
    }
    assert threads["two-socket-smt2-numa4"] == [2] * 28
    assert threads["single-socket-nosmt"] == [1] * 8
    assert threads["hybrid-pe"] == [1] * 8 + [2] * 6  # E-cores, then P-cores with SMT
    assert threads["offline-cpus"] == [1, 1, 2, 2]  # two cores lost a thread to offlining


def test_a_reserved_thread_takes_its_whole_core_out_of_claims() -> None:
    """Reserving CPU 0 on SMT2 keeps its sibling from claims too: no claim may share a core
    with the system's threads. The sibling stays in the shared pool."""
    p = policy("two-socket-smt2-numa4", reservedCPUs="0", fullPhysicalCores=True)
    sibling = topology("two-socket-smt2-numa4").cpus[0].siblings - {0}
    assert sibling
    assert not sibling & p.grantable
    assert all(not core & (sibling | {0}) for core in p.whole_cores())
    assert len(p.devices()) == 27


def test_reserving_a_thread_of_every_core_is_refused() -> None:
    topo = topology("two-socket-smt2-numa4")
    one_each = {min(c.siblings) for c in topo.cpus.values()}
    with pytest.raises(PolicyError, match="split every core"):
        policy(
            "two-socket-smt2-numa4", reservedCPUs=format_cpu_list(one_each), fullPhysicalCores=True
        )


def test_a_claim_of_cores_gets_every_thread_of_each() -> None:
    p = policy("two-socket-smt2-numa4", fullPhysicalCores=True)
    first, second = p.whole_cores()[:2]
    edits = p.allocate_claim(
        claim("a"), [cpu(core_device_name(first)), cpu(core_device_name(second))]
    )
    assert [g.cpus for g in p.grants("a")] == [first, second]
    assert edits[0]["env"][0] == f"DRA_CPUSET_a_0={format_cpu_list(first)}"
    with pytest.raises(PolicyError, match=f"CPUs {format_cpu_list(first)} are held by claim a"):
        p.allocate_claim(claim("b"), [cpu(core_device_name(first))])
    with pytest.raises(PolicyError, match="unknown device cpu001"):
        p.allocate_claim(claim("b"), [cpu("cpu001")])
    assert p.claim_uids() == {"a"}


@pytest.mark.parametrize("whole", [False, True])
def test_the_workload_is_told_each_devices_attributes_and_cpus(whole: bool) -> None:
    p = policy("two-socket-smt2-numa4", fullPhysicalCores=whole)
    published = p.devices()[3:5]
    p.allocate_claim(claim("a"), [cpu(d["name"]) for d in published])
    described = p.result_attributes("a")
    topo = topology("two-socket-smt2-numa4")
    for device, grant, attributes in zip(published, p.grants("a"), described, strict=True):
        nodes = {topo.cpus[c].node for c in grant.cpus}
        assert attributes == {
            **device["attributes"],
            "cpus": {"string": format_cpu_list(grant.cpus)},
            "memoryNodes": {"string": format_cpu_list(nodes)},
        }
        assert len(grant.cpus) == (2 if whole else 1)


def test_a_claim_may_hold_more_than_32_cpus() -> None:
    """32 allocation results at most: 20 cores of two threads are 40 CPUs in one claim."""
    p = policy("two-socket-smt2-numa4", fullPhysicalCores=True)
    cores = p.whole_cores()[:20]
    p.allocate_claim(claim("big"), [cpu(core_device_name(c), f"r{i}") for i, c in enumerate(cores)])
    held = frozenset().union(*(g.cpus for g in p.grants("big")))
    assert len(held) == 40
    assert p.allocated_cpus() == held


def test_switching_whole_cores_is_refused_while_claims_are_held() -> None:
    """A claim holds what the configuration of its prepare offered: the other mode's devices
    would not be its own. Without claims the switch is free, and republishes."""
    host = Host()
    p = StaticPolicy(topology("single-socket-nosmt"), parse_config({"policy": "static"}))
    p.start(host, {})
    p.allocate_claim(claim("a"), [cpu("cpu001")])
    whole = parse_config({"policy": "static", "fullPhysicalCores": True})
    with pytest.raises(
        PolicyError, match="claim a holds CPUs 1 of device cpu001, which fullPhysicalCores on"
    ):
        p.reconfigure(whole)
    assert not p.config.full_physical_cores
    p.release_claim("a")
    p.reconfigure(whole)
    assert host.published[-1][0]["name"] == "core000"


def test_a_checkpoint_of_the_other_mode_is_refused_at_start() -> None:
    before = policy("single-socket-nosmt")
    before.allocate_claim(claim("a"), [cpu("cpu001")])
    after = StaticPolicy(
        topology("single-socket-nosmt"),
        parse_config({"policy": "static", "fullPhysicalCores": True}),
    )
    with pytest.raises(PolicyError, match="switch it back, or release the claims first"):
        after.start(Host(), before.snapshot())


def test_each_device_says_whether_its_cpu_is_isolated() -> None:
    """For a claim's CEL to ask for isolated CPUs (isolcpus=), or to avoid them."""
    topo = topology("two-socket-smt2-numa4")
    assert topo.isolated == {26, 27, 54, 55}
    for whole_cores in (False, True):
        host = Host()
        config = parse_config({"policy": "static", "fullPhysicalCores": whole_cores})
        StaticPolicy(topo, config).start(host, {})
        isolated = {
            d["name"] for d in host.published[-1] if d["attributes"]["isolated"] == {"bool": True}
        }
        assert isolated == (
            {"core026", "core027"} if whole_cores else {"cpu026", "cpu027", "cpu054", "cpu055"}
        )
