"""Huge pages as the topology-aware policy offers them: names, sizes, what a node has to give.

A NUMA node's huge pages are reserved by the kernel at boot (or through sysfs) in pools of
one page size each; the policy offers each pool of each node as a capacity of that node's
device, in bytes, taken a page at a time. Bytes, not pages, because the node's allocatable
resource they stand for (``hugepages-2Mi``) is in bytes: a claim asks for ``64Mi`` of
``hugepages_2Mi`` as a pod asks for ``64Mi`` of ``hugepages-2Mi``, and the node-allocatable
mapping carries it over one to one.
"""

from __future__ import annotations

from collections.abc import Mapping

from nodedra.lib.quantity import binary_quantity, parse_quantity
from nodedra.topology.model import NUMANode


def capacity_name(page_size: int) -> str:
    """The device capacity of ``page_size`` pages: ``hugepages_2Mi``.

    Capacity names must be C identifiers, so not the resource's ``hugepages-2Mi``.
    """
    return f"hugepages_{binary_quantity(page_size)}"


def page_size(capacity: str) -> int | None:
    """The page size capacity ``capacity`` stands for (``hugepages_1Gi``: 1 GiB); None if none.

    Only a name :func:`capacity_name` would make: a result names what a device offered.
    """
    prefix = "hugepages_"
    if not capacity.startswith(prefix):
        return None
    try:
        size = parse_quantity(capacity[len(prefix) :])
    except ValueError:
        return None
    if size <= 0 or size.denominator != 1:
        return None
    return int(size) if capacity_name(int(size)) == capacity else None


def resource_name(page_size: int) -> str:
    """The node allocatable resource of ``page_size`` pages, as the kubelet names it."""
    return f"hugepages-{binary_quantity(page_size)}"


def pools(node: NUMANode) -> dict[int, int]:
    """Page size -> bytes of huge pages ``node`` has, for the sizes it has any of."""
    return {size: size * count for size, count in sorted(node.hugepages.items()) if count}


def offered(node: NUMANode, reserved: Mapping[int, int]) -> dict[int, int]:
    """Page size -> bytes claims may get of ``node``'s huge pages.

    What the node has less what the configuration keeps out of claims, in whole pages (a
    reservation that is not one is rounded up to the next page).
    """
    offers = {}
    for size, total in pools(node).items():
        kept = -(-reserved.get(size, 0) // size) * size
        offers[size] = max(total - kept, 0)
    return offers


def total_bytes(node: NUMANode) -> int:
    """Bytes of ``node``'s memory that its huge page pools take, whatever their size."""
    return sum(pools(node).values())


def why_short(
    node: NUMANode, size: int, wanted: int, node_allocatable: bool, reserved: Mapping[int, int]
) -> str:
    """Why ``node``'s device offers less than ``wanted`` bytes of ``size`` pages, or none.

    What an admin changes to have them back: the configuration, or the pool (a boot with
    fewer pages, or none of the size).
    """
    if not node_allocatable:
        return "nodeAllocatable is off"
    pool = pools(node).get(size, 0)
    if not pool:
        return f"NUMA node {node.id} has none"
    if pool < wanted:
        return f"NUMA node {node.id} has {binary_quantity(pool)}"
    kept = pool - offered(node, reserved)[size]
    return (
        f"reservedHugepages keeps {binary_quantity(kept)} of NUMA node {node.id}'s "
        f"{binary_quantity(pool)}"
    )
