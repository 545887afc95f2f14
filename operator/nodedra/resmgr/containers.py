"""The resource manager's side of NRI: answering the runtime about each container.

Every answer is decided under the resource manager's lock (the one kubelet requests hold),
from the books as committed: the claims the policy holds, whom each was reserved for, the
CPUs no claim holds. Changes made outside an event (a prepare, an unprepare) are found by
comparing what each container should run on with what the runtime was last told, and sent
by the NRI plugin after the lock is released.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from nodedra.dra import ClusterAPI, KubeAPIError
from nodedra.nri import Container, CPUSet, Pod, Update
from nodedra.policy import Policy

from .pinning import Books, Decision, Pinning, Reservation, same

log = logging.getLogger(__name__)

CONFLICT_WARNING_PERIOD = 600.0
"""Seconds between two error lines about the kubelet's CPU manager pinning too."""
REFRESH_WAIT = 0.5
"""Seconds an event waits for claims to be read (the runtime's NRI timeout is 2 s)."""


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
    """Implements the NRI plugin's RuntimeOwner for the resource manager.

    Whatever the runtime sends about a container (names, devices, cpusets), a failure to
    make sense of it is that container's alone: it gets the shared pool, a warning names
    it, ``invalid_total``/``errors`` count it, and the connection and every other
    container go on as before.
    """

    def __init__(
        self,
        *,
        lock: Callable[[], AbstractContextManager[object]],
        policy: Policy,
        driver: str,
        reservations: Callable[[], dict[str, Reservation]],
        api: ClusterAPI,
        on_synchronized: Callable[[], None],
        on_changed: Callable[[], None] = lambda: None,
        lock_idle: Callable[[], bool] = lambda: False,
        refresh_wait: float = REFRESH_WAIT,
        held: Callable[[], bool] = lambda: False,
    ) -> None:
        self._held = held
        """Whether pinning is held (the kubelet's CPU manager pins): cpusets are left alone."""
        self._lock = lock
        self._lock_idle = lock_idle
        self._policy = policy
        self._reservations = reservations
        self._api = api
        self._on_synchronized = on_synchronized
        self._on_changed = on_changed
        self._refresh_wait = refresh_wait
        self.pinning = Pinning(driver, policy.results_in_environment)
        self._reads = ClaimReads(self._read_reservation)
        self._state = threading.Lock()  # guards the fields below, never held long
        self._connected = False
        self._warned = -CONFLICT_WARNING_PERIOD
        self.cpu_manager_conflicts = 0
        """Cpusets the kubelet asked for (for the metrics): a CPU manager is at work."""
        self.errors = 0
        """Events whose handling failed unexpectedly (for the metrics): each the failure
        of the one container it concerned, which got the shared pool."""
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
                isolated=policy.isolated_cpus(),
            )

    # RuntimeOwner ------------------------------------------------------------------------

    def idle(self) -> bool:
        """Whether nobody holds or waits for the resource manager's lock just now."""
        return self._lock_idle()

    def synchronize(self, pods: Sequence[Pod], containers: Sequence[Container]) -> list[Update]:
        """Start again from what the runtime has: every container to what it should run on.

        Containers naming a claim not reserved for their pod as far as the books know
        (a pod that shares the claim since its prepare, created while we were away) are
        decided once whom those claims are reserved for has been read again.
        """
        if self._held():
            log.warning("pinning is held: the %d containers keep their cpusets", len(containers))
            return []
        known = {pod.id: pod for pod in pods}

        def pod_of(container: Container) -> Pod:
            return known.get(container.pod_id) or Pod(container.pod_id, "", "", "")

        with self._books() as books:
            unreserved = set()
            for container in containers:
                pod = pod_of(container)
                with contextlib.suppress(Exception):  # then it fails below, on its own
                    unreserved |= _refreshable(pod, self.pinning.decide(pod, container, books))
        self._refresh(unreserved)
        updates = []
        with self._books() as books:
            self.pinning.reset(pods)
            for container in containers:
                pod = pod_of(container)
                try:
                    decision = self.pinning.decide(pod, container, books)
                    self.pinning.track(pod, container, decision, decision.cpuset)
                    if not same(decision.cpuset, container.cpuset):
                        updates.append(Update(container.id, decision.cpuset))
                except Exception:  # a bug of ours: this container's failure, not the rest's
                    shared = self._failed("Synchronize", pod, container, books)
                    updates.append(Update(container.id, shared))
        return updates

    def create_container(
        self, pod: Pod, container: Container
    ) -> tuple[CPUSet | None, list[Update]]:
        """Pin the new container, and bring any other container still behind up to date."""
        self._cpu_manager_check(container.cpuset, f"container {container.name!r} of pod {pod}")
        if self._held():  # the kubelet's CPU manager pins: nodedra must not fight it
            return None, []
        try:
            with self._books() as books:
                self.pinning.pods[pod.id] = pod
                decision = self.pinning.decide(pod, container, books)
                if not _refreshable(pod, decision):
                    return self._created(pod, container, decision, books)
            self._refresh(decision.unreserved)  # outside the lock: API calls
            with self._books() as books:
                decision = self.pinning.decide(pod, container, books)
                return self._created(pod, container, decision, books)
        except Exception:  # a bug of ours: this container's failure, not the rest's
            return self._failed("CreateContainer", pod, container), []

    def _created(
        self, pod: Pod, container: Container, decision: Decision, books: Books
    ) -> tuple[CPUSet | None, list[Update]]:
        self.pinning.track(pod, container, decision, decision.cpuset)
        others = self.pinning.stale(books, exclude=container.id)
        self.pinning.told(others)
        return decision.cpuset, others

    def update_container(self, pod: Pod, container: Container, requested: CPUSet) -> list[Update]:
        """The kubelet changes a container's resources: its cpuset stays ours."""
        self._cpu_manager_check(requested, f"container {container.name!r} of pod {pod}")
        if self._held():
            return []
        try:
            with self._books() as books:
                decision = self.pinning.decide(pod, container, books)
            if _refreshable(pod, decision):
                self._refresh(decision.unreserved)
            with self._books() as books:
                decision = self.pinning.decide(pod, container, books)
                self.pinning.track(pod, container, decision, decision.cpuset)
                return [Update(container.id, decision.cpuset)]
        except Exception:  # a bug of ours: this container's failure, not the rest's
            return [Update(container.id, self._failed("UpdateContainer", pod, container))]

    def container_started(self, pod: Pod, container: Container) -> bool:
        """A container we never saw created is adopted: True if its cpuset is to change.

        The runtime created it while it was synchronizing us, and told us of it in neither
        (containerd#13698, cri-o#10090); until now it ran with whatever the kubelet gave it,
        perhaps on claimed CPUs.
        """
        try:
            with self._books() as books:
                if container.id in self.pinning.containers:
                    return False
                decision = self.pinning.decide(pod, container, books)
            if _refreshable(pod, decision):
                self._refresh(decision.unreserved)
            with self._books() as books:
                if container.id in self.pinning.containers:
                    return False
                self.pinning.pods.setdefault(pod.id, pod)
                decision = self.pinning.decide(pod, container, books)
                self.pinning.track(pod, container, decision, container.cpuset)
                if same(decision.cpuset, container.cpuset):
                    return False
                self.pinning.behind = True
        except Exception:  # a bug of ours: this container's failure, not the rest's
            self._failed("StartContainer", pod, container)
            with self._lock():  # it still runs with what it started with: send it the pool
                known = self.pinning.containers.get(container.id)
                if known is not None:
                    known.told = None
                self.pinning.behind = True
            return True
        log.warning(
            "container %r of pod %s started without our having seen it created (the runtime "
            "created it while synchronizing us): it is moved to CPUs %s",
            container.name,
            pod,
            decision.cpuset.cpus,
        )
        return True

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
            return self.pinning.stale_to_send(books)

    def updates_sent(self, sent: Sequence[Update], failed: Sequence[str]) -> bool:
        """The runtime applied ``sent``, but for the containers ``failed`` names.

        True if updates are due again: the books changed while some were on their way.
        """
        with self._lock():
            self.pinning.sent(sent, failed)
            return self.pinning.behind and not failed

    def connection_changed(self, connected: bool, detail: str) -> None:
        """Note the runtime connection; claims may be served once it is synchronized."""
        with self._state:
            self._connected = connected
            self.detail = detail
        if connected:
            self._on_synchronized()

    # Whom claims are reserved for ----------------------------------------------------------

    def reservation_seen(self, uid: str, pods: frozenset[str]) -> None:
        """Claim ``uid`` is reserved for ``pods`` now (the claim watch, or a read of ours).

        Pods are only ever added: a pod that shares a claim is reserved after its prepare,
        and one that is done is removed once its containers are; pinning is for running
        containers, whose pods were reserved when they started. Containers of pods added
        are brought onto the claim's CPUs by the update sender.
        """
        known = self._reservations().get(uid)  # unlocked: a cheap look, checked again
        if known is None or pods <= known.pods:
            return
        with self._lock():
            current = self._reservations()
            known = current.get(uid)
            if known is None or pods <= known.pods:
                return
            current[uid] = Reservation(known.namespace, known.name, known.pods | pods)
            self.pinning.books_changed()
        self._on_changed()

    def _refresh(self, uids: Iterable[str]) -> None:
        """Read whom claims ``uids`` are reserved for now, waiting a bounded time.

        The runtime waits for our answer (2 s by default) while holding its own lock, so
        the API server is never waited for long here: a read that takes longer is applied
        when it ends, and the update sender then moves the containers it concerns.
        """
        self._reads.refresh(uids, self._refresh_wait)

    def _read_reservation(self, uid: str) -> None:
        with self._lock():
            known = self._reservations().get(uid)
        if known is None or not known.name:
            return
        try:
            claim = self._api.get_claim(known.namespace, known.name)
        except KubeAPIError as err:
            log.warning("claim %s: cannot read whom it is reserved for: %s", uid, err)
            return
        if str((claim.get("metadata") or {}).get("uid")) == uid:
            self.reservation_seen(uid, reserved_pods(claim))

    # Internals -----------------------------------------------------------------------------

    def _failed(
        self, event: str, pod: Pod, container: Container, books: Books | None = None
    ) -> CPUSet:
        """Handling ``event`` for ``container`` raised: it gets the shared pool.

        The shared pool is returned and tracked as the container's; the failure is logged
        and counted.
        """
        with self._state:
            self.errors += 1
        log.exception(
            "NRI %s of container %r (%s) of pod %s failed: it gets the shared pool",
            event,
            container.name,
            container.id,
            pod,
        )
        with contextlib.ExitStack() as stack:
            if books is None:
                books = stack.enter_context(self._books())
            shared = books.shared_cpuset
            with contextlib.suppress(Exception):
                self.pinning.track(pod, container, Decision(shared, {}), shared)
            return shared

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
            "the kubelet asked for cpuset %r for %s: its CPU manager policy is not none, so "
            "it pins containers too, and the CPUs it hands out are nodedra's to give. Set "
            "cpuManagerPolicy: none in the kubelet's configuration on nodes nodedra pins",
            asked.cpus,
            what,
        )


def _refreshable(pod: Pod, decision: Decision) -> set[str]:
    """The claims worth reading again for ``decision``.

    Those a pod names but, as far as the books know, is not reserved for; only for a pod
    with a UID, which a reservation can name.
    """
    return set(decision.unreserved) if pod.uid else set()


class ClaimReads:
    """Reads of claims off the runtime's event path, at most one in flight per claim.

    An event asks for the claims it needs and waits for them a bounded time; a claim
    already being read is waited for, not read again, so an event costs at most one read
    per claim, never one per container.
    """

    def __init__(self, read: Callable[[str], None]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._in_flight: dict[str, threading.Event] = {}

    def refresh(self, uids: Iterable[str], wait: float) -> None:
        """Read each of ``uids`` (once), waiting at most ``wait`` seconds in all."""
        waits = []
        with self._lock:
            for uid in sorted(set(uids)):
                done = self._in_flight.get(uid)
                if done is None:
                    done = self._in_flight[uid] = threading.Event()
                    threading.Thread(
                        target=self._run, args=(uid, done), name="claim-read", daemon=True
                    ).start()
                waits.append(done)
        deadline = time.monotonic() + wait
        for done in waits:
            if not done.wait(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "whom %d claims are reserved for was not read within %.1f s: their "
                    "containers are decided from what the books say, and moved once read",
                    len(waits),
                    wait,
                )
                return

    def _run(self, uid: str, done: threading.Event) -> None:
        try:
            self._read(uid)
        except Exception:
            log.exception("reading whom claim %s is reserved for failed", uid)
        finally:
            with self._lock:
                self._in_flight.pop(uid, None)
            done.set()
