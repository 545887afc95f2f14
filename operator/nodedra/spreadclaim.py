"""A claim of more CPUs than one NUMA node holds, spread evenly over NUMA nodes of one socket.

The topology-aware policy offers one device per NUMA node, so one request gets the CPUs of
one node. A workload bigger than a node (24 CPUs on a machine of 8 to 16 a node: Intel
SNC, AMD NPS4) asks for several requests instead, each of one node's share, and two
constraints the scheduler checks: ``distinctAttribute`` on the NUMA node (nodedra's own
scalar ``numaNode``: two nodes of a socket share elements of the standard attribute's list
form), so no two requests land on the same node, and ``matchAttribute`` on the package, so
all of them are on one socket. It is what the kubelet's ``distribute-cpus-across-numa``
does, decided by the scheduler: each request brings its node's memory, and each container
of the claim gets the CPUs and memory nodes of all of them.

Writing those requests by hand is where mistakes happen (a share that does not add up, a
constraint naming one request too few), so ``nodedra claim-template`` writes them.
``distinctAttribute`` belongs to DRAConsumableCapacity, the gate the policy's capacity needs
anyway: an API server without it drops the constraint, and nothing stops two requests from
sharing a node.
"""

from __future__ import annotations

from typing import Any

from nodedra.dra.names import driver_name
from nodedra.lib.quantity import parse_quantity
from nodedra.policy.numa_attribute import OWN_ATTRIBUTE
from nodedra.policy.topology_aware import CPU_CAPACITY, MEMORY_CAPACITY, MEMORY_STEP

PACKAGE_ATTRIBUTE = "package"
"""The topology-aware devices' attribute naming their socket."""
MAX_REQUESTS = 32
"""The API's limit on the requests of one claim."""


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` as evenly as whole numbers allow, larger ones first."""
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def spread_template(
    name: str, cpus: int, numa_nodes: int, memory: str = "0", policy: str = "topology-aware"
) -> dict[str, Any]:
    """A template of ``cpus`` CPUs and ``memory`` spread over ``numa_nodes`` nodes of a socket.

    Memory is shared out in whole MiB, the step the devices offer it in (rounded up).
    ValueError for a spread that cannot be asked for: fewer CPUs than nodes, more nodes
    than a claim may have requests, negative or malformed memory.
    """
    if numa_nodes < 1 or numa_nodes > MAX_REQUESTS:
        raise ValueError(f"{numa_nodes} NUMA nodes: a claim spreads over 1 to {MAX_REQUESTS}")
    if cpus < numa_nodes:
        raise ValueError(f"{cpus} CPUs cannot give each of {numa_nodes} NUMA nodes one")
    try:
        amount = parse_quantity(memory)
    except ValueError as err:
        raise ValueError(f"memory {memory!r}: {err}") from None
    if amount < 0:
        raise ValueError(f"memory {memory!r} is negative")
    mebibytes = -(-amount // MEMORY_STEP)
    driver = driver_name(policy)
    names = [f"cpus-{i}" for i in range(numa_nodes)]
    requests = [
        {
            "name": request,
            "exactly": {
                "deviceClassName": driver,
                "capacity": {
                    "requests": {
                        CPU_CAPACITY: str(share),
                        MEMORY_CAPACITY: f"{mib}Mi",
                    }
                },
            },
        }
        for request, share, mib in zip(
            names, shares(cpus, numa_nodes), shares(int(mebibytes), numa_nodes), strict=True
        )
    ]
    devices: dict[str, Any] = {"requests": requests}
    if numa_nodes > 1:
        devices["constraints"] = [
            {"requests": list(names), "distinctAttribute": f"{driver}/{OWN_ATTRIBUTE}"},
            {"requests": list(names), "matchAttribute": f"{driver}/{PACKAGE_ATTRIBUTE}"},
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": devices}},
    }
