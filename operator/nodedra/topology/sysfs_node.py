"""Reading the NUMA nodes under ``devices/system/node``: their CPUs, memory and distances.

A kernel built without NUMA support has no ``devices/system/node`` at all; such a machine
still has one node in every sense that matters to placement, so we report node 0 with all
online CPUs. Its memory is then reported as 0 bytes, meaning "unknown": sysfs has no total
for it, and ``/proc/meminfo`` is not reliably next to a configurable sysfs root (a container
may mount the host's /sys but show its own, cgroup-limited /proc). Its huge pages come from
``kernel/mm/hugepages``, which is in sysfs whether or not NUMA is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from nodedra.topology.errors import TopologyError
from nodedra.topology.files import parse_int, read_cpus, read_int, read_optional_cpus, read_text
from nodedra.topology.model import NUMANode

LOCAL_DISTANCE = 10
"""The distance of a node to itself, by the ACPI SLIT convention the kernel follows."""

_MEMTOTAL = re.compile(r"Node\s+([0-9]+)\s+MemTotal:\s+([0-9]+)\s+kB")
_HUGEPAGES = re.compile(r"hugepages-([0-9]+)kB")


def node_root(sysfs: Path) -> Path:
    """Where the kernel lists NUMA nodes under the sysfs root ``sysfs``."""
    return sysfs / "devices" / "system" / "node"


def read_nodes(sysfs: Path, online: frozenset[int]) -> tuple[NUMANode, ...]:
    """The NUMA nodes of the machine whose sysfs is at ``sysfs``, ascending by id.

    ``online`` are the online CPUs; a node's CPUs are cut down to them, since outside x86 a
    node's cpulist can still name CPUs that were taken offline.
    """
    root = node_root(sysfs)
    if not root.is_dir():
        return (_single_node(sysfs, online),)
    node_ids = _node_ids(root)
    return tuple(_read_node(root / f"node{n}", n, node_ids, online) for n in node_ids)


def _single_node(sysfs: Path, online: frozenset[int]) -> NUMANode:
    """Node 0 of a kernel without NUMA: every CPU, unknown memory (0), global huge pages."""
    return NUMANode(
        id=0,
        cpus=online,
        memory=0,
        distances={0: LOCAL_DISTANCE},
        hugepages=_read_hugepages(sysfs / "kernel" / "mm" / "hugepages"),
    )


def _node_ids(root: Path) -> tuple[int, ...]:
    """The online node ids, ascending: the order of the numbers in every ``distance`` file.

    ``online`` has them all; without it, nodes with CPUs or memory are the ones that matter.
    Node lists have the cpu list format.
    """
    online = read_optional_cpus(root / "online")
    if online is None:
        has_cpu = read_optional_cpus(root / "has_cpu")
        has_memory = read_optional_cpus(root / "has_memory")
        if has_cpu is None and has_memory is None:
            raise TopologyError(root / "online", "no such file, nor has_cpu or has_memory")
        online = (has_cpu or frozenset()) | (has_memory or frozenset())
        if not online:
            raise TopologyError(root / "has_cpu", "neither it nor has_memory lists a node")
    elif not online:
        raise TopologyError(root / "online", "it lists no nodes")
    return tuple(sorted(online))


def _read_node(
    node_dir: Path, node_id: int, node_ids: tuple[int, ...], online: frozenset[int]
) -> NUMANode:
    return NUMANode(
        id=node_id,
        cpus=read_cpus(node_dir / "cpulist") & online,
        memory=_read_memtotal(node_dir / "meminfo", node_id),
        distances=_read_distances(node_dir / "distance", node_ids),
        hugepages=_read_hugepages(node_dir / "hugepages"),
    )


def _read_memtotal(path: Path, node_id: int) -> int:
    """Bytes of memory of the node, from its ``Node N MemTotal:  X kB`` line."""
    for line in read_text(path).splitlines():
        match = _MEMTOTAL.fullmatch(line.strip())
        if match is not None:
            if int(match[1]) != node_id:
                raise TopologyError(path, f"its MemTotal line is for node {match[1]}")
            return int(match[2]) * 1024
    raise TopologyError(path, f"it has no 'Node {node_id} MemTotal: <n> kB' line")


def _read_distances(path: Path, node_ids: tuple[int, ...]) -> Mapping[int, int]:
    """Node id -> distance: the file has one number per online node, in node order."""
    fields = read_text(path).split()
    if len(fields) != len(node_ids):
        raise TopologyError(
            path, f"it has {len(fields)} distances for {len(node_ids)} online nodes"
        )
    return {node: parse_int(path, field) for node, field in zip(node_ids, fields, strict=True)}


def _read_hugepages(hugepages: Path) -> Mapping[int, int]:
    """Page size in bytes -> ``nr_hugepages``, from the ``hugepages-<size>kB`` directories.

    A kernel without hugetlbfs has no such directory: no sizes. Entries of another name
    are skipped so that a future kernel adding files there does not break us.
    """
    if not hugepages.is_dir():
        return {}
    sizes: dict[int, int] = {}
    for entry in sorted(hugepages.iterdir()):
        match = _HUGEPAGES.fullmatch(entry.name)
        if match is not None:
            if int(match[1]) == 0:
                raise TopologyError(entry, "a huge page size cannot be 0")
            sizes[int(match[1]) * 1024] = read_int(entry / "nr_hugepages")
    return sizes
