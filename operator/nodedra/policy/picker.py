"""Choosing which free CPUs a claim gets: whole cores first, close together.

A workload that asked for 4 CPUs runs best on 2 whole cores rather than on 4 half-cores
shared with strangers, and on cores next to each other rather than spread over the package.
So: take whole free cores while the request needs at least a core's worth, in the order of
the machine's layout, and fill the rest from cores already split before breaking another.
"""

from __future__ import annotations

from collections.abc import Collection

from nodedra.topology.model import Topology

_CORE_TYPE_RANK = {"performance": 0, None: 1, "efficiency": 2}


def pick_cpus(topology: Topology, free: Collection[int], count: int) -> frozenset[int]:
    """``count`` CPUs out of ``free``; ValueError if there are not that many."""
    if count > len(free):
        raise ValueError(f"{count} CPUs asked for, only {len(free)} free")
    free_set = frozenset(free)
    cores: dict[tuple[int, int, int], list[int]] = {}
    for cpu in sorted(free_set):
        cores.setdefault(topology.cpus[cpu].core_key, []).append(cpu)

    def layout(key: tuple[int, int, int]) -> tuple[int, int, int, int, int]:
        first = topology.cpus[cores[key][0]]
        cluster = first.cluster if first.cluster is not None else -1
        return (_CORE_TYPE_RANK.get(first.core_type, 1), first.package, first.die, cluster, key[2])

    whole = [k for k in cores if len(cores[k]) == len(_online_threads(topology, cores[k][0]))]
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
    return frozenset(picked)


def _online_threads(topology: Topology, cpu: int) -> frozenset[int]:
    return topology.cpus[cpu].siblings
