"""Choosing which free CPUs a claim gets: in the fewest L3 caches, whole cores first.

CPUs that share an L3 cache share the data a workload keeps hot; a claim spread over two
caches runs measurably slower than one inside one (on AMD EPYC a NUMA node holds several L3
caches, and so do recent Intel parts). So the caches come first: while no single cache has
enough free CPUs, take the one with the most (whole free caches first), and put the rest
into the cache that fits it most tightly, which leaves the emptier caches whole for the
claims to come. That uses the fewest caches possible. Inside a cache, a workload that asked
for 4 CPUs runs best on 2 whole cores rather than on 4 half-cores shared with strangers, and
on cores next to each other: take whole free cores while the request needs at least a
core's worth, in the order of the machine's layout, and fill the rest from cores already
split before breaking another. A machine whose kernel shows no L3 cache is one cache.
"""

from __future__ import annotations

from collections.abc import Collection

from nodedra.topology.model import Topology

_CORE_TYPE_RANK = {"performance": 0, None: 1, "efficiency": 2}

_Layout = tuple[int, int, int, int, int]


def pick_cpus(
    topology: Topology, free: Collection[int], count: int, *, whole_cores: bool = False
) -> frozenset[int]:
    """``count`` CPUs out of ``free``; ValueError if there are not that many.

    With ``whole_cores``, free threads of cores that are not wholly free are left out: a
    claim of whole cores cannot use them.
    """
    free_set = frozenset(free)
    if whole_cores:
        free_set = frozenset(c for c in free_set if topology.cpus[c].siblings <= free_set)
    if count > len(free_set):
        raise ValueError(f"{count} CPUs asked for, only {len(free_set)} free")
    caches: dict[int | None, list[int]] = {}
    for cpu in sorted(free_set):
        caches.setdefault(topology.cpus[cpu].l3_cache, []).append(cpu)

    def place(cache: int | None) -> _Layout:
        return _layout(topology, caches[cache][0])

    picked: list[int] = []
    while len(picked) < count:
        need = count - len(picked)
        fitting = [c for c in caches if len(caches[c]) >= need]
        if fitting:
            tightest = min(fitting, key=lambda c: (len(caches[c]), place(c)))
            return frozenset(picked + _pick_in(topology, caches[tightest], need))
        fullest = min(caches, key=lambda c: (-len(caches[c]), place(c)))
        picked += caches.pop(fullest)
    return frozenset(picked)


def _pick_in(topology: Topology, free: list[int], count: int) -> list[int]:
    """``count`` of ``free`` (CPUs of one cache): whole cores first, in layout order."""
    cores: dict[tuple[int, int, int], list[int]] = {}
    for cpu in free:
        cores.setdefault(topology.cpus[cpu].core_key, []).append(cpu)

    def layout(key: tuple[int, int, int]) -> _Layout:
        return _layout(topology, cores[key][0])

    whole = [k for k in cores if len(cores[k]) == len(topology.cpus[cores[k][0]].siblings)]
    split = [k for k in cores if k not in set(whole)]
    whole.sort(key=layout)
    split.sort(key=lambda k: (len(cores[k]), layout(k)))
    picked: list[int] = []
    for key in whole:
        if count - len(picked) >= len(cores[key]):
            picked.extend(cores[key])
    for key in split + [k for k in whole if cores[k][0] not in picked]:
        need = count - len(picked)
        if need <= 0:
            break
        picked.extend(cores[key][:need])
    return picked


def _layout(topology: Topology, cpu_id: int) -> _Layout:
    """Where a CPU sits, for ordering: kind of core, package, die, cluster, core."""
    cpu = topology.cpus[cpu_id]
    cluster = cpu.cluster if cpu.cluster is not None else -1
    return (_CORE_TYPE_RANK.get(cpu.core_type, 1), cpu.package, cpu.die, cluster, cpu.core)
