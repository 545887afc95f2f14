"""What a node has: its online CPUs, how they group into cores and packages, its NUMA nodes.

The model is plain immutable values, built once by a reader (:mod:`nodedra.topology.sysfs`)
and then shared freely: the driver publishes devices from it and checks allocations against
it, and neither may change what the other sees. Mappings are therefore held as
``MappingProxyType`` over private copies, and each class checks in ``__post_init__`` the
invariants its users rely on, so that a hand-built topology (in a test, say) cannot be one
the kernel would never report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, TypeAlias, TypeVar

from nodedra.topology.cpulist import format_cpu_list

CoreType: TypeAlias = Literal["performance", "efficiency"]
"""The kind of core of a CPU on a hybrid machine (Intel P-cores and E-cores)."""

CoreKey: TypeAlias = tuple[int, int, int]
"""(package, die, core id): a physical core, machine-wide."""

JSONValue: TypeAlias = bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"] | None
"""A value ``json.dumps`` writes and ``json.loads`` gives back unchanged."""

_Key = TypeVar("_Key", int, CoreKey)

_CORE_TYPES: frozenset[str | None] = frozenset({"performance", "efficiency", None})


def _frozen_mapping(items: Mapping[int, int]) -> Mapping[int, int]:
    """A read-only copy of ``items`` in key order, so equal mappings also print alike."""
    return MappingProxyType(dict(sorted(items.items())))


@dataclass(frozen=True, slots=True)
class CPU:
    """One online logical CPU (a hardware thread) and where it sits."""

    id: int
    """The kernel's number for the CPU, N of ``cpuN``."""
    package: int
    """The physical package (socket). Some VMs report -1; readers store 0 for that."""
    die: int
    """The die within the package; 0 where the kernel does not report dies."""
    cluster: int | None
    """The cluster (e.g. E-cores sharing an L2), or None where the kernel reports none."""
    core: int
    """sysfs ``core_id``: unique only within a package and die, see :attr:`core_key`."""
    node: int
    """The NUMA node the CPU belongs to."""
    siblings: frozenset[int]
    """The online hardware threads of this CPU's core, this CPU included."""
    core_type: CoreType | None
    """"performance" or "efficiency" on a hybrid machine, else None."""
    isolated: bool
    """Whether the kernel isolated the CPU from the scheduler (``isolcpus=``)."""
    l3_cache: int | None = None
    """The kernel's id of the L3 cache the CPU shares with others, or None where the kernel
    shows none (many VMs, older kernels without cache ids and nothing to stand in for one)."""

    def __post_init__(self) -> None:
        """Freeze ``siblings`` and refuse a CPU that is not among its own siblings."""
        object.__setattr__(self, "siblings", frozenset(self.siblings))
        if self.id not in self.siblings:
            raise ValueError(f"cpu {self.id} is not among its siblings {sorted(self.siblings)}")
        if self.core_type not in _CORE_TYPES:
            raise ValueError(f"cpu {self.id} has an unknown core type {self.core_type!r}")

    @property
    def core_key(self) -> CoreKey:
        """The physical core of this CPU: (package, die, core), unique machine-wide.

        ``core`` alone is not: every package numbers its cores from 0 again.
        """
        return (self.package, self.die, self.core)


@dataclass(frozen=True, slots=True)
class NUMANode:
    """A NUMA node: memory with the CPUs closest to it. A memory-only node has no CPUs."""

    id: int
    cpus: frozenset[int]
    """The node's online CPUs."""
    memory: int
    """Total memory in bytes; 0 where the kernel does not say (no NUMA support)."""
    distances: Mapping[int, int]
    """Node id -> relative access distance from this node (10 is local), as the SLIT says."""
    hugepages: Mapping[int, int]
    """Huge page size in bytes -> pages reserved on this node, for every size the kernel has."""

    def __post_init__(self) -> None:
        """Freeze the collections and refuse negative sizes."""
        object.__setattr__(self, "cpus", frozenset(self.cpus))
        object.__setattr__(self, "distances", _frozen_mapping(self.distances))
        object.__setattr__(self, "hugepages", _frozen_mapping(self.hugepages))
        if self.memory < 0:
            raise ValueError(f"node {self.id} has negative memory {self.memory}")
        if any(size <= 0 or count < 0 for size, count in self.hugepages.items()):
            raise ValueError(f"node {self.id} has bad huge pages {dict(self.hugepages)}")

    def __hash__(self) -> int:
        """Hash by value, as a frozen dataclass would if mappings were hashable."""
        return hash(
            (
                self.id,
                self.cpus,
                self.memory,
                tuple(self.distances.items()),
                tuple(self.hugepages.items()),
            )
        )


@dataclass(frozen=True, slots=True)
class Topology:
    """The CPUs and NUMA nodes of a machine, as one consistent snapshot."""

    cpus: Mapping[int, CPU]
    """Online CPUs by id. Offline CPUs have no topology to report and are not here."""
    nodes: Mapping[int, NUMANode]
    """NUMA nodes by id, memory-only ones included."""
    offline: frozenset[int]
    """CPUs the kernel lists as offline (possible but not running)."""
    isolated: frozenset[int]
    """CPUs isolated from the scheduler, as the kernel lists them (may include offline ones)."""

    def __post_init__(self) -> None:
        """Freeze the collections and check that CPUs, nodes and lists agree."""
        object.__setattr__(self, "cpus", MappingProxyType(dict(sorted(self.cpus.items()))))
        object.__setattr__(self, "nodes", MappingProxyType(dict(sorted(self.nodes.items()))))
        object.__setattr__(self, "offline", frozenset(self.offline))
        object.__setattr__(self, "isolated", frozenset(self.isolated))
        self._check()

    def _check(self) -> None:
        online = frozenset(self.cpus)
        for node_id, node in self.nodes.items():
            if node.id != node_id:
                raise ValueError(f"node {node.id} is filed under id {node_id}")
        for cpu_id, cpu in self.cpus.items():
            if cpu.id != cpu_id:
                raise ValueError(f"cpu {cpu.id} is filed under id {cpu_id}")
            if cpu.node not in self.nodes or cpu_id not in self.nodes[cpu.node].cpus:
                raise ValueError(f"cpu {cpu_id} claims node {cpu.node}, which does not list it")
            if not cpu.siblings <= online:
                raise ValueError(f"cpu {cpu_id} has siblings that are not online CPUs")
            if cpu.isolated != (cpu_id in self.isolated):
                raise ValueError(f"cpu {cpu_id} disagrees with the isolated list")
        for node_id, node in self.nodes.items():
            strays = sorted(
                c for c in node.cpus if c not in self.cpus or self.cpus[c].node != node_id
            )
            if strays:
                raise ValueError(f"node {node_id} lists cpus {strays} that are not its own")
        if online & self.offline:
            raise ValueError(f"cpus {sorted(online & self.offline)} are both online and offline")

    def __hash__(self) -> int:
        """Hash by value, as a frozen dataclass would if mappings were hashable."""
        return hash(
            (
                tuple(self.cpus.items()),
                tuple(self.nodes.items()),
                self.offline,
                self.isolated,
            )
        )

    @property
    def cpu_ids(self) -> tuple[int, ...]:
        """The online CPU ids, ascending."""
        return tuple(self.cpus)

    def node_of(self, cpu: int) -> NUMANode:
        """The NUMA node of online CPU ``cpu``.

        Raises:
            KeyError: ``cpu`` is not an online CPU.
        """
        try:
            return self.nodes[self.cpus[cpu].node]
        except KeyError:
            raise KeyError(f"cpu {cpu} is not an online CPU") from None

    def cores(self) -> Mapping[CoreKey, tuple[int, ...]]:
        """Physical core -> its online CPUs (hardware threads), both ascending."""
        return _group({cpu.id: cpu.core_key for cpu in self.cpus.values()})

    def l3_caches(self) -> Mapping[int, tuple[int, ...]]:
        """L3 cache id -> the online CPUs sharing it, both ascending.

        CPUs without a known L3 cache are in none.
        """
        return _group(
            {cpu.id: cpu.l3_cache for cpu in self.cpus.values() if cpu.l3_cache is not None}
        )

    def packages(self) -> Mapping[int, tuple[int, ...]]:
        """Package (socket) id -> its online CPUs, both ascending."""
        return _group({cpu.id: cpu.package for cpu in self.cpus.values()})

    @property
    def threads_per_core(self) -> int:
        """The most online hardware threads any core has (0 for no CPUs at all).

        The maximum, not a common value: cores can differ, as P-cores with two threads do
        from E-cores with one, or a core whose sibling was taken offline.
        """
        return max((len(cpus) for cpus in self.cores().values()), default=0)

    @property
    def smt_enabled(self) -> bool:
        """Whether any core runs more than one online hardware thread."""
        return self.threads_per_core > 1

    def to_json(self) -> dict[str, JSONValue]:
        """The topology as plain JSON values: ``{"cpus": [...], "numa_nodes": [...]}``.

        This is what ``nodedra topology --json`` prints, so everything is sorted and every
        CPU set appears twice, as a list of ints for programs and as a kernel-style
        ``cpulist`` string for people comparing it with sysfs. Mapping keys become strings
        because JSON object keys are strings.
        """
        cpus: list[JSONValue] = [
            {
                "id": cpu.id,
                "package": cpu.package,
                "die": cpu.die,
                "cluster": cpu.cluster,
                "core": cpu.core,
                "node": cpu.node,
                "siblings": _ints(cpu.siblings),
                "siblings_cpulist": format_cpu_list(cpu.siblings),
                "core_type": cpu.core_type,
                "isolated": cpu.isolated,
                "l3_cache": cpu.l3_cache,
            }
            for cpu in self.cpus.values()
        ]
        nodes: list[JSONValue] = [
            {
                "id": node.id,
                "cpus": _ints(node.cpus),
                "cpulist": format_cpu_list(node.cpus),
                "memory": node.memory,
                "distances": {str(other): d for other, d in node.distances.items()},
                "hugepages": {str(size): n for size, n in node.hugepages.items()},
            }
            for node in self.nodes.values()
        ]
        return {"cpus": cpus, "numa_nodes": nodes}


def _ints(values: frozenset[int]) -> list[JSONValue]:
    return list(sorted(values))


def _group(keys: Mapping[int, _Key]) -> Mapping[_Key, tuple[int, ...]]:
    """CPU id -> key, turned into key -> ascending CPU ids, in ascending key order."""
    groups: dict[_Key, list[int]] = {}
    for cpu_id, key in keys.items():
        groups.setdefault(key, []).append(cpu_id)
    return MappingProxyType({key: tuple(sorted(groups[key])) for key in sorted(groups)})
