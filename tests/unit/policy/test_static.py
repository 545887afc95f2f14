"""The static policy: one device per grantable CPU."""

from __future__ import annotations

import pytest

from nodedra.dra import AllocationResult
from nodedra.policy import PolicyError, StaticPolicy, parse_config
from nodedra.policy.static import device_name
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
