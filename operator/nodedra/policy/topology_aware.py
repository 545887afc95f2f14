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

Every capacity a result consumed must be one a device offers now, or be nothing: pages of a
size the node has none of now (a reboot emptied the pool, ``nodeAllocatable`` was switched
off, another allocator wrote the result) would reach no container, so such a claim is
refused, saying which capacity and why. Claims that hold pages keep them; a reconfiguration
that would offer fewer than they hold is refused, and what a boot took is named
(:meth:`TopologyAwarePolicy.shortfalls`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from nodedra.lib.quantity import binary_quantity, whole_positive
from nodedra.topology.model import NUMANode

from . import allocatable, consumed, hugepages, isolated, page_shortfalls
from .base import ExclusiveCPUPolicy
from .config import PolicyConfig
from .ledger import Grant, Ledger, PolicyError, Shortfall
from .numa_attribute import numa_attributes
from .protocol import Attributes, Device

if TYPE_CHECKING:  # the policy needs the plugin's types, not the plugin (nor gRPC)
    from nodedra.dra.claims import AllocationResult

CPU_CAPACITY = "cpu"
MEMORY_CAPACITY = "memory"
MEMORY_STEP = 1 << 20
"""Memory is offered and consumed in whole MiB."""


def device_name(node: int, only_isolated: bool = False) -> str:
    """The device of NUMA node ``node`` (of its isolated CPUs: see :mod:`.isolated`)."""
    return f"cpudevnuma{node:03d}{isolated.SUFFIX if only_isolated else ''}"


class Wants(NamedTuple):
    """What a result consumed of its device."""

    cpus: int
    memory: int
    """Bytes."""
    hugepages: tuple[tuple[int, int], ...]
    """(page size, bytes), by page size, for the sizes consumed."""

    def __str__(self) -> str:
        return _describe(self.cpus, self.memory, self.hugepages)


class TopologyAwarePolicy(ExclusiveCPUPolicy):
    """Exclusive CPUs and NUMA-local memory, one device per NUMA node."""

    name = "topology-aware"

    def devices(self) -> list[Device]:
        """One device per NUMA node with grantable CPUs; memory-only nodes have none.

        With ``isolatedCPUs: reserved``, a node's isolated CPUs are a second device.
        """
        return [
            self._device(node, only)
            for node in sorted(self._topology.nodes.values(), key=lambda n: n.id)
            for only in self._split(node)
        ]

    def _split(self, node: NUMANode) -> dict[bool, frozenset[int]]:
        """Whether a device of ``node`` offers isolated CPUs only -> the CPUs it offers."""
        return isolated.split(
            node.cpus & self.grantable, self._topology.isolated, self._config.isolated_cpus
        )

    def offered_memory(self, node: NUMANode) -> int:
        """Bytes of ``node``'s memory claims may get, in MiB.

        MemTotal less the huge page pools (the kernel counts them in it, and they are no
        memory a process can get without asking for huge pages) and less the reserve.
        """
        offered = max(node.memory - hugepages.total_bytes(node) - self._config.reserved_memory, 0)
        return offered - offered % MEMORY_STEP

    def offered_hugepages(
        self, node: NUMANode, config: PolicyConfig | None = None
    ) -> dict[int, int]:
        """Page size -> bytes of ``node``'s huge pages claims may get (under ``config``).

        None without the node-allocatable mapping, which is what lets a claim's container
        use them.
        """
        config = config or self._config
        if not config.node_allocatable:
            return {}
        return hugepages.offered(node, config.reserved_hugepages)

    def _core_size(self, node: NUMANode) -> int:
        """CPUs a claim on ``node`` takes at a time.

        A core's with fullPhysicalCores where all of the node's cores are alike, else one.
        """
        sizes = {len(core) for core in self.whole_cores() if core <= node.cpus}
        return sizes.pop() if len(sizes) == 1 else 1

    def _memory_of(self, node: NUMANode, only_isolated: bool) -> tuple[int, dict[int, int]]:
        """Bytes of memory and huge pages (page size -> bytes) a device of ``node`` offers.

        A device of isolated CPUs offers none: the node's are offered once, by its other one.
        """
        if only_isolated:
            return 0, {}
        return self.offered_memory(node), self.offered_hugepages(node)

    def _device(self, node: NUMANode, only_isolated: bool) -> Device:
        cpus = self._split(node)[only_isolated]
        step = self._core_size(node)
        memory, pages = self._memory_of(node, only_isolated)
        capacity = {CPU_CAPACITY: _capacity_of(len(cpus), minimum=step, step=step)}
        if not only_isolated:
            capacity[MEMORY_CAPACITY] = _capacity_of(memory, minimum=0, step=MEMORY_STEP)
        for size, amount in pages.items():
            capacity[hugepages.capacity_name(size)] = _capacity_of(amount, minimum=0, step=size)
        device: Device = {
            "name": device_name(node.id, only_isolated),
            "attributes": self._attributes_of(node, only_isolated),
            "capacity": capacity,
            "allowMultipleAllocations": True,
        }
        if self._config.node_allocatable:  # what a claim consumes is the node's cpu and memory
            mappings = {"cpu": allocatable.from_capacity(CPU_CAPACITY)}
            if not only_isolated:
                mappings["memory"] = allocatable.from_capacity(MEMORY_CAPACITY)
            for size in pages:
                mappings[hugepages.resource_name(size)] = allocatable.from_capacity(
                    hugepages.capacity_name(size)
                )
            device[allocatable.FIELD] = allocatable.checked(mappings, device)
        return device

    def _attributes(self, device: str) -> Attributes:
        return self._attributes_of(*self._node(device))

    def _attributes_of(self, node: NUMANode, only_isolated: bool) -> Attributes:
        first = self._topology.cpus[min(self._split(node)[only_isolated])]
        attributes: Attributes = {
            **numa_attributes(self._topology, node.id, self._config.numa_attribute),
            "package": {"int": first.package},
            "smtEnabled": {"bool": self._topology.smt_enabled},
        }
        if self._config.full_physical_cores:
            attributes["fullPhysicalCores"] = {"bool": True}
        if self._config.isolated_cpus == isolated.RESERVED:
            attributes[isolated.ATTRIBUTE] = {"bool": only_isolated}
        return attributes

    def _node(self, device: str) -> tuple[NUMANode, bool]:
        """The NUMA node of ``device``, and whether it offers the node's isolated CPUs only."""
        for node in self._topology.nodes.values():
            for only in self._split(node):
                if device_name(node.id, only) == device:
                    return node, only
        raise PolicyError(f"unknown device {device}")

    def _wants(self, result: AllocationResult, node: NUMANode, only_isolated: bool) -> Wants | None:
        """What the result consumed; None when it takes the whole device.

        PolicyError for anything consumed that the device does not offer now.
        """
        used = result.consumed_capacity
        if not used:
            return None
        offered_pages = self._memory_of(node, only_isolated)[1]
        understood = {CPU_CAPACITY, *map(hugepages.capacity_name, offered_pages)}
        if not only_isolated:
            understood.add(MEMORY_CAPACITY)
        unknown = consumed.not_understood(used, result.driver, understood)
        if unknown:
            raise PolicyError(self._not_offered(result, node, *unknown[0]))
        cpu = consumed.value(used, result.driver, CPU_CAPACITY)
        if cpu is None:
            raise PolicyError(f"consumed no {CPU_CAPACITY} (consumed: {dict(used)})")
        try:
            cpus = whole_positive(cpu, f"consumed {CPU_CAPACITY}")
        except ValueError as err:
            raise PolicyError(str(err)) from None
        offered = len(self._split(node)[only_isolated])
        if cpus > offered:
            raise PolicyError(f"consumed {cpus} CPUs of {result.device}, which offers {offered}")
        raw = consumed.value(used, result.driver, MEMORY_CAPACITY)
        memory = consumed.whole_bytes(raw, MEMORY_CAPACITY) if raw is not None else 0
        pages = []
        for size in offered_pages:
            name = hugepages.capacity_name(size)
            raw = consumed.value(used, result.driver, name)
            amount = consumed.whole_bytes(raw, name) if raw is not None else 0
            if amount % size:
                raise PolicyError(f"consumed {name} {raw!r} is not a whole number of pages")
            if amount:
                pages.append((size, amount))
        return Wants(cpus, memory, tuple(pages))

    def _not_offered(self, result: AllocationResult, node: NUMANode, name: str, amount: str) -> str:
        """Why ``amount`` consumed of capacity ``name`` cannot be granted: what and why."""
        size = hugepages.page_size(consumed.plain_name(name, result.driver) or "")
        if size is None:
            return f"consumed {name} {amount}, a capacity {result.device} does not offer"
        # A size the node has pages of is offered, with nodeAllocatable: why_short says
        # which of the two it is, neither depends on the amount or the reservation.
        why = hugepages.why_short(node, size, 1, self._config.node_allocatable, {})
        return (
            f"consumed {name} {amount}, but {result.device} offers no "
            f"{binary_quantity(size)} huge pages now: {why}"
        )

    def _grant(self, result: AllocationResult, earlier: Sequence[Grant]) -> Grant:
        node, only_isolated = self._node(result.device)
        offered = self._split(node)[only_isolated]
        memory, pages = self._memory_of(node, only_isolated)
        same_node = [g for g in earlier if g.mems == {node.id}]
        free = offered - self._ledger.allocated_cpus().union(*(g.cpus for g in earlier))
        memory_free = (  # none on a device of isolated CPUs, whatever the node's others hold
            memory - self._ledger.memory_used(node.id) - sum(g.memory for g in same_node)
            if not only_isolated
            else 0
        )
        pages_free = {
            size: amount
            - self._ledger.hugepages_used(node.id, size)
            - sum(n for g in same_node for s, n in g.hugepages if s == size)
            for size, amount in pages.items()
        }
        wants = self._wants(result, node, only_isolated)
        if wants is None:  # no consumable capacity: the claim has the whole device
            if free != offered or memory_free != memory or pages_free != pages:
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
            if amount > pages_free[size]:  # below 0 where claims hold more than a pool has
                raise PolicyError(
                    f"{amount} bytes of {hugepages.capacity_name(size)} asked for, only "
                    f"{max(pages_free[size], 0)} free on {result.device}"
                )
        try:
            picked: frozenset[int] | None = isolated.pick(
                self._topology,
                free,
                wants.cpus,
                whole_cores=self._config.full_physical_cores,
                mode=self._config.isolated_cpus,
            )
        except ValueError:  # only with whole cores: fewer CPUs of them than free CPUs
            picked = None
        if picked is None or not self._whole(picked):
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

    def _check_held(self, ledger: Ledger, config: PolicyConfig) -> None:
        super()._check_held(ledger, config)
        isolated.check_held(self._topology, ledger, config.isolated_cpus)

    def _mismatch(self, result: AllocationResult, grant: Grant) -> str | None:
        node, only_isolated = self._node(result.device)
        offered = self._memory_of(node, only_isolated)[1]
        for size, amount in grant.hugepages:  # what changed is the device, not the claim
            if size not in offered:
                why = hugepages.why_short(node, size, amount, self._config.node_allocatable, {})
                return (
                    f"holds {binary_quantity(amount)} of {hugepages.capacity_name(size)}, "
                    f"which {result.device} no longer offers: {why}"
                )
        wants = self._wants(result, node, only_isolated)
        held = Wants(len(grant.cpus), grant.memory, grant.hugepages)
        if wants is None or wants == held:
            return None
        return f"differs from what it was prepared with: {held}; it asks for {wants}"

    def shortfalls(self) -> list[Shortfall]:
        """Claims holding huge pages their devices do not offer now, one entry per claim."""
        return self._shortfalls(self._ledger, self._config)

    def _shortfalls(self, ledger: Ledger, config: PolicyConfig) -> list[Shortfall]:
        nodes = self._topology.nodes
        return page_shortfalls.find(ledger, nodes, self.offered_hugepages, config, device_name)

    def _check_offered(self, config: PolicyConfig) -> None:
        why = page_shortfalls.worse(self.shortfalls(), self._shortfalls(self._ledger, config))
        if why is not None:
            raise PolicyError(why)

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


def _describe(cpus: int, memory: int, pages: Sequence[tuple[int, int]]) -> str:
    """``1 CPUs, 0 bytes of memory, 64Mi of hugepages_2Mi``: a grant, or what a result asks."""
    held = [f"{cpus} CPUs", f"{memory} bytes of memory"]
    held.extend(f"{binary_quantity(n)} of {hugepages.capacity_name(s)}" for s, n in pages)
    return ", ".join(held)
