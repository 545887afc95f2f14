"""The NUMA node attributes of a device, for constraints shared with other drivers' devices.

A pod that wants CPUs beside its GPU or NIC asks for both with ``matchAttribute`` on
``resource.kubernetes.io/numaNode`` (KEP-6072), which the other drivers publish too. Its
forms, as ``k8s.io/dynamic-resource-allocation/deviceattribute`` makes them:

- ``scalar`` (the default): the device's NUMA node; every release takes it.
- ``list``: the node first, then the nodes of the same socket at the smallest distance in
  the firmware's table (memory-only nodes, whose socket cannot be told, count as the same),
  so that ``matchAttribute``, a set intersection for lists, also pairs a device with CPUs of
  a node next to its own. Only an API server with ``DRAListTypeAttributes`` keeps it: where
  the gate is off the devices are published with the scalar (``nodedra.dra.probes``).

``aliases`` publish the scalar under other names too, such as ``dra.net/numaNode`` of the
SR-IOV driver and dranet. And every device carries ``numaNode`` in nodedra's own domain, a
scalar whatever the form, for the constraints of nodedra's claim templates
(``distinctAttribute`` over NUMA nodes, :mod:`nodedra.spreadclaim`).
"""

from __future__ import annotations

from nodedra.topology.model import Topology

from .config import NUMAAttribute
from .protocol import NUMA_NODE_ATTRIBUTE, Attributes

OWN_ATTRIBUTE = "numaNode"
"""nodedra's own scalar attribute: the device's NUMA node (qualified by the driver's name)."""


def nearest(topology: Topology, node_id: int) -> list[int]:
    """``node_id``, then the nodes of its socket at the smallest distance from it, in order.

    A node whose socket is unknown (no CPUs) is taken as on the same socket, and a node of
    unknown socket takes every node at that distance: missing a node of the socket would be
    worse than naming one too many.
    """
    node = topology.nodes[node_id]
    others = {n: d for n, d in node.distances.items() if n != node_id and n in topology.nodes}
    if not others:
        return [node_id]
    closest = min(others.values())
    socket = _socket(topology, node_id)
    near = [
        n
        for n, distance in sorted(others.items())
        if distance == closest and (socket is None or _socket(topology, n) in (socket, None))
    ]
    return [node_id, *near]


def _socket(topology: Topology, node_id: int) -> int | None:
    cpus = topology.nodes[node_id].cpus
    return topology.cpus[min(cpus)].package if cpus else None


def numa_attributes(topology: Topology, node_id: int, setting: NUMAAttribute) -> Attributes:
    """The NUMA attributes of a device that lies in NUMA node ``node_id``."""
    standard: dict[str, object] = {"int": node_id}
    if setting.form == "list":
        standard = {"ints": nearest(topology, node_id)}
    attributes: Attributes = {NUMA_NODE_ATTRIBUTE: standard}
    for name in (OWN_ATTRIBUTE, *setting.aliases):
        attributes[name] = {"int": node_id}
    return attributes
