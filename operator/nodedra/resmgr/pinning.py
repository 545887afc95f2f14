"""Which container gets which CPUs: the containers of claims, and the shared pool.

A container holding claims runs on the CPUs of the results it holds, with the memory of
their NUMA nodes. Every other container (no claim, or only other drivers' claims) runs on
the *shared pool*: the node's online CPUs less the CPUs of every prepared claim, reserved
CPUs included, so that it is never empty.

Which claims a container holds comes from its CDI device names (containerd passes them from
2.3 on) or, where it passes none, from the names of our environment variables in it. The
values of those variables are never read, and a claim counts for a container only if it was
reserved for the container's pod: a container may name any claim it likes, but it gets
only what the scheduler gave its pod.

The bookkeeping here is what the runtime was last told about each container, so that a
change (a claim prepared or unprepared, the runtime restarted) becomes the updates of
exactly the containers it affects. Not thread-safe: the resource manager's lock guards it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from nodedra.dra import container_claims
from nodedra.nri import Container, CPUSet, Pod, Update
from nodedra.policy import Grant
from nodedra.topology import format_cpu_list, parse_cpu_list

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reservation:
    """Who a prepared claim is for: its name, and the pods it was reserved for."""

    namespace: str
    name: str
    pods: frozenset[str]
    """UIDs of the pods in the claim's ``status.reservedFor``."""

    def to_json(self) -> dict[str, object]:
        """The checkpoint's form."""
        return {"namespace": self.namespace, "name": self.name, "pods": sorted(self.pods)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Reservation:
        """Read a reservation back; ValueError if it is malformed."""
        pods = data.get("pods")
        if not isinstance(pods, list) or not all(isinstance(p, str) for p in pods):
            raise ValueError(f"malformed reservation {dict(data)!r}")
        return cls(str(data.get("namespace", "")), str(data.get("name", "")), frozenset(pods))


@dataclass(frozen=True)
class Books:
    """What the policy holds, as pinning needs it (read under the lock)."""

    grants: Mapping[str, tuple[Grant, ...]]
    reservations: Mapping[str, Reservation]
    online: frozenset[int]
    allocated: frozenset[int]
    isolated: frozenset[int] = frozenset()

    @cached_property
    def shared(self) -> frozenset[int]:
        """The CPUs of every container without claims: unclaimed, not isolated.

        The kernel balances no load onto an isolated CPU, so a container of the shared pool
        that lands there stays there: they are for claims only. Where that would leave no
        CPU at all, the isolated ones are shared too.
        """
        unclaimed = self.online - self.allocated
        return (unclaimed - self.isolated) or unclaimed

    @cached_property
    def shared_cpuset(self) -> CPUSet:
        """The cpuset of every container without claims."""
        return CPUSet(format_cpu_list(self.shared))


@dataclass(frozen=True)
class Decision:
    """What a container gets, and why."""

    cpuset: CPUSet
    claims: Mapping[str, frozenset[int]]
    """The claims (and result indexes) honoured; empty: the shared pool."""
    unreserved: tuple[str, ...] = ()
    """Claims the container names that were not reserved for its pod."""
    error: str = ""
    """What in the container made its claims unreadable ("" if nothing): then it gets the
    shared pool, as a container without claims."""


@dataclass(frozen=True)
class ContainerView:
    """A container as the books have it at one moment: for people asking where it runs."""

    container: Container
    pod: Pod
    wanted: CPUSet
    """What it should run on, decided from the books now."""
    told: CPUSet | None
    """What the runtime was last told it runs on; None: not known."""
    claims: Mapping[str, frozenset[int]]
    """The claims (and result indexes) whose CPUs it runs on; empty: the shared pool."""

    @property
    def in_sync(self) -> bool:
        """Whether the runtime was told what the container should run on now."""
        return self.told is not None and same(self.wanted, self.told)


class KnownContainer(NamedTuple):
    """A container as the runtime last told us of it, copied (``Pinning.tracked``)."""

    container: Container
    pod: Pod
    told: CPUSet | None


@dataclass(frozen=True)
class Holdings:
    """Who holds which CPUs, read at one moment under the lock (``nodedra status``)."""

    books: Books
    reserved: frozenset[int]
    """The configuration's reserved CPUs: always in the shared pool, never a claim's."""
    containers: tuple[ContainerView, ...] | None
    """Every container the runtime told us of; None: pinning is off."""
    pods: Mapping[str, Pod]
    """The pods the runtime told us of, by Kubernetes UID."""
    connected: bool | None
    """Whether the runtime is connected and synchronized; None: pinning is off."""


@dataclass
class _Tracked:
    container: Container
    pod: Pod
    told: CPUSet | None
    """What the runtime runs the container with, as far as we know; None: we do not know
    (an update of ours crossed a newer decision, and either may have been applied last)."""
    pinned: bool = False


@dataclass
class Pinning:
    """The containers of the node and what each should run on."""

    driver: str
    results_in_environment: Callable[[Iterable[str]], dict[str, frozenset[int]]]
    pods: dict[str, Pod] = field(default_factory=dict)
    containers: dict[str, _Tracked] = field(default_factory=dict)
    unreserved_total: int = 0
    """Containers that named a claim not reserved for their pod (for the metrics)."""
    invalid_total: int = 0
    """Containers whose claims could not be read from what the runtime sent (the metrics)."""
    behind: bool = False
    """Whether some container may run on other CPUs than it should: the books changed (a
    commit), or the runtime failed an update. Until then looking for stale containers,
    which costs a decision per container, finds nothing and is skipped."""
    generation: int = 0
    """Changes of the books so far (claims or their reservations)."""
    _sending: dict[str, int] = field(default_factory=dict)
    """Updates computed for the sender and not yet reported back: the books' generation
    when each was computed."""

    def books_changed(self) -> None:
        """Claims, or whom they are reserved for, changed: containers may be behind."""
        self.behind = True
        self.generation += 1

    def held(self, container: Container) -> dict[str, frozenset[int]]:
        """The claims (and result indexes) of our driver that ``container`` names."""
        if container.cdi_devices:
            return {
                uid: frozenset(indexes)
                for uid, indexes in container_claims(container, self.driver).items()
            }
        return self.results_in_environment(container.env_names)

    def decide(self, pod: Pod, container: Container, books: Books) -> Decision:
        """What ``container`` of ``pod`` should run on; never an error.

        Names, UIDs and sizes come from pod specs and images, which no API validation
        saw: if reading them fails, the container gets the shared pool and the decision
        says why, and no other container is affected.
        """
        try:
            held = self.held(container)
        except Exception as err:  # a bug of a parser on untrusted input: this container's
            return Decision(books.shared_cpuset, {}, (), f"{type(err).__name__}: {err}")
        honoured: dict[str, frozenset[int]] = {}
        unreserved = []
        for uid, indexes in sorted(held.items()):
            grants = books.grants.get(uid)
            if grants is None:
                continue  # not a claim we hold (any more): nothing of ours to give
            reservation = books.reservations.get(uid)
            if not pod.uid or reservation is None or pod.uid not in reservation.pods:
                unreserved.append(uid)
                continue
            usable = frozenset(i for i in indexes if 0 <= i < len(grants))
            if usable:
                honoured[uid] = usable
        if not honoured:
            return Decision(books.shared_cpuset, {}, tuple(unreserved))
        cpus: set[int] = set()
        mems: set[int] = set()
        for uid, indexes in honoured.items():
            for index in indexes:
                cpus |= books.grants[uid][index].cpus
                mems |= books.grants[uid][index].mems
        cpuset = CPUSet(format_cpu_list(cpus), format_cpu_list(mems))
        return Decision(cpuset, honoured, tuple(unreserved))

    def track(self, pod: Pod, container: Container, decision: Decision, told: CPUSet) -> None:
        """Remember ``container`` and what the runtime runs it with; log a pinning."""
        known = self.containers.get(container.id)
        self.containers[container.id] = _Tracked(container, pod, told, bool(decision.claims))
        if decision.error and known is None:
            self.invalid_total += 1
            log.warning(
                "container %r of pod %s: its claims cannot be read from what the runtime "
                "sent (%s): it gets the shared pool",
                container.name,
                pod,
                decision.error,
            )
        if decision.unreserved and known is None:
            self.unreserved_total += 1
            log.warning(
                "container %r of pod %s names claims %s not reserved for its pod: it gets "
                "the shared pool, not their CPUs",
                container.name,
                pod,
                ", ".join(decision.unreserved),
            )
        if decision.claims and (known is None or known.told != told):
            log.info(
                "container %r of pod %s pinned to CPUs %s, memory nodes %s (claims %s)",
                container.name,
                pod,
                told.cpus,
                told.mems or "unchanged",
                ", ".join(f"{u} results {sorted(i)}" for u, i in decision.claims.items()),
            )

    def tracked(self) -> tuple[KnownContainer, ...]:
        """What is known of every container now (under the lock): for :meth:`view`, after."""
        return tuple(KnownContainer(k.container, k.pod, k.told) for k in self.containers.values())

    def view(self, books: Books, tracked: Iterable[KnownContainer]) -> list[ContainerView]:
        """Each of ``tracked``, what it should run on and what the runtime was told.

        A decision per container, as :meth:`stale` makes: for a person asking, not for
        every event. Decisions read only ``books`` and the container, so this needs no lock.
        """
        views = []
        for known in tracked:
            decision = self.decide(known.pod, known.container, books)
            views.append(
                ContainerView(
                    known.container, known.pod, decision.cpuset, known.told, decision.claims
                )
            )
        return views

    def forget(self, container_id: str) -> None:
        """A container stopped or went away: it no longer needs CPUs."""
        self.containers.pop(container_id, None)
        self._sending.pop(container_id, None)

    def reset(self, pods: Sequence[Pod]) -> None:
        """Start again from what the runtime says it has (a new connection)."""
        self.pods = {pod.id: pod for pod in pods}
        self.containers = {}
        self._sending = {}
        self.behind = False

    def stale(self, books: Books, exclude: str = "") -> list[Update]:
        """The updates that bring every known container to what it should run on now.

        ``exclude`` names a container being created (the runtime refuses updates of it).
        """
        if not self.behind:
            return []
        self.behind = False  # until the books change again, or the runtime fails these
        updates = []
        for known in self.containers.values():
            if known.container.id == exclude:
                continue
            wanted = self.decide(known.pod, known.container, books).cpuset
            if known.told is None or not same(wanted, known.told):
                updates.append(Update(known.container.id, wanted))
        return updates

    def stale_to_send(self, books: Books) -> list[Update]:
        """:meth:`stale`, for updates sent outside an event: report them with :meth:`sent`.

        Such an update travels while the books may change and an event answer for its
        container from the newer books: which of the two the runtime applies last is not
        ours to know, so :meth:`sent` checks whether the books changed in between.
        """
        updates = self.stale(books)
        for update in updates:
            self._sending[update.container_id] = self.generation
        return updates

    def told(self, updates: Iterable[Update]) -> None:
        """An event's answer carries ``updates``, decided from the books as they are."""
        for update in updates:
            known = self.containers.get(update.container_id)
            if known is not None:
                known.told = applied(known.told, update.cpuset)

    def sent(self, updates: Iterable[Update], failed: Iterable[str] = ()) -> None:
        """The runtime applied ``updates`` of :meth:`stale_to_send`, except for ``failed``.

        An update computed before the books changed may be out of date, and may have been
        applied after an event's answer from the newer books: what the container runs with
        is then unknown, and it is sent what it should have once more. (Without a change
        of the books an event decides as the update did.) That update, computed from the
        books as they are, makes it known again once applied: left unknown, the container
        would be sent its cpuset again after every commit, and shown as behind for good.
        """
        missed = set(failed)
        for update in updates:
            known = self.containers.get(update.container_id)
            computed = self._sending.pop(update.container_id, None)
            if known is None:
                continue
            if computed != self.generation:
                known.told = None
                self.behind = True
            elif update.container_id not in missed:
                known.told = applied(known.told, update.cpuset)
        if missed:
            self.behind = True

    @property
    def pinned(self) -> int:
        """Containers running on the CPUs of their claims."""
        return sum(1 for known in self.containers.values() if known.pinned)


def same(wanted: CPUSet, current: CPUSet) -> bool:
    """Whether a container running with ``current`` has what ``wanted`` asks for.

    ``current`` is what the runtime says: a list that is no cpu list is not ``wanted``.
    """
    if wanted == current:
        return True
    cpus = _parsed(current.cpus)
    if cpus is None or _parsed(wanted.cpus) != cpus:
        return False
    if not wanted.mems:
        return True
    mems = _parsed(current.mems)
    return mems is not None and _parsed(wanted.mems) == mems


@functools.lru_cache(maxsize=1024)
def _parsed(cpu_list: str) -> frozenset[int] | None:
    """A CPU list as a set, remembered; None if it is not one.

    A node's containers run on few distinct CPU lists: a Synchronize compares a thousand
    containers' cpusets with the same shared pool.
    """
    try:
        return parse_cpu_list(cpu_list)
    except ValueError:
        return None


def merged(current: CPUSet, change: CPUSet) -> CPUSet:
    """``current`` after ``change`` (an empty field of a change leaves it as it was)."""
    return CPUSet(change.cpus or current.cpus, change.mems or current.mems)


def applied(told: CPUSet | None, change: CPUSet) -> CPUSet:
    """What a container runs with once the runtime applied ``change``, as far as we know.

    Every place that learns of an applied change goes through here, so that a cpuset
    unknown (None) becomes known again however it is learnt. A field ``change`` sets is
    known from then on; an empty one left the container's as it was, which stays unknown
    ("") when nothing was known before: ``same`` never takes an unknown field for a wanted
    one, so a container is never thought to have memory nodes it was not told.
    """
    return merged(told or CPUSet(""), change)
