"""The node-allocatable mappings of the policies' devices, and their checks."""

from __future__ import annotations

from typing import Any

import pytest

from nodedra.policy import ConfigError, PolicyError, make_policy, parse_config
from nodedra.policy.allocatable import FIELD, checked, from_capacity, per_device
from tests.unit.policy.conftest import topology

SHAPE = "two-socket-smt2-numa4"


def devices(policy: str, **config: Any) -> list[dict[str, Any]]:
    return make_policy(topology(SHAPE), parse_config({"policy": policy, **config})).devices()


def test_topology_aware_maps_its_cpu_memory_and_huge_page_capacities() -> None:
    """Each NUMA node's huge pages, of the sizes it has (node 3 has none), one to one."""
    mapped = {
        d["name"]: sorted(r for r in d[FIELD] if r.startswith("hugepages-"))
        for d in devices("topology-aware")
    }
    assert mapped == {
        "cpudevnuma000": ["hugepages-1Gi", "hugepages-2Mi"],
        "cpudevnuma001": ["hugepages-2Mi"],
        "cpudevnuma002": ["hugepages-1Gi"],
        "cpudevnuma003": [],
    }
    for device in devices("topology-aware"):
        assert {r: m for r, m in device[FIELD].items() if not r.startswith("hugepages-")} == {
            "cpu": {"mapping": {"capacityKey": "cpu", "capacityMultiplier": "1"}},
            "memory": {"mapping": {"capacityKey": "memory", "capacityMultiplier": "1"}},
        }
        for resource in mapped[device["name"]]:
            size = resource.removeprefix("hugepages-")
            assert device[FIELD][resource] == {
                "mapping": {"capacityKey": f"hugepages_{size}", "capacityMultiplier": "1"}
            }


def test_static_maps_one_cpu_per_device() -> None:
    for device in devices("static"):
        assert device[FIELD] == {"cpu": {"mapping": {"deviceMultiplier": "1"}}}


@pytest.mark.parametrize("policy", ["topology-aware", "static"])
def test_no_mappings_when_turned_off(policy: str) -> None:
    assert not any(FIELD in d for d in devices(policy, nodeAllocatable=False))


DEVICE = {"name": "d", "capacity": {"cpu": {"value": "4"}}}


@pytest.mark.parametrize(
    ("mappings", "message"),
    [
        ({"example.com/gpus": per_device()}, "not a node allocatable resource"),
        ({"pods": per_device()}, "not a node allocatable resource"),
        ({"cpu": {}}, "needs a mapping or an overhead"),
        ({"cpu": from_capacity("cores")}, "capacityKey 'cores' is no capacity"),
        ({"cpu": {"mapping": {"capacityKey": "cpu"}}}, "needs a capacityMultiplier"),
        ({"cpu": from_capacity("cpu", "0")}, "capacityMultiplier must be positive"),
        ({"cpu": per_device("-1")}, "deviceMultiplier must be positive"),
        (
            {
                "cpu": {
                    "mapping": {
                        "capacityKey": "cpu",
                        "capacityMultiplier": "1",
                        **per_device()["mapping"],
                    }
                }
            },
            "either capacityKey or deviceMultiplier",
        ),
        ({"memory": {"overhead": {}}}, "needs perPod or perContainer"),
        ({"memory": {"overhead": {"perPod": "-1Mi"}}}, "perPod must not be negative"),
        ({"memory": {"overhead": {"perContainer": "lots"}}}, "not a quantity"),
    ],
)
def test_mappings_are_checked_as_the_api_does(mappings: Any, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        checked(mappings, DEVICE)


def test_good_mappings_pass() -> None:
    good = {
        "cpu": from_capacity("cpu", "2"),
        "memory": {"overhead": {"perPod": "64Mi", "perContainer": "0"}},
        "hugepages-2Mi": per_device("4"),
    }
    assert checked(good, DEVICE) == good


def test_the_switch_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match="nodeAllocatable: must be true or false"):
        parse_config({"nodeAllocatable": "yes"})
