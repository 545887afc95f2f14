"""The resource manager's side of NRI: answering the runtime about each container.

Every answer is decided under the resource manager's lock (the one kubelet requests hold),
from the books as committed: the claims the policy holds, whom each was reserved for, the
CPUs no claim holds. Changes made outside an event (a prepare, an unprepare) are found by
comparing what each container should run on with what the runtime was last told, and sent
by the NRI plugin after the lock is released.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from nodedra.dra import ClusterAPI, KubeAPIError
from nodedra.nri import Container, CPUSet, Pod, Update
from nodedra.policy import Policy

from .pinning import Books, Decision, Pinning, Reservation, same

log = logging.getLogger(__name__)

CONFLICT_WARNING_PERIOD = 600.0
"""Seconds between two error lines about the kubelet's CPU manager pinning too."""


def reserved_pods(claim: Mapping[str, Any]) -> frozenset[str]:
    """The UIDs of the pods a claim's ``status.reservedFor`` names."""
    status = claim.get("status")
    entries = status.get("reservedFor") if isinstance(status, Mapping) else None
    return frozenset(
        str(entry["uid"])
        for entry in entries or ()
        if isinstance(entry, Mapping)
        and entry.get("resource") == "pods"
        and not entry.get("apiGroup")
        and entry.get("uid")
    )


class ContainerPinner:
    """Implements the NRI plugin's RuntimeOwner for the resource manager."""

    def __init__(
        self,
        *,
        lock: Callable[[], AbstractContextManager[object]],
        policy: Policy,
        driver: str,
        reservations: Callable[[], dict[str, Reservation]],
        api: ClusterAPI,
        on_synchronized: Callable[[], None],
    ) -> None:
        self._lock = lock
        self._policy = policy
        self._reservations = reservations
        self._api = api
        self._on_synchronized = on_synchronized
        self.pinning = Pinning(driver, policy.results_in_environment)
        self._state = threading.Lock()  # guards the two fields below, never held long
        self._connected = False
        self._warned = -CONFLICT_WARNING_PERIOD
        self.cpu_manager_conflicts = 0
        """Cpusets the kubelet asked for (for the metrics): a CPU manager is at work."""
        self.detail = "not connected yet"
        """What the runtime connection is like, in words (for readiness and logs)."""

    @property
    def connected(self) -> bool:
        """Whether the runtime is connected and synchronized."""
        with self._state:
            return self._connected

    @contextmanager
    def _books(self) -> Iterator[Books]:
        with self._lock():
            policy = self._policy
            yield Books(
                grants={uid: policy.grants(uid) for uid in policy.claim_uids()},
                reservations=self._reservations(),
                online=policy.online_cpus(),
                allocated=policy.allocated_cpus(),
            )

    # RuntimeOwner ------------------------------------------------------------------------

    def synchronize(self, pods: Sequence[Pod], containers: Sequence[Container]) -> list[Update]:
        """Start again from what the runtime has: every container to what it should run on."""
        known = {pod.id: pod for pod in pods}
        updates = []
        with self._books() as books:
            self.pinning.reset(pods)
            for container in containers:
                pod = known.get(container.pod_id) or Pod(container.pod_id, "", "", "")
                decision = self.pinning.decide(pod, container, books)
                self.pinning.track(pod, container, decision, decision.cpuset)
                if not same(decision.cpuset, container.cpuset):
                    updates.append(Update(container.id, decision.cpuset))
        return updates

    def create_container(
        self, pod: Pod, container: Container
    ) -> tuple[CPUSet | None, list[Update]]:
        """Pin the new container, and bring any other container still behind up to date."""
        self._cpu_manager_check(container.cpuset, f"container {container.name} of pod {pod}")
        with self._books() as books:
            self.pinning.pods[pod.id] = pod
            decision = self.pinning.decide(pod, container, books)
            if not decision.unreserved:
                return self._created(pod, container, decision, books)
        self._refresh(decision.unreserved)  # outside the lock: an API call
        with self._books() as books:
            decision = self.pinning.decide(pod, container, books)
            return self._created(pod, container, decision, books)

    def _created(
        self, pod: Pod, container: Container, decision: Decision, books: Books
    ) -> tuple[CPUSet | None, list[Update]]:
        self.pinning.track(pod, container, decision, decision.cpuset)
        others = self.pinning.stale(books, exclude=container.id)
        self.pinning.told(others)
        return decision.cpuset, others

    def update_container(self, pod: Pod, container: Container, requested: CPUSet) -> list[Update]:
        """The kubelet changes a container's resources: its cpuset stays ours."""
        self._cpu_manager_check(requested, f"container {container.name} of pod {pod}")
        with self._books() as books:
            decision = self.pinning.decide(pod, container, books)
            self.pinning.track(pod, container, decision, decision.cpuset)
        return [Update(container.id, decision.cpuset)]

    def container_stopped(self, pod: Pod, container: Container) -> list[Update]:
        """A stopped container needs no CPUs (claims give theirs back when unprepared)."""
        with self._lock():
            self.pinning.forget(container.id)
        return []

    def container_removed(self, pod: Pod, container: Container) -> None:
        """A removed container is forgotten."""
        with self._lock():
            self.pinning.forget(container.id)

    def pod_seen(self, pod: Pod) -> None:
        """Remember a pod sandbox, for its containers."""
        with self._lock():
            self.pinning.pods[pod.id] = pod

    def pod_removed(self, pod: Pod) -> None:
        """Forget a pod sandbox."""
        with self._lock():
            self.pinning.pods.pop(pod.id, None)

    def pending_updates(self) -> list[Update]:
        """The containers whose cpuset must change, and to what."""
        with self._books() as books:
            return self.pinning.stale(books)

    def updates_sent(self, sent: Sequence[Update], failed: Sequence[str]) -> None:
        """The runtime applied ``sent``, but for the containers ``failed`` names."""
        with self._lock():
            self.pinning.told(sent, failed)

    def connection_changed(self, connected: bool, detail: str) -> None:
        """Note the runtime connection; claims may be served once it is synchronized."""
        with self._state:
            self._connected = connected
            self.detail = detail
        if connected:
            self._on_synchronized()

    # Internals -----------------------------------------------------------------------------

    def _cpu_manager_check(self, asked: CPUSet, what: str) -> None:
        """The kubelet sets cpusets only with a CPU manager policy other than none.

        Then two would pin containers: nodedra's cpuset wins (it answers last), but the
        kubelet's CPU manager accounts CPUs nodedra gives away. Said loudly, and counted.
        """
        if not asked.cpus:
            return
        with self._state:
            self.cpu_manager_conflicts += 1
            now = time.monotonic()
            if now - self._warned < CONFLICT_WARNING_PERIOD:
                return
            self._warned = now
        log.error(
            "the kubelet asked for cpuset %s for %s: its CPU manager policy is not none, so "
            "it pins containers too, and the CPUs it hands out are nodedra's to give. Set "
            "cpuManagerPolicy: none in the kubelet's configuration on nodes nodedra pins",
            asked.cpus,
            what,
        )

    def _refresh(self, uids: Sequence[str]) -> None:
        """Read whom claims ``uids`` are reserved for now (pods share claims).

        The kubelet prepares a claim once per node, when its first pod starts; a later pod
        of the node that shares it is in its ``reservedFor`` only from then on.
        """
        for uid in uids:
            with self._lock():
                known = self._reservations().get(uid)
            if known is None or not known.name:
                continue
            try:
                claim = self._api.get_claim(known.namespace, known.name)
            except KubeAPIError as err:
                log.warning("claim %s: cannot read whom it is reserved for: %s", uid, err)
                continue
            if str((claim.get("metadata") or {}).get("uid")) != uid:
                continue
            pods = reserved_pods(claim)
            with self._lock():
                current = self._reservations()
                if uid in current:
                    current[uid] = Reservation(known.namespace, known.name, pods)
