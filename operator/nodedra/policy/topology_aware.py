"""The topology-aware policy: one device per NUMA node, CPUs and memory as consumable capacity.

A claim asks a NUMA node's device for so many CPUs and so much memory; the policy picks the
CPUs inside that node, whole cores first, and accounts the memory to the node. One device
per node keeps the slices small (a 2-socket machine publishes 2 to 8 devices, not hundreds)
and lets the scheduler place a claim by node with the standard numaNode attribute.

With ``fullPhysicalCores`` a device offers only the node's whole cores, and its ``cpu``
capacity is taken a core at a time (``validRange`` from one core in steps of one core): the
scheduler rounds a claim of 3 CPUs up to 4 on a machine with two threads a core, records 4,
and counts 4 against the node; the policy grants two whole cores. Where a node's cores differ
in size (a hybrid machine, an offline thread) the step is one CPU, and a count that whole
free cores cannot make exactly is refused at prepare.

A node's huge pages are offered beside its CPUs, one capacity per page size it has
(``hugepages_2Mi``, in bytes, a page at a time, none unless asked for), and only with
``nodeAllocatable``: the kubelet lets a container use huge pages only up to what its pod
accounts for, and a claim's huge pages are accounted for only through the device's mapping
to the node's ``hugepages-2Mi``. The memory offered is what the huge page pools leave.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple

from nodedra.lib.quantity import parse_quantity, whole_positive
from nodedra.topology.model import NUMANode

from . import allocatable, hugepages
from .base import NUMA_NODE_ATTRIBUTE, Attributes, Device, ExclusiveCPUPolicy
from .config import PolicyConfig
from .ledger import Grant, PolicyError
from .picker import pick_cpus

if TYPE_CHECKING:  # the policy needs the plugin's types, not the plugin (nor gRPC)
    from nodedra.dra.claims import AllocationResult

CPU_CAPACITY = "cpu"
MEMORY_CAPACITY = "memory"
MEMORY_STEP = 1 << 20
"""Memory is offered and consumed in whole MiB."""


def device_name(node: int) -> str:
    """The device of NUMA node ``node``."""
    return f"cpudevnuma{node:03d}"


class Wants(NamedTuple):
    """What a result consumed of its device."""

    cpus: int
    memory: int
    """Bytes."""
    hugepages: tuple[tuple[int, int], ...]
    """(page size, bytes), by page size, for the sizes consumed."""


class TopologyAwarePolicy(ExclusiveCPUPolicy):
    """Exclusive CPUs and NUMA-local memory, one device per NUMA node."""

    name = "topology-aware"

    def devices(self) -> list[Device]:
        """One device per NUMA node with grantable CPUs; memory-only nodes have none."""
        return [
            self._device(node)
            for node in sorted(self._topology.nodes.values(), key=lambda n: n.id)
            if node.cpus & self.grantable
        ]

    def offered_memory(self, node: NUMANode) -> int:
        """Bytes of ``node``'s memory claims may get, in MiB.

        MemTotal less the huge page pools (the kernel counts them in it, and they are no
        memory a process can get without asking for huge pages) and less the reserve.
        """
        offered = max(node.memory - hugepages.total_bytes(node) - self._config.reserved_memory, 0)
        return offered - offered % MEMORY_STEP

    def offered_hugepages(self, node: NUMANode) -> dict[int, int]:
        """Page size -> bytes of ``node``'s huge pages claims may get.

        None without the node-allocatable mapping, which is what lets a claim's container
        use them.
        """
        if not self._config.node_allocatable:
            return {}
        return hugepages.offered(node, self._config.reserved_hugepages)

    def _core_size(self, node: NUMANode) -> int:
        """CPUs a claim on ``node`` takes at a time.

        A core's with fullPhysicalCores where all of the node's cores are alike, else one.
        """
        sizes = {len(core) for core in self.whole_cores() if core <= node.cpus}
        return sizes.pop() if len(sizes) == 1 else 1

    def _device(self, node: NUMANode) -> Device:
        cpus = node.cpus & self.grantable
        step = self._core_size(node)
        pages = self.offered_hugepages(node)
        device: Device = {
            "name": device_name(node.id),
            "attributes": self._attributes_of(node),
            "capacity": {
                CPU_CAPACITY: _capacity_of(len(cpus), minimum=step, step=step),
                MEMORY_CAPACITY: _capacity_of(
                    self.offered_memory(node), minimum=0, step=MEMORY_STEP
                ),
                **{
                    hugepages.capacity_name(size): _capacity_of(amount, minimum=0, step=size)
                    for size, amount in pages.items()
                },
            },
            "allowMultipleAllocations": True,
        }
        if self._config.node_allocatable:  # what a claim consumes is the node's cpu and memory
            device[allocatable.FIELD] = allocatable.checked(
                {
                    "cpu": allocatable.from_capacity(CPU_CAPACITY),
                    "memory": allocatable.from_capacity(MEMORY_CAPACITY),
                    **{
                        hugepages.resource_name(size): allocatable.from_capacity(
                            hugepages.capacity_name(size)
                        )
                        for size in pages
                    },
                },
                device,
            )
        return device

    def _attributes(self, device: str) -> Attributes:
        return self._attributes_of(self._node(device))

    def _attributes_of(self, node: NUMANode) -> Attributes:
        first = self._topology.cpus[min(node.cpus & self.grantable)]
        attributes: Attributes = {
            NUMA_NODE_ATTRIBUTE: {"int": node.id},
            "package": {"int": first.package},
            "smtEnabled": {"bool": self._topology.smt_enabled},
        }
        if self._config.full_physical_cores:
            attributes["fullPhysicalCores"] = {"bool": True}
        return attributes

    def _node(self, device: str) -> NUMANode:
        for node in self._topology.nodes.values():
            if device_name(node.id) == device and node.cpus & self.grantable:
                return node
        raise PolicyError(f"unknown device {device}")

    def _wants(self, result: AllocationResult, node: NUMANode) -> Wants | None:
        """What the result consumed; None when it takes the whole device."""
        consumed = result.consumed_capacity
        if not consumed:
            return None
        cpu = _capacity(consumed, result.driver, CPU_CAPACITY)
        if cpu is None:
            raise PolicyError(f"consumed no {CPU_CAPACITY} (consumed: {dict(consumed)})")
        try:
            cpus = whole_positive(cpu, f"consumed {CPU_CAPACITY}")
        except ValueError as err:
            raise PolicyError(str(err)) from None
        offered = len(node.cpus & self.grantable)
        if cpus > offered:
            raise PolicyError(f"consumed {cpus} CPUs of {result.device}, which offers {offered}")
        raw = _capacity(consumed, result.driver, MEMORY_CAPACITY)
        memory = _whole_bytes(raw, MEMORY_CAPACITY) if raw is not None else 0
        pages = []
        for size in self.offered_hugepages(node):
            name = hugepages.capacity_name(size)
            raw = _capacity(consumed, result.driver, name)
            amount = _whole_bytes(raw, name) if raw is not None else 0
            if amount % size:
                raise PolicyError(f"consumed {name} {raw!r} is not a whole number of pages")
            if amount:
                pages.append((size, amount))
        return Wants(cpus, memory, tuple(pages))

    def _grant(self, result: AllocationResult, earlier: Sequence[Grant]) -> Grant:
        node = self._node(result.device)
        offered = node.cpus & self.grantable
        same_device = [g for g in earlier if g.device == result.device]
        free = offered - self._ledger.allocated_cpus().union(*(g.cpus for g in earlier))
        memory_free = (
            self.offered_memory(node)
            - self._ledger.memory_used(node.id)
            - sum(g.memory for g in same_device)
        )
        pages_free = {
            size: amount
            - self._ledger.hugepages_used(node.id, size)
            - sum(n for g in same_device for s, n in g.hugepages if s == size)
            for size, amount in self.offered_hugepages(node).items()
        }
        wants = self._wants(result, node)
        if wants is None:  # no consumable capacity: the claim has the whole device
            if (
                free != offered
                or memory_free != self.offered_memory(node)
                or pages_free != self.offered_hugepages(node)
            ):
                raise PolicyError(
                    f"takes the whole of {result.device}, but {len(offered - free)} of its "
                    "CPUs or some of its memory or huge pages are held by other claims"
                )
            # No huge pages: a device is taken whole only where the API server drops
            # consumable capacity, which (1.34, 1.35, gates off) is where it drops the
            # mappings too, and without them no container may use a claim's huge pages.
            return Grant(result.request, result.device, offered, memory_free, frozenset({node.id}))
        if wants.cpus > len(free):
            raise PolicyError(
                f"{wants.cpus} CPUs asked for, only {len(free)} free on {result.device}"
            )
        if wants.memory > memory_free:
            raise PolicyError(
                f"{wants.memory} bytes of memory asked for, only {memory_free} free on "
                f"{result.device}"
            )
        for size, amount in wants.hugepages:
            if amount > pages_free[size]:
                raise PolicyError(
                    f"{amount} bytes of {hugepages.capacity_name(size)} asked for, only "
                    f"{pages_free[size]} free on {result.device}"
                )
        picked = pick_cpus(self._topology, free, wants.cpus)
        if not self._whole(picked):
            raise PolicyError(
                f"{wants.cpus} CPUs are no whole number of the free cores of {result.device}"
            )
        return Grant(
            result.request,
            result.device,
            picked,
            wants.memory,
            frozenset({node.id}),
            wants.hugepages,
        )

    def _whole(self, cpus: frozenset[int]) -> bool:
        """Whether ``cpus`` are whole cores, or need not be (without fullPhysicalCores)."""
        return not self._config.full_physical_cores or all(
            core <= cpus for core in self.whole_cores() if core & cpus
        )

    def _granted_under(self, grant: Grant, config: PolicyConfig) -> bool:
        if not config.full_physical_cores:
            return True
        cores = {
            self._topology.cpus[cpu].siblings for cpu in grant.cpus if cpu in self._topology.cpus
        }
        return all(core <= grant.cpus for core in cores)

    def _matches(self, result: AllocationResult, grant: Grant) -> bool:
        wants = self._wants(result, self._node(result.device))
        return wants is None or wants == (len(grant.cpus), grant.memory, grant.hugepages)

    def _check_node_config(self, config: PolicyConfig) -> None:
        if not any(n.cpus - config.reserved_cpus for n in self._topology.nodes.values()):
            raise PolicyError("no NUMA node has CPUs left to offer")


def _capacity_of(value: int, *, minimum: int, step: int) -> dict[str, Any]:
    """A consumable capacity of ``value``, taken in ``step``s from ``minimum`` up.

    The API refuses a step whose first one already exceeds the capacity (a NUMA node with
    one grantable CPU, or no memory left after the reserve): then there is no step, and the
    one value the range holds is the capacity itself.
    """
    valid_range = {"min": str(minimum)}
    if minimum + step <= value:
        valid_range["step"] = str(step)
    return {
        "value": str(value),
        "requestPolicy": {"default": str(minimum), "validRange": valid_range},
    }


def _capacity(consumed: Any, driver: str, name: str) -> str | None:
    """A consumed capacity, keyed by its plain or its driver-qualified name."""
    value = consumed.get(name)
    if value is None:
        value = consumed.get(f"{driver}/{name}")
    return None if value is None else str(value)


def _whole_bytes(raw: str, name: str) -> int:
    try:
        value = parse_quantity(raw)
    except ValueError as err:
        raise PolicyError(f"consumed {name}: {err}") from None
    if value < 0 or value != Fraction(int(value)):
        raise PolicyError(f"consumed {name} {raw!r} is not a whole number of bytes")
    return int(value)
