"""What the node has: its CPUs, cores, packages and NUMA nodes, as read from sysfs.

:func:`read_topology` reads a :class:`Topology` from a sysfs tree; the model classes are
immutable values; :func:`parse_cpu_list` and :func:`format_cpu_list` speak the kernel's
cpu list format. Nothing here is cached or global: read again to see a change.
"""

from nodedra.topology.cpulist import format_cpu_list, parse_cpu_list
from nodedra.topology.errors import TopologyError
from nodedra.topology.model import CPU, CoreKey, CoreType, JSONValue, NUMANode, Topology
from nodedra.topology.sysfs import read_topology

__all__ = [
    "CPU",
    "CoreKey",
    "CoreType",
    "JSONValue",
    "NUMANode",
    "Topology",
    "TopologyError",
    "format_cpu_list",
    "parse_cpu_list",
    "read_topology",
]
