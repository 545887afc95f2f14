"""What the API server keeps of a device: the node-allocatable mappings as Kubernetes 1.36
spells them (KEP-5517's first alpha), list-valued attributes where the gate is off."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodedra.dra.probes import (
    LIST_TYPE_ATTRIBUTES,
    NODE_ALLOCATABLE_RESOURCES,
    PUBLISHED_FIELD_GATES,
)
from nodedra.policy import allocatable

NUMA_NODE = {
    "name": "numa0",
    "capacity": {"cpu": {"value": "14"}, "memory": {"value": "1Gi"}},
    "nodeAllocatableResources": {
        "cpu": allocatable.from_capacity("cpu"),
        "memory": allocatable.from_capacity("memory", "2"),
    },
}


def as_in_1_36(device: Mapping[str, Any]) -> object:
    spelling = NODE_ALLOCATABLE_RESOURCES.spelling_at(36)
    assert spelling is not None
    return spelling.rewrite(device)


def test_a_capacity_s_mapping_keeps_its_key_and_multiplies_by_allocation_multiplier() -> None:
    assert as_in_1_36(NUMA_NODE) == {
        "name": "numa0",
        "capacity": {"cpu": {"value": "14"}, "memory": {"value": "1Gi"}},
        "nodeAllocatableResourceMappings": {
            "cpu": {"capacityKey": "cpu", "allocationMultiplier": "1"},
            "memory": {"capacityKey": "memory", "allocationMultiplier": "2"},
        },
    }


def test_a_per_device_mapping_is_an_allocation_multiplier_alone() -> None:
    device = {"name": "cpu-3", "nodeAllocatableResources": {"cpu": allocatable.per_device()}}
    assert as_in_1_36(device) == {
        "name": "cpu-3",
        "nodeAllocatableResourceMappings": {"cpu": {"allocationMultiplier": "1"}},
    }


def test_overheads_have_no_1_36_spelling() -> None:
    """An entry with an overhead keeps its mapping; one with only an overhead goes, and a
    device left with no mapping has no field at all."""
    overhead = {"overhead": {"perPod": "100m"}}
    device = {
        "name": "d",
        "nodeAllocatableResources": {
            "cpu": {**allocatable.per_device("2"), **overhead},
            "memory": overhead,
        },
    }
    assert as_in_1_36(device) == {
        "name": "d",
        "nodeAllocatableResourceMappings": {"cpu": {"allocationMultiplier": "2"}},
    }
    only_overhead = {"name": "d", "nodeAllocatableResources": {"memory": overhead}}
    assert as_in_1_36(only_overhead) == {"name": "d"}


def test_only_1_36_spells_it_otherwise() -> None:
    assert NODE_ALLOCATABLE_RESOURCES.spelling_at(37) is None
    assert NODE_ALLOCATABLE_RESOURCES.spelling_at(36) is not None


def test_without_list_attributes_a_device_publishes_each_list_s_first_value() -> None:
    """What a device of the list form becomes where the API server has the gate off."""
    device = {
        "name": "cpudevnuma001",
        "attributes": {
            "resource.kubernetes.io/numaNode": {"ints": [1, 0]},
            "numaNode": {"int": 1},
        },
        "capacity": {"cpu": {"value": "14"}},
    }
    assert LIST_TYPE_ATTRIBUTES in PUBLISHED_FIELD_GATES
    assert LIST_TYPE_ATTRIBUTES.uses(device)
    assert LIST_TYPE_ATTRIBUTES.without(device) == {
        "name": "cpudevnuma001",
        "attributes": {
            "resource.kubernetes.io/numaNode": {"int": 1},
            "numaNode": {"int": 1},
        },
        "capacity": {"cpu": {"value": "14"}},
    }
    scalar = LIST_TYPE_ATTRIBUTES.without(device)
    assert not LIST_TYPE_ATTRIBUTES.uses(scalar)
