"""The static policy: one device per grantable CPU, each claimed whole.

It needs no alpha API feature at all: a claim asks for so many devices (CPUs), picked by
the scheduler with CEL on their attributes (NUMA node, package, core, siblings), and gets
exactly those CPUs. Memory is not accounted; the environment names each CPU's NUMA node.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from nodedra.topology.cpulist import format_cpu_list

from . import allocatable
from .base import NUMA_NODE_ATTRIBUTE, Device, ExclusiveCPUPolicy
from .ledger import Grant, PolicyError

if TYPE_CHECKING:  # the policy needs the plugin's types, not the plugin (nor gRPC)
    from nodedra.dra.claims import AllocationResult

_DEVICE = re.compile(r"cpu(\d{3,})")


def device_name(cpu: int) -> str:
    """The device of CPU ``cpu``."""
    return f"cpu{cpu:03d}"


class StaticPolicy(ExclusiveCPUPolicy):
    """Exclusive CPUs, one device each."""

    name = "static"

    def devices(self) -> list[Device]:
        """One device per grantable CPU, in CPU order."""
        devices = []
        for cpu_id in sorted(self.grantable):
            cpu = self._topology.cpus[cpu_id]
            attributes: dict[str, dict[str, object]] = {
                NUMA_NODE_ATTRIBUTE: {"int": cpu.node},
                "package": {"int": cpu.package},
                "die": {"int": cpu.die},
                "core": {"int": cpu.core},
                "siblings": {"string": format_cpu_list(cpu.siblings)},
            }
            if cpu.cluster is not None:
                attributes["cluster"] = {"int": cpu.cluster}
            if cpu.core_type is not None:
                attributes["coreType"] = {"string": cpu.core_type}
            device: Device = {"name": device_name(cpu_id), "attributes": attributes}
            if self._config.node_allocatable:  # each CPU device is one of the node's cpu
                device[allocatable.FIELD] = allocatable.checked(
                    {"cpu": allocatable.per_device()}, device
                )
            devices.append(device)
        return devices

    def _cpu(self, result: AllocationResult) -> int:
        match = _DEVICE.fullmatch(result.device)
        cpu = int(match.group(1)) if match else -1
        if cpu not in self.grantable or device_name(cpu) != result.device:
            raise PolicyError(f"unknown device {result.device}")
        return cpu

    def _grant(self, result: AllocationResult, taken: frozenset[int], memory: int) -> Grant:
        cpu = self._cpu(result)
        holder = self._ledger.holders([cpu])
        if holder or cpu in taken:
            raise PolicyError(f"CPU {cpu} is held by claim {holder.get(cpu, 'this claim')}")
        node = self._topology.cpus[cpu].node
        return Grant(result.request, result.device, frozenset({cpu}), 0, frozenset({node}))

    def _matches(self, result: AllocationResult, grant: Grant) -> bool:
        return grant.cpus == {self._cpu(result)}
