"""What a device stands for of the node's own allocatable resources (KEP-5517).

A node's CPUs are in its ``status.allocatable.cpu`` and, published by nodedra, in its DRA
devices: without a word more the scheduler would promise them twice, to claims and to the
CPU requests of ordinary pods. A device's ``nodeAllocatableResources`` says which node
resource it (or a capacity it offers) is: the scheduler then takes what claims hold out of
what ordinary requests may use, and the kubelet adds it to the claiming pod's cgroups.

Mappings are checked here as the API server checks them, so that a policy's mistake fails
where it is made, not as a slice the server refuses forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from nodedra.lib.quantity import parse_quantity

from .ledger import PolicyError

FIELD = "nodeAllocatableResources"
"""The device field (resource.k8s.io/v1, feature gate DRANodeAllocatableResources)."""


def is_node_allocatable(name: str) -> bool:
    """Whether ``name`` is a node allocatable resource a device may map (not an extended one)."""
    return name in ("cpu", "memory") or name.startswith("hugepages-")


def from_capacity(capacity: str, multiplier: str = "1") -> dict[str, Any]:
    """A mapping: what a claim consumes of ``capacity``, times ``multiplier``."""
    return {"mapping": {"capacityKey": capacity, "capacityMultiplier": multiplier}}


def per_device(multiplier: str = "1") -> dict[str, Any]:
    """A mapping: ``multiplier`` for each device a claim is allocated."""
    return {"mapping": {"deviceMultiplier": multiplier}}


def checked(mappings: Mapping[str, Mapping[str, Any]], device: Mapping[str, Any]) -> dict[str, Any]:
    """``mappings`` for ``device``, as the API requires them; PolicyError naming what is wrong."""
    name = device.get("name")
    capacities = device.get("capacity") or {}
    for resource, entry in mappings.items():
        where = f"device {name}: {FIELD}[{resource}]"
        if not is_node_allocatable(resource):
            raise PolicyError(
                f"{where}: not a node allocatable resource (cpu, memory, hugepages-*)"
            )
        mapping, overhead = entry.get("mapping"), entry.get("overhead")
        if mapping is None and overhead is None:
            raise PolicyError(f"{where}: needs a mapping or an overhead")
        if mapping is not None:
            _check_mapping(mapping, capacities, where)
        if overhead is not None:
            _check_overhead(overhead, where)
    return {resource: dict(entry) for resource, entry in mappings.items()}


def _check_mapping(mapping: Mapping[str, Any], capacities: Mapping[str, Any], where: str) -> None:
    key, multiplier = mapping.get("capacityKey"), mapping.get("capacityMultiplier")
    per_device_multiplier = mapping.get("deviceMultiplier")
    if (key is None) == (per_device_multiplier is None):
        raise PolicyError(f"{where}: a mapping is either capacityKey or deviceMultiplier")
    if key is not None:
        if key not in capacities:
            raise PolicyError(f"{where}: capacityKey {key!r} is no capacity of the device")
        if multiplier is None:
            raise PolicyError(f"{where}: capacityKey needs a capacityMultiplier")
        _positive(multiplier, f"{where}: capacityMultiplier")
    else:
        _positive(per_device_multiplier, f"{where}: deviceMultiplier")


def _check_overhead(overhead: Mapping[str, Any], where: str) -> None:
    if overhead.get("perPod") is None and overhead.get("perContainer") is None:
        raise PolicyError(f"{where}: an overhead needs perPod or perContainer")
    for key in ("perPod", "perContainer"):
        if overhead.get(key) is not None and _quantity(overhead[key], f"{where}: {key}") < 0:
            raise PolicyError(f"{where}: {key} must not be negative")


def _positive(value: object, what: str) -> None:
    if _quantity(value, what) <= 0:
        raise PolicyError(f"{what} must be positive, not {value!r}")


def _quantity(value: object, what: str) -> Fraction:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise PolicyError(f"{what}: not a quantity: {value!r}")
    try:
        return parse_quantity(value)
    except ValueError as err:
        raise PolicyError(f"{what}: {err}") from None
