"""Reading one online CPU's place (package, die, cluster, core, threads) and the core types.

Kernels and machines differ in what they show under ``cpuN/topology``, and this module is
where those differences are absorbed: ``die_id`` exists only on x86 and s390 (elsewhere, and
before Linux 5.2, every CPU is on die 0); ``cluster_id`` only since 5.16 and only where the
architecture has clusters, -1 meaning "none"; ``core_cpus_list`` only since 5.9, before which
``thread_siblings_list`` held the same list; and some hypervisors leave the package id at
-1, which we read as package 0 since such a VM has one package as far as anyone can tell.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from nodedra.topology.errors import TopologyError
from nodedra.topology.files import read_cpus, read_int, read_optional_cpus, read_optional_int
from nodedra.topology.model import CPU, CoreType

CORE_TYPE_PMUS: tuple[tuple[str, CoreType], ...] = (
    ("cpu_core", "performance"),
    ("cpu_atom", "efficiency"),
    ("cpu_lowpower", "efficiency"),
)
"""The perf PMUs of Intel hybrid CPUs under ``devices/`` and the kind of core each covers.

The kernel registers one PMU per kind of core and lists that kind's CPUs in its ``cpus``
file; no other sysfs file says which CPUs are P-cores. ``cpu_lowpower`` (the low-power
E-cores of Meteor Lake and later) counts as "efficiency": they are E-cores, on another tile.
"""


def read_core_types(devices: Path) -> Mapping[int, CoreType]:
    """CPU id -> core type from the hybrid PMUs under ``devices``; empty on other machines."""
    core_types: dict[int, CoreType] = {}
    for pmu, core_type in CORE_TYPE_PMUS:
        path = devices / pmu / "cpus"
        for cpu in sorted(read_optional_cpus(path) or ()):
            if cpu in core_types:
                raise TopologyError(path, f"cpu {cpu} is also listed by another hybrid PMU")
            core_types[cpu] = core_type
    return core_types


def read_cpu(
    cpu_dir: Path,
    cpu_id: int,
    *,
    online: frozenset[int],
    node: int,
    core_type: CoreType | None,
    isolated: bool,
) -> CPU:
    """The online CPU ``cpu_id`` from ``<cpu_dir>/cpu<cpu_id>/topology``.

    The caller supplies what other files say about the CPU (its node, core type, whether it
    is isolated). Siblings are cut down to ``online`` CPUs: the kernel drops an offlined
    thread from its siblings' lists on x86, but not on every architecture.
    """
    topology = cpu_dir / f"cpu{cpu_id}" / "topology"
    package = read_int(topology / "physical_package_id")
    die = read_optional_int(topology / "die_id")
    cluster = read_optional_int(topology / "cluster_id")
    core = read_int(topology / "core_id")
    siblings = read_optional_cpus(topology / "core_cpus_list")
    if siblings is None:
        siblings = read_cpus(topology / "thread_siblings_list")
    return CPU(
        id=cpu_id,
        package=max(package, 0),
        die=0 if die is None else max(die, 0),
        cluster=None if cluster is None or cluster < 0 else cluster,
        core=core,
        node=node,
        siblings=(siblings & online) | {cpu_id},
        core_type=core_type,
        isolated=isolated,
        l3_cache=read_l3_cache(cpu_dir / f"cpu{cpu_id}" / "cache"),
    )


def read_l3_cache(cache_dir: Path) -> int | None:
    """The id of the level 3 cache under ``cache_dir`` (``cpuN/cache``), None without one.

    The level is read from each ``indexN/level`` rather than taken from the index, which
    differs between machines. Kernels before 4.16 have no ``id`` file: there the lowest CPU
    sharing the cache names it, which is as unique and the same for every CPU sharing it.
    """
    if not cache_dir.is_dir():
        return None
    for index in sorted(cache_dir.glob("index[0-9]*")):
        if read_optional_int(index / "level") != 3:
            continue
        cache_id = read_optional_int(index / "id")
        if cache_id is not None:
            return cache_id
        sharing = read_optional_cpus(index / "shared_cpu_list")
        if sharing:
            return min(sharing)
        raise TopologyError(index, "an L3 cache with neither an id nor a shared_cpu_list")
    return None
