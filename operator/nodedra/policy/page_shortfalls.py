"""Claims holding huge pages their NUMA node does not offer now, and changes that add to them.

A node's huge page pools can shrink under claims that hold pages of them: a reboot that
reserved fewer, ``nodeAllocatable`` switched off, a larger ``reservedHugepages``. What a
boot took is only named (``nodedra status``, the log): refusing it would refuse the start.
What a configuration change would take is refused, saying which claims hold what.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from nodedra.lib.quantity import binary_quantity
from nodedra.topology.model import NUMANode

from . import hugepages
from .config import PolicyConfig
from .ledger import Ledger, Shortfall

Offered = Callable[[NUMANode, PolicyConfig], Mapping[int, int]]
"""Page size -> bytes a NUMA node offers claims under a configuration."""


def find(
    ledger: Ledger,
    nodes: Mapping[int, NUMANode],
    offered: Offered,
    config: PolicyConfig,
    device_of: Callable[[int], str],
) -> list[Shortfall]:
    """Claims holding more of a node's pages than it offers under ``config``, one a claim.

    Where a pool is smaller than what claims hold of it, every claim holding pages of it is
    named: which of them would miss pages is the kernel's business, not ours.
    """
    found: list[Shortfall] = []
    for node_id, sizes in sorted(ledger.hugepages_held().items()):
        node = nodes.get(node_id)
        there_now = offered(node, config) if node is not None else {}
        for size, holders in sorted(sizes.items()):
            total, there = sum(holders.values()), there_now.get(size, 0)
            if total <= there:
                continue
            why = (
                hugepages.why_short(
                    node, size, total, config.node_allocatable, config.reserved_hugepages
                )
                if node is not None
                else f"NUMA node {node_id} is gone"
            )
            found.extend(
                Shortfall(
                    uid,
                    device_of(node_id),
                    hugepages.capacity_name(size),
                    amount,
                    total,
                    there,
                    why,
                )
                for uid, amount in sorted(holders.items())
            )
    return found


def worse(now: list[Shortfall], after: list[Shortfall]) -> str | None:
    """Why a change from shortfalls ``now`` to ``after`` is refused; None if it takes nothing.

    Only what it would add counts: what a boot took already must not block every change.
    """
    short = {(s.device, s.capacity): s.total - s.offered for s in now}
    added: dict[tuple[str, str], list[Shortfall]] = {}
    for shortfall in after:
        where = (shortfall.device, shortfall.capacity)
        if shortfall.total - shortfall.offered > short.get(where, 0):
            added.setdefault(where, []).append(shortfall)
    if not added:
        return None
    return (
        "would offer fewer huge pages than claims hold: "
        + "; ".join(
            f"{capacity} of {device}: claims {[s.uid for s in held]} hold "
            f"{binary_quantity(held[0].total)}, it would offer "
            f"{binary_quantity(held[0].offered)} ({held[0].why})"
            for (device, capacity), held in sorted(added.items())
        )
        + ": switch it back, or release those claims first"
    )
