"""The static policy: one device per grantable CPU, each claimed whole.

It needs no alpha API feature at all: a claim asks for so many devices (CPUs), picked by
the scheduler with CEL on their attributes (NUMA node, package, core, siblings), and gets
exactly those CPUs. Memory is not accounted; the environment names each CPU's NUMA node.

With ``fullPhysicalCores`` a device is a whole physical core (its online threads) instead:
a claim of N devices gets N cores, so no thread of a claimed core serves anyone else, and a
claim may hold up to 32 cores (64 CPUs with two threads a core) where 32 CPUs is the most
32 allocation results give otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from nodedra.topology.cpulist import format_cpu_list

from . import allocatable, consumed
from .base import ExclusiveCPUPolicy
from .config import PolicyConfig
from .ledger import Grant, PolicyError
from .numa_attribute import numa_attributes
from .protocol import Attributes, Device

if TYPE_CHECKING:  # the policy needs the plugin's types, not the plugin (nor gRPC)
    from nodedra.dra.claims import AllocationResult

_DEVICE = re.compile(r"cpu(\d{3,})")
_CORE_DEVICE = re.compile(r"core(\d{3,})")


def device_name(cpu: int) -> str:
    """The device of CPU ``cpu``."""
    return f"cpu{cpu:03d}"


def core_device_name(threads: frozenset[int]) -> str:
    """The device of the core whose online threads are ``threads``: named after the first."""
    return f"core{min(threads):03d}"


class StaticPolicy(ExclusiveCPUPolicy):
    """Exclusive CPUs, one device each (or whole cores, one device each)."""

    name = "static"

    def devices(self) -> list[Device]:
        """One device per grantable CPU (or whole core), in CPU order."""
        if self._config.full_physical_cores:
            return [self._device(core) for core in self.whole_cores()]
        return [self._device(frozenset({cpu})) for cpu in sorted(self.grantable)]

    def _device(self, cpus: frozenset[int]) -> Device:
        attributes = self._attributes_of(cpus)
        if self._config.full_physical_cores:
            name = core_device_name(cpus)
        else:
            name = device_name(min(cpus))
        device: Device = {"name": name, "attributes": attributes}
        if self._config.node_allocatable:  # a device is as many of the node's cpu as threads
            device[allocatable.FIELD] = allocatable.checked(
                {"cpu": allocatable.per_device(str(len(cpus)))}, device
            )
        return device

    def _attributes(self, device: str) -> Attributes:
        return self._attributes_of(self._cpus(device))

    def _attributes_of(self, cpus: frozenset[int]) -> Attributes:
        first = self._topology.cpus[min(cpus)]
        attributes: Attributes = {
            **numa_attributes(self._topology, first.node, self._config.numa_attribute),
            "package": {"int": first.package},
            "die": {"int": first.die},
            "core": {"int": first.core},
            "siblings": {"string": format_cpu_list(first.siblings)},
            # Isolated CPUs (isolcpus=) are for claims that ask for them, or avoid them.
            "isolated": {"bool": all(self._topology.cpus[c].isolated for c in cpus)},
        }
        if first.cluster is not None:
            attributes["cluster"] = {"int": first.cluster}
        if first.core_type is not None:
            attributes["coreType"] = {"string": first.core_type}
        if first.l3_cache is not None:  # for matchAttribute: CPUs sharing one L3 cache
            attributes["l3Cache"] = {"int": first.l3_cache}
        if self._config.full_physical_cores:
            attributes["threads"] = {"int": len(cpus)}
        return attributes

    def _cpus(self, device: str) -> frozenset[int]:
        """The CPUs of ``device``, one of ours under the configuration in force."""
        if self._config.full_physical_cores:
            for core in self.whole_cores():
                if core_device_name(core) == device:
                    return core
            raise PolicyError(f"unknown device {device}")
        match = _DEVICE.fullmatch(device)
        cpu = int(match.group(1)) if match else -1
        if cpu not in self.grantable or device_name(cpu) != device:
            raise PolicyError(f"unknown device {device}")
        return frozenset({cpu})

    def _grant(self, result: AllocationResult, earlier: Sequence[Grant]) -> Grant:
        cpus = self._cpus(result.device)
        _consumed_nothing(result)
        holders = self._ledger.holders(cpus)
        if holders or any(cpus & grant.cpus for grant in earlier):
            holder = ", ".join(sorted(set(holders.values()))) or "this claim"
            what = f"CPUs {format_cpu_list(cpus)} are" if len(cpus) > 1 else f"CPU {min(cpus)} is"
            raise PolicyError(f"{what} held by claim {holder}")
        nodes = frozenset(self._topology.cpus[cpu].node for cpu in cpus)
        return Grant(result.request, result.device, cpus, 0, nodes)

    def _mismatch(self, result: AllocationResult, grant: Grant) -> str | None:
        cpus = self._cpus(result.device)
        _consumed_nothing(result)
        if grant.cpus == cpus:
            return None
        return (
            f"differs from what it was prepared with: CPUs {format_cpu_list(grant.cpus)}, "
            f"the device has {format_cpu_list(cpus)} now"
        )

    def _granted_under(self, grant: Grant, config: PolicyConfig) -> bool:
        pattern = _CORE_DEVICE if config.full_physical_cores else _DEVICE
        return pattern.fullmatch(grant.device) is not None


def _consumed_nothing(result: AllocationResult) -> None:
    """Refuse a result that consumed capacity: a static device has none to give.

    The scheduler records consumed capacity only of devices that offer it, so such a result
    was never allocated from our devices as they are published.
    """
    unknown = consumed.not_understood(result.consumed_capacity, result.driver, ())
    if unknown:
        name, amount = unknown[0]
        raise PolicyError(
            f"consumed {name} {amount}, a capacity {result.device} does not offer (static "
            "devices offer none: each is claimed whole)"
        )
