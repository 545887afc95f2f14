"""What topology-aware claims get of the kernel's isolated CPUs: the option ``isolatedCPUs``.

The kernel balances no load onto an isolated CPU, which is why latency-sensitive workloads
want them and why they are never in the shared pool (a container landing there would stay
there). What claims get of them is the admin's choice, per node:

- ``offered`` (the default): a NUMA node's device offers them like its other CPUs.
- ``preferred``: likewise, but a claim gets the node's free isolated CPUs first, and others
  only for what they cannot cover: the node's claims are the workloads they are for.
- ``reserved``: they are a device of their own per NUMA node (``cpudevnumaNNNisolated``,
  attribute ``isolated: true``, CPUs only: the node's memory is offered once, by its other
  device), which only claims that ask for it get: the default DeviceClass selects none of
  them, ``topology-aware-isolated.nri.io`` selects only them. A claim that wants isolated
  CPUs and memory asks both devices, matching the NUMA node. Separate devices keep the
  scheduler's count exact: with one device it could promise CPUs only isolated ones could
  cover to a claim that must not get them.

Switching between ``reserved`` and the others moves isolated CPUs between devices, so it is
refused while a claim holds one (and so is a checkpoint written under the other): what the
scheduler recorded of that claim would name a device that no longer offers them.
"""

from __future__ import annotations

from collections.abc import Collection

from nodedra.topology.cpulist import format_cpu_list
from nodedra.topology.model import Topology

from .ledger import Ledger, PolicyError
from .picker import pick_cpus

OFFERED, PREFERRED, RESERVED = "offered", "preferred", "reserved"
ATTRIBUTE = "isolated"
"""The attribute saying whether a device offers isolated CPUs only (``reserved`` alone)."""
SUFFIX = "isolated"
"""What the name of a NUMA node's device of isolated CPUs adds to the node's device name."""


def split(cpus: frozenset[int], isolated: frozenset[int], mode: str) -> dict[bool, frozenset[int]]:
    """A NUMA node's grantable ``cpus`` by device: whether isolated-only -> its CPUs.

    One device with all of them, or with ``reserved`` one for the isolated ones beside one
    for the rest; a device with no CPU is none.
    """
    if mode != RESERVED:
        return {False: cpus} if cpus else {}
    parts = {False: cpus - isolated, True: cpus & isolated}
    return {only: part for only, part in parts.items() if part}


def pick(
    topology: Topology,
    free: Collection[int],
    count: int,
    *,
    whole_cores: bool,
    mode: str,
) -> frozenset[int]:
    """``count`` of ``free`` (ValueError if too few): with ``preferred`` isolated ones first.

    The isolated CPUs taken are chosen as the picker chooses (fewest caches, whole cores);
    so is the rest, from the others. With ``whole_cores`` only isolated whole cores come
    first (an isolated set that splits a core gives none).
    """
    free_set = frozenset(free)
    first = free_set & topology.isolated if mode == PREFERRED else frozenset()
    if whole_cores:
        first = frozenset(c for c in first if topology.cpus[c].siblings <= first)
    if len(first) >= count:
        return pick_cpus(topology, first, count, whole_cores=whole_cores)
    if first:
        others = free_set - first
        return first | pick_cpus(topology, others, count - len(first), whole_cores=whole_cores)
    return pick_cpus(topology, free_set, count, whole_cores=whole_cores)


def check_held(topology: Topology, ledger: Ledger, mode: str) -> None:
    """Refuse ``mode`` if a claim holds isolated CPUs of a device it would not offer them by.

    PolicyError naming the claim: a checkpoint or a configuration change that moves isolated
    CPUs between devices while claims hold them.
    """
    for uid in sorted(ledger.uids()):
        for grant in ledger.grants(uid):
            only = grant.device.endswith(SUFFIX)
            held = grant.cpus & topology.isolated
            if (only and mode != RESERVED) or (held and not only and mode == RESERVED):
                raise PolicyError(
                    f"claim {uid} holds isolated CPUs {format_cpu_list(held)} of device "
                    f"{grant.device}, which isolatedCPUs {mode} would not offer there: switch "
                    "it back, or release the claims first"
                )
