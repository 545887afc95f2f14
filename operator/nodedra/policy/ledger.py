"""Who holds what: the claims a policy granted, and the CDI edits that tell containers.

Both policies hand out exclusive CPUs (and the topology-aware one memory per NUMA node), so
the bookkeeping is one piece of code: a ledger of grants keyed by claim UID that refuses to
give a CPU to two claims, and that turns into and back from the checkpoint's JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodedra.lib.quantity import binary_quantity
from nodedra.topology.cpulist import format_cpu_list, parse_cpu_list

ENV_PREFIX = "DRA_"


class PolicyError(ValueError):
    """A claim, checkpoint or configuration the policy refuses; the message says why."""


@dataclass(frozen=True)
class Grant:
    """What one allocation result of a claim got."""

    request: str
    device: str
    cpus: frozenset[int]
    memory: int
    """Bytes of memory, taken from the NUMA nodes in ``mems``."""
    mems: frozenset[int]
    hugepages: tuple[tuple[int, int], ...] = ()
    """(page size, bytes) of huge pages taken from ``mems``, by page size; none if empty."""

    def to_json(self) -> dict[str, Any]:
        """The checkpoint's form (no ``hugepages`` key without any: older readers skip it)."""
        data: dict[str, Any] = {
            "request": self.request,
            "device": self.device,
            "cpus": format_cpu_list(self.cpus),
            "memory": self.memory,
            "mems": format_cpu_list(self.mems),
        }
        if self.hugepages:
            data["hugepages"] = {str(size): amount for size, amount in self.hugepages}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Grant:
        """Read a grant back; PolicyError if it is malformed."""
        try:
            grant = cls(
                request=str(data["request"]),
                device=str(data["device"]),
                cpus=parse_cpu_list(str(data["cpus"])),
                memory=int(data["memory"]),
                mems=parse_cpu_list(str(data["mems"])),
                hugepages=tuple(
                    sorted((int(size), int(n)) for size, n in data.get("hugepages", {}).items())
                ),
            )
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise PolicyError(f"malformed grant {dict(data)!r}: {err}") from None
        if grant.memory < 0:
            raise PolicyError(f"malformed grant {dict(data)!r}: negative memory")
        if any(size <= 0 or amount <= 0 for size, amount in grant.hugepages):
            raise PolicyError(f"malformed grant {dict(data)!r}: huge pages not positive")
        return grant


@dataclass(frozen=True)
class Shortfall:
    """A claim holding capacity its device does not offer now, as much as claims hold there.

    A boot with a smaller huge page pool (or none of a size) leaves claims in the checkpoint
    holding pages the node no longer has: they are kept (their containers may be running,
    and nodedra never drops state silently), and named by this.
    """

    uid: str
    device: str
    capacity: str
    """The device capacity: ``hugepages_1Gi``."""
    held: int
    """Bytes this claim holds of it."""
    total: int
    """Bytes every claim holds of it on the device."""
    offered: int
    """Bytes the device offers of it now, to all claims together."""
    why: str
    """Why it offers less: ``NUMA node 0 has none``."""

    def __str__(self) -> str:
        return (
            f"claim {self.uid} holds {binary_quantity(self.held)} of {self.capacity} of "
            f"{self.device}, where claims hold {binary_quantity(self.total)} and it offers "
            f"{binary_quantity(self.offered)} now: {self.why}"
        )


def env_suffix(uid: str, index: int) -> str:
    """The part of a result's environment variable names that identifies it.

    The claim UID and the result index, as a POSIX identifier: container runtimes before
    containerd 2.3 pass CDI device names on to nothing, so this is how whoever reads a
    container's environment (the NRI side of nodedra) tells which result it holds.
    """
    return f"{uid.replace('-', '_')}_{index}"


CPUSET_VARIABLE = f"{ENV_PREFIX}CPUSET_"
"""The prefix of the variable naming a result's CPUs: every result's edits have one."""


MAX_INDEX_DIGITS = 4
"""Digits of a result index in a variable name: a claim has at most 32 results. The names
are a container's to choose (pod specs, images' ``ENV``): a longer run of digits is no
index of ours, and converting it could fail (Python refuses ints of over 4300 digits)."""


def results_named(names: Iterable[str]) -> dict[str, frozenset[int]]:
    """The claims and result indexes whose variables ``names`` include.

    The inverse of :func:`grant_edits` on names alone (values are a container's to change,
    and never read). A name maps back to a UID by turning ``_`` into ``-`` again:
    Kubernetes UIDs are UUIDs, which have no ``_``. Total: any name is either ours or
    ignored, never an error.
    """
    found: dict[str, set[int]] = {}
    for name in names:
        if not name.startswith(CPUSET_VARIABLE):
            continue
        uid, sep, index = name[len(CPUSET_VARIABLE) :].rpartition("_")
        if (
            sep
            and uid
            and 0 < len(index) <= MAX_INDEX_DIGITS
            and index.isascii()
            and index.isdigit()
        ):
            found.setdefault(uid.replace("_", "-"), set()).add(int(index))
    return {uid: frozenset(indexes) for uid, indexes in found.items()}


def grant_edits(uid: str, index: int, grant: Grant) -> dict[str, Any]:
    """The CDI container edits of one result: environment variables naming what it got."""
    suffix = env_suffix(uid, index)
    return {
        "env": [
            f"{CPUSET_VARIABLE}{suffix}={format_cpu_list(grant.cpus)}",
            f"{ENV_PREFIX}MEMSET_{suffix}={format_cpu_list(grant.mems)}",
            f"{ENV_PREFIX}MEMORY_{suffix}={grant.memory}",
            *(
                f"{ENV_PREFIX}HUGEPAGES_{binary_quantity(size)}_{suffix}={amount}"
                for size, amount in grant.hugepages
            ),
        ]
    }


class Ledger:
    """The grants of every claim a policy holds. Not thread-safe: the owner's lock is."""

    def __init__(self) -> None:
        self._claims: dict[str, tuple[Grant, ...]] = {}
        self._owner_of: dict[int, str] = {}

    def __contains__(self, uid: object) -> bool:
        return uid in self._claims

    def __len__(self) -> int:
        return len(self._claims)

    def grants(self, uid: str) -> tuple[Grant, ...]:
        """The grants of claim ``uid`` (KeyError if it holds none)."""
        return self._claims[uid]

    def uids(self) -> frozenset[str]:
        """The claims held."""
        return frozenset(self._claims)

    def allocated_cpus(self) -> frozenset[int]:
        """Every CPU some claim holds."""
        return frozenset(self._owner_of)

    def holders(self, cpus: Iterable[int]) -> dict[int, str]:
        """Which claim holds each of ``cpus`` that is held."""
        return {cpu: self._owner_of[cpu] for cpu in cpus if cpu in self._owner_of}

    def memory_used(self, node: int) -> int:
        """Bytes of NUMA node ``node``'s memory granted to claims."""
        return sum(g.memory for grants in self._claims.values() for g in grants if g.mems == {node})

    def hugepages_used(self, node: int, page_size: int) -> int:
        """Bytes of NUMA node ``node``'s ``page_size`` huge pages granted to claims."""
        return sum(
            amount
            for grants in self._claims.values()
            for g in grants
            if g.mems == {node}
            for size, amount in g.hugepages
            if size == page_size
        )

    def hugepages_held(self) -> dict[int, dict[int, dict[str, int]]]:
        """NUMA node -> page size -> claim -> bytes of the node's pages the claim holds."""
        held: dict[int, dict[int, dict[str, int]]] = {}
        for uid, grants in self._claims.items():
            for grant in grants:
                if len(grant.mems) != 1:  # pages are granted from one node, or none
                    continue
                (node,) = grant.mems
                for size, amount in grant.hugepages:
                    holders = held.setdefault(node, {}).setdefault(size, {})
                    holders[uid] = holders.get(uid, 0) + amount
        return held

    def add(self, uid: str, grants: Sequence[Grant]) -> None:
        """Record claim ``uid``'s grants; refuses a CPU that is already someone's."""
        if uid in self._claims:
            raise PolicyError(f"claim {uid} is already recorded")
        wanted: dict[int, str] = {}
        for grant in grants:
            for cpu in grant.cpus:
                if cpu in self._owner_of or cpu in wanted:
                    holder = self._owner_of.get(cpu, uid)
                    raise PolicyError(f"CPU {cpu} would be granted twice (held by claim {holder})")
                wanted[cpu] = uid
        self._claims[uid] = tuple(grants)
        self._owner_of.update(wanted)

    def remove(self, uid: str) -> tuple[Grant, ...]:
        """Forget claim ``uid``; its grants, or () for an unknown claim."""
        grants = self._claims.pop(uid, ())
        for grant in grants:
            for cpu in grant.cpus:
                del self._owner_of[cpu]
        return grants

    def to_json(self) -> dict[str, Any]:
        """The checkpoint's form: ``{uid: {"grants": [...]}}``, sorted."""
        return {
            uid: {"grants": [g.to_json() for g in self._claims[uid]]}
            for uid in sorted(self._claims)
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ledger:
        """A ledger read back from the checkpoint; PolicyError if it is inconsistent."""
        ledger = cls()
        for uid, record in data.items():
            if not isinstance(record, Mapping) or not isinstance(record.get("grants"), list):
                raise PolicyError(f"claim {uid}: malformed checkpoint record {record!r}")
            try:
                ledger.add(str(uid), [Grant.from_json(g) for g in record["grants"]])
            except PolicyError as err:
                raise PolicyError(f"claim {uid} in the checkpoint: {err}") from None
        return ledger
