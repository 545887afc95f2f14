"""Reading a machine's :class:`Topology` from sysfs.

The root is a parameter, not a constant, because nodedra often runs in a container where
the host's sysfs is mounted elsewhere, and because tests read generated trees. Every call
reads the files afresh (CPUs go on- and offline, huge pages get reserved) and reads each
file once, so a topology is one snapshot even if it is slightly stale by the time it is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from nodedra.topology.cpulist import format_cpu_list
from nodedra.topology.errors import TopologyError
from nodedra.topology.files import read_cpus, read_optional_cpus
from nodedra.topology.model import NUMANode, Topology
from nodedra.topology.sysfs_cpu import read_core_types, read_cpu
from nodedra.topology.sysfs_node import node_root, read_nodes


def read_topology(sysfs: str | os.PathLike[str] = "/sys") -> Topology:
    """The online CPUs and the NUMA nodes of the machine whose sysfs is mounted at ``sysfs``.

    Raises:
        TopologyError: a file that must exist is missing or unreadable, or the files
            contradict each other; the message names the file.
    """
    root = Path(sysfs)
    cpu_dir = root / "devices" / "system" / "cpu"
    online = read_cpus(cpu_dir / "online")
    if not online:
        raise TopologyError(cpu_dir / "online", "it lists no CPUs")
    # Both lists may be missing (a kernel without CPU hotplug, or an old one) or empty.
    offline = read_optional_cpus(cpu_dir / "offline") or frozenset()
    if online & offline:
        both = format_cpu_list(online & offline)
        raise TopologyError(cpu_dir / "offline", f"cpus {both} are also listed as online")
    isolated = read_optional_cpus(cpu_dir / "isolated") or frozenset()
    nodes = read_nodes(root, online)
    node_of = _place_cpus(root, nodes, online)
    core_types = read_core_types(root / "devices")
    cpus = {
        cpu: read_cpu(
            cpu_dir,
            cpu,
            online=online,
            node=node_of[cpu],
            core_type=core_types.get(cpu),
            isolated=cpu in isolated,
        )
        for cpu in sorted(online)
    }
    return Topology(
        cpus=cpus, nodes={node.id: node for node in nodes}, offline=offline, isolated=isolated
    )


def _place_cpus(
    root: Path, nodes: tuple[NUMANode, ...], online: frozenset[int]
) -> Mapping[int, int]:
    """Online CPU -> its node; every online CPU must be in exactly one node's cpulist."""
    node_of: dict[int, int] = {}
    for node in nodes:
        for cpu in sorted(node.cpus):
            if cpu in node_of:
                path = node_root(root) / f"node{node.id}" / "cpulist"
                raise TopologyError(path, f"cpu {cpu} is also in node {node_of[cpu]}'s cpulist")
            node_of[cpu] = node.id
    unplaced = online - node_of.keys()
    if unplaced:
        raise TopologyError(
            node_root(root),
            f"online cpus {format_cpu_list(unplaced)} are in no node's cpulist",
        )
    return node_of
