"""``/status``: who holds each CPU of the node, as one JSON object (the CPU map).

An administrator asking "which pod holds CPU 5, and is it really running there?" would
otherwise piece it together from the checkpoint, the metrics and ``/proc``. The running
instance knows all of it but ``/proc``: the topology, the reserved CPUs, the claims held
and whom they are reserved for, the containers the runtime told us of and what each was
told to run on. It is read at one moment, under the resource manager's lock
(:meth:`ResourceManager.holdings`), and turned into JSON here, outside it; what ``/status``
serves is the last such copy (:mod:`nodedra.statuscopy`). ``nodedra status``
(:mod:`nodedra.cpumap`) adds what ``/proc`` says and draws it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from nodedra.nri import CPUSet, Pod
from nodedra.policy import Grant
from nodedra.resmgr.pinning import ContainerView, Holdings
from nodedra.topology import Topology, format_cpu_list

SCHEMA = 1
"""The version of the object's layout; a change that breaks readers bumps it."""

JSONObject = dict[str, Any]
"""Plain JSON: what ``json.dumps`` writes and ``json.loads`` gives back unchanged."""


class HoldingsSource(Protocol):
    """Where the holdings come from (the resource manager)."""

    driver: str
    pinning_mode: str

    def holdings(self) -> Holdings | None:
        """Every claim's CPUs and every container's, at one moment; None if busy now."""
        ...


def cpu_map(source: HoldingsSource, topology: Topology, node: str) -> JSONObject | None:
    """The node's CPU map as JSON; None if the lock was not free just now."""
    holdings = source.holdings()
    if holdings is None:
        return None
    return build(holdings, topology, node=node, driver=source.driver, pinning=source.pinning_mode)


def build(
    holdings: Holdings, topology: Topology, *, node: str, driver: str, pinning: str
) -> JSONObject:
    """The CPU map of ``holdings`` on ``topology``.

    Every online CPU is ``reserved``, ``claimed`` (naming its claim's UID) or ``shared``:
    the shared pool is what no claim holds, reserved CPUs included.
    """
    books = holdings.books
    owner = {cpu: uid for uid, grants in books.grants.items() for g in grants for cpu in g.cpus}
    reserved = holdings.reserved & books.online
    nodes: list[JSONObject] = []
    for numa in topology.nodes.values():
        cores: list[JSONObject] = [
            {
                "package": package,
                "die": die,
                "core": core,
                "l3_cache": topology.cpus[cpus[0]].l3_cache,
                "cpus": [_cpu(cpu, reserved, owner, books.shared) for cpu in cpus],
            }
            for (package, die, core), cpus in topology.cores().items()
            if topology.cpus[cpus[0]].node == numa.id
        ]
        nodes.append(
            {
                "id": numa.id,
                "cpus": format_cpu_list(numa.cpus),
                "memory": numa.memory,
                "cores": cores,
            }
        )
    containers = holdings.containers
    return {
        "schema": SCHEMA,
        "node": node,
        "driver": driver,
        "pinning": pinning,
        "runtime_connected": holdings.connected,
        "online": format_cpu_list(books.online),
        "reserved": format_cpu_list(reserved),
        "claimed": format_cpu_list(books.allocated),
        "shared": format_cpu_list(books.shared),
        "isolated": format_cpu_list(topology.isolated & books.online),
        "numa_nodes": nodes,
        "claims": [
            _claim(uid, books.grants[uid], holdings)
            for uid in sorted(books.grants, key=lambda u: _first_cpu(books.grants[u]))
        ],
        "containers": None if containers is None else [_container(c) for c in _ordered(containers)],
    }


def _cpu(
    cpu: int, reserved: frozenset[int], owner: Mapping[int, str], shared: frozenset[int]
) -> JSONObject:
    if cpu in owner:
        return {"id": cpu, "state": "claimed", "claim": owner[cpu]}
    if cpu in reserved:
        return {"id": cpu, "state": "reserved"}
    # Isolated and unclaimed: kept for claims, out of the shared pool.
    return {"id": cpu, "state": "shared" if cpu in shared else "isolated"}


def _first_cpu(grants: Iterable[Grant]) -> tuple[int, ...]:
    """A claim's place in the list: its lowest CPU (claims without CPUs last)."""
    cpus = frozenset().union(*(g.cpus for g in grants))
    return (min(cpus),) if cpus else (1 << 30,)


def _claim(uid: str, grants: tuple[Grant, ...], holdings: Holdings) -> JSONObject:
    reservation = holdings.books.reservations.get(uid)
    pods: list[JSONObject] = [
        _pod(holdings.pods.get(pod_uid) or Pod("", pod_uid, "", ""))
        for pod_uid in sorted(reservation.pods if reservation else ())
    ]
    return {
        "uid": uid,
        "namespace": reservation.namespace if reservation else "",
        "name": reservation.name if reservation else "",
        "cpus": format_cpu_list(frozenset().union(*(g.cpus for g in grants))),
        "mems": format_cpu_list(frozenset().union(*(g.mems for g in grants))),
        "pods": pods,
        "results": [
            {
                "index": index,
                "request": grant.request,
                "device": grant.device,
                "cpus": format_cpu_list(grant.cpus),
                "mems": format_cpu_list(grant.mems),
                "memory": grant.memory,
            }
            for index, grant in enumerate(grants)
        ],
    }


def _pod(pod: Pod) -> JSONObject:
    return {"uid": pod.uid, "namespace": pod.namespace, "name": pod.name}


def _ordered(containers: Iterable[ContainerView]) -> list[ContainerView]:
    """Containers on claims first, then by pod and name."""
    return sorted(
        containers,
        key=lambda c: (not c.claims, c.pod.namespace, c.pod.name, c.container.name, c.container.id),
    )


def _cpuset(cpuset: CPUSet | None) -> JSONObject | None:
    return None if cpuset is None else {"cpus": cpuset.cpus, "mems": cpuset.mems}


def _container(view: ContainerView) -> JSONObject:
    return {
        "id": view.container.id,
        "name": view.container.name,
        "pod": _pod(view.pod),
        "claims": {uid: sorted(indexes) for uid, indexes in sorted(view.claims.items())},
        "cpus": view.wanted.cpus,
        "mems": view.wanted.mems,
        "told": _cpuset(view.told),
        "in_sync": view.in_sync,
        "cgroup": view.container.cgroups_path,
    }
