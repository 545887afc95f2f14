"""The resource manager: the Owner of the DRA and NRI plugins and the host of the policy.

It holds the one lock that every kubelet request, every runtime event and every change of
policy state takes, makes each allocation durable before the plugin writes the claim's CDI
spec, and runs the start-up in the order that leaves nothing unaccounted: load the
checkpoint, let the policy take its claims back, remove the specs of claims nobody holds,
connect to the container runtime (or stand by while another instance is: ``nrirole``),
register and publish, and only then serve claims.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from nodedra.dra import (
    AllocationResult,
    ClaimRef,
    ClusterAPI,
    Options,
    Plugin,
    PluginSettings,
    driver_name,
)
from nodedra.dra.claims import claim_ref
from nodedra.lib import faults
from nodedra.nri import PINNING_MODES, NRIPlugin, PluginOptions
from nodedra.policy import Grant, Policy, PolicyConfig, PolicyError

from .batchlock import BatchLock
from .checkpoint import FILE_NAME, Checkpoint
from .containers import ContainerPinner, reserved_pods
from .ledger import Ledger, reservations_of
from .nrirole import NRIRole
from .pinning import Books, Holdings, Reservation

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ManagerOptions(PluginSettings):
    """The plugin's settings, where the checkpoint lives, and how containers are pinned."""

    state_dir: Path | str | None = None
    """Where the checkpoint lives; None: the plugin data directory."""
    pinning: str = "off"
    """One of PINNING_MODES."""
    nri: PluginOptions = field(default_factory=PluginOptions)
    hold: Callable[[], str | None] = lambda: None
    """Why pinning must not happen now (the kubelet's CPU manager pins too), or None: then
    claims are refused with that reason and containers keep the cpusets the kubelet gives."""


class ResourceManager:
    """Owner of the plugin, host of the policy, keeper of the checkpoint."""

    def __init__(
        self,
        policy: Policy,
        kube_client: k8s.ApiClient | ClusterAPI,
        options: ManagerOptions,
        on_shutdown: Callable[[str], None],
    ) -> None:
        self._lock = BatchLock()
        self._policy = policy
        self._on_shutdown = on_shutdown
        self.driver = driver_name(policy.name)
        if options.pinning not in PINNING_MODES:
            raise ValueError(f"pinning mode {options.pinning!r} is not one of {PINNING_MODES}")
        self.pinning_mode = options.pinning
        self._hold = options.hold
        # The manager is the plugin's policy too: it notes whom each claim is reserved for.
        self.plugin = Plugin(
            self.driver,
            Options(**options.plugin_settings(), kube_client=kube_client, owner=self, policy=self),
        )
        state_dir = Path(options.state_dir or self.plugin.plugin_data_dir)
        self.ledger = Ledger(Checkpoint(state_dir / FILE_NAME))
        self.checkpoint = self.ledger.checkpoint
        self._reservations: dict[str, Reservation] = {}
        self._updates_due = False
        self.containers: ContainerPinner | None = None
        self.nri: NRIPlugin | None = None
        self._nri_role: NRIRole | None = None
        if options.pinning != "off":
            self.containers = ContainerPinner(
                lock=lambda: self,
                policy=policy,
                driver=self.driver,
                reservations=lambda: self._reservations,
                api=self.plugin.cluster_api,
                on_synchronized=self.plugin.allow_claims,
                on_changed=self._request_updates,
                lock_idle=self._lock.idle,
                held=lambda: self._hold() is not None,
            )
            self.nri = NRIPlugin(self.containers, options.nri)
            self._nri_role = NRIRole(self.nri, self.containers, self.plugin.plugin_data_dir)
            self._nri_socket = options.nri.socket_path
        self._pending: faults.SlotPoints | None = None
        """The request under the lock changed the books since the last save: its kind."""
        self.holds = 0
        """How many times the lock was taken (under it): every change holds it, so what was
        read at one count is current as long as the count stays (``/status``'s copy)."""
        self.released = threading.Event()
        """Set whenever the lock is given back: for those waiting for the count to grow."""
        self._claims_changed = False
        self._claims_listeners: list[Callable[[], None]] = []

    @property
    def policy(self) -> Policy:
        """The policy hosted (use it under the lock)."""
        return self._policy

    # The lock --------------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock every change of policy state holds, once no request is in flight.

        What the holder sees is then durable, and every claim held has its CDI spec (a batch
        of kubelet requests lets the lock go while it waits for its commit).

        During a rolling update another instance of the driver may have committed since we
        last looked: the policy then takes the checkpoint's claims back before anything
        reads or changes them, so the two instances never work from different books.
        """
        if not self._lock.acquire(blocking, timeout):
            return False
        self.holds += 1
        try:
            self._catch_up()
        except BaseException:
            self._lock.release()
            raise
        return True

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Hold the lock for one kubelet request (`Owner.batched`).

        `commit` may commit it with other requests. Those waiting in `acquire` go first.
        """
        self._lock.hold_for_request()
        self.holds += 1
        try:
            self._catch_up()
            yield
        finally:
            self._lock.request_done()  # still holding the lock, which release gives back
            self.release()

    def release(self) -> None:
        """Give the lock back; then the runtime is told of the changes made under it.

        Not before: the runtime holds its own lock while it asks us about a container, and
        that question waits for ours. A change nobody committed (a request that failed
        half-way) is committed first: what the lock protects is durable when it is free.
        """
        if self._pending is not None:
            try:
                self._commit_now()
            except Exception:
                log.exception("committing the changes of a request that did not commit failed")
        due, self._updates_due = self._updates_due, False
        changed, self._claims_changed = self._claims_changed, False
        self._lock.release()
        self.released.set()
        if due and self.nri is not None:
            self.nri.request_updates()
        if changed:
            for listener in self._claims_listeners:
                listener()

    def _request_updates(self) -> None:
        """Whom a claim is reserved for changed (outside the lock): containers may move."""
        if self.nri is not None:
            self.nri.request_updates()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: Any) -> None:
        self.release()

    # The Owner protocol ----------------------------------------------------------------

    def claim_allocated(self) -> None:
        """Note an allocation; ``commit``, at the end of the request, makes it durable.

        The containers that must give up its CPUs are told once the lock is released (and
        in any case before a container of the claim starts: its creation updates them).
        """
        self._pending = self._pending or faults.PREPARE_CHECKPOINT
        self._books_changed()

    def claim_released(self) -> None:
        """Note a release; its CPUs go back to the shared pool once committed."""
        self._pending = self._pending or faults.UNPREPARE_CHECKPOINT
        self._books_changed()

    def commit(self) -> None:
        """Make the request's changes durable, with those of requests waiting for the lock.

        The `Owner` commit, called with the lock held, which it may let go
        meanwhile (see `batchlock`): one checkpoint write for the whole request instead of
        one per claim, and one for all the requests that came in together. If the write
        fails, each of them fails, and the policy takes back what the checkpoint holds, so
        that what it grants next rests on exactly what a restart (or, during a rolling
        update, the other instance) reads: the state before those requests, or, when the
        failure came after the new checkpoint was put in place (its directory's fsync), the
        state with them. Then their claims stay held without specs, as after a crash at
        that point; the kubelet is told a claim is prepared only once a commit of it is
        durable, which its retry makes (writing again, syncing the directory).
        """
        if self._pending is not None:
            self._lock.wait_for_commit(self._commit_now)

    def _commit_now(self) -> None:
        """Save the policy's state for the current batch (lock held).

        If the save fails, the policy takes back what the checkpoint holds (as of the
        failure: see `_save`), then it raises.
        """
        points, self._pending = self._pending, None
        if points is None:
            return

        def save() -> None:
            try:
                self._save(points)
            except Exception:
                self._take_back_durable()
                raise

        self._lock.commit_batch(save)

    # The ClaimPolicy protocol (the plugin's; the policy decides) -----------------------

    def allocate_claim(
        self, claim: Mapping[str, Any], results: Sequence[AllocationResult]
    ) -> Sequence[Mapping[str, Any]]:
        """The policy's allocation, and a note of whom the claim is reserved for.

        With pinning required, refused while the runtime is not connected: the runtime
        would start the claim's containers without asking us, on any CPU. With pinning,
        refused while pinning is held (``ManagerOptions.hold``): the kubelet's CPU manager
        hands out the CPUs a claim would get.
        """
        if self.pinning_mode == "required" and not self.runtime_ready():
            raise RuntimeError(
                f"not connected to the container runtime on {self._nri_socket} "
                f"({self.runtime_detail()}): with --pinning=required claims are refused until "
                "it is, so that no container runs unpinned; the kubelet retries"
            )
        held = self._hold() if self.pinning_mode != "off" else None
        if held is not None:
            raise RuntimeError(f"claims are refused on this node: {held}")
        edits = self._policy.allocate_claim(claim, results)
        ref = claim_ref(claim)
        self._reservations[ref.uid] = Reservation(ref.namespace, ref.name, reserved_pods(claim))
        return edits

    def result_attributes(self, uid: str) -> Sequence[Mapping[str, Mapping[str, object]]]:
        """The policy's description of claim ``uid``'s results, for its device metadata."""
        return self._policy.result_attributes(uid)

    def release_claim(self, uid: str) -> None:
        """The policy's release; the claim is reserved for nobody any more."""
        self._policy.release_claim(uid)
        self._reservations.pop(uid, None)

    def holds_claim(self, uid: str) -> bool:
        """Whether the policy holds claim ``uid``: committed, or in the batch under way."""
        return uid in self._policy.claim_uids()

    # Claims the kubelet will not unprepare ---------------------------------------------

    def unprepare_orphans(self, uids: Iterable[str]) -> dict[str, Exception | None]:
        """Unprepare claims ``uids``, whose ResourceClaims are gone, as the kubelet would.

        The kubelet names a claim by namespace, name and UID, and its device metadata lives
        under the first two: each claim is named as its reservation (kept in the checkpoint)
        says, read under the lock after catching up, and by its UID alone where none says
        (a claim of a checkpoint from before reservations were kept), which the stores
        remove by too. Each claim's answer by UID: None, or why it failed.
        """
        with self:
            refs = [self._claim_ref(uid) for uid in sorted(uids)]
        # As a kubelet request: under the lock shared with a rolling update's other pod.
        return self.plugin.node_unprepare(refs)

    def _claim_ref(self, uid: str) -> ClaimRef:
        """Claim ``uid`` as fully named as its reservation knows (lock held)."""
        reservation = self._reservations.get(uid)
        if reservation is None:
            return ClaimRef("", "", uid)
        return ClaimRef(reservation.namespace, reservation.name, uid)

    # The runtime connection ------------------------------------------------------------

    def runtime_ready(self) -> bool:
        """Whether containers are pinned now: connected, or another instance is."""
        return self._nri_role is not None and self._nri_role.ready()

    def runtime_detail(self) -> str:
        """The runtime connection in words."""
        return "pinning is off" if self._nri_role is None else self._nri_role.detail()

    def request_shutdown(self, reason: str) -> None:
        """Hand ``reason`` to whoever runs the process; safe from any thread."""
        log.error("shutdown requested: %s", reason)
        self._on_shutdown(reason)

    # Reading what is committed, without the lock ---------------------------------------

    def committed_grants(self, uid: str) -> tuple[Grant, ...]:
        """What claim ``uid`` holds as last committed; () if nothing.

        Readers outside kubelet requests (the claim status writer, the orphan check) need
        what is durable, not what a request in flight is deciding, so they do not wait for
        the lock: the view is replaced on every commit. Only when another instance may have
        committed since (rolling updates) is the lock taken, to catch up first.
        """
        return self._committed_view().get(uid, ())

    def claimed_cpus(self) -> frozenset[int]:
        """The CPUs the claims hold, as last committed (see :meth:`committed_grants`)."""
        return frozenset().union(*(g.cpus for gs in self._committed_view().values() for g in gs))

    def on_claims_changed(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (outside the lock, once committed) whenever claims come or go."""
        self._claims_listeners.append(listener)

    def committed_claims(self) -> frozenset[str]:
        """The UIDs of the claims held as last committed (see :meth:`committed_grants`)."""
        return frozenset(self._committed_view())

    def _committed_view(self) -> Mapping[str, tuple[Grant, ...]]:
        if self.plugin.sockets.lock is not None and self.ledger.replaced():
            with self:  # catches up with the other instance's commits
                pass
        return self.ledger.committed

    def holdings(self) -> Holdings | None:
        """Every claim's CPUs and every container's, at one moment; None if the lock is busy.

        For a person asking (``/status``): claims, whom they are reserved for and where
        each container runs must agree with each other, so they are read together under
        the lock; but only when nobody holds it or waits for it (kubelet requests and
        runtime events come first), and only references to what does not change are taken
        under it. The decisions of each container are made after, outside it.
        """
        if not self._lock.idle() or not self.acquire(blocking=False):
            return None
        try:
            policy = self._policy
            books = Books(
                grants={uid: policy.grants(uid) for uid in policy.claim_uids()},
                reservations=dict(self._reservations),
                online=policy.online_cpus(),
                allocated=policy.allocated_cpus(),
                isolated=policy.isolated_cpus(),
            )
            reserved = policy.config.reserved_cpus
            pinner = self.containers
            if pinner is None:
                return Holdings(books, reserved, None, {}, None)
            pinning = pinner.pinning
            tracked = pinning.tracked()
            pods = {pod.uid: pod for pod in pinning.pods.values() if pod.uid}
            connected = pinner.connected
        finally:
            self.release()
        views = pinning.view(books, tracked)
        for view in views:
            if view.pod.uid:
                pods.setdefault(view.pod.uid, view.pod)
        return Holdings(books, reserved, tuple(views), pods, connected)

    # The PolicyHost protocol -----------------------------------------------------------

    def publish_devices(self, devices: Sequence[Mapping[str, Any]]) -> None:
        """Publish the policy's devices. Takes no lock: the policy calls it holding ours."""
        self.plugin.publish(devices)

    # Lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Restore, sweep, register and publish, then serve claims.

        Raises CheckpointError (or PolicyError) without starting anything when the saved
        state cannot be used: serving claims on top of state we could not read would give
        CPUs that running containers hold to new claims.
        """
        with self.plugin.instance_lock.held(), self._lock:
            state = self.checkpoint.load()
            claims: Mapping[str, Any] = {}
            if state is not None:
                self.ledger.check_owner(state, self._policy)
                claims = state.claims
                self._reservations = reservations_of(state)
            self._check_pinnable(self._policy.config)
            self._policy.start(self, claims)
            self._save()
            self._sweep_specs()
            for leftover in (
                *self.checkpoint.remove_leftovers(),
                *self.plugin.cdi.remove_leftovers(),
                *self.plugin.metadata.remove_leftovers(),
            ):
                log.info("removed %s, left by a write that a crash interrupted", leftover)
        if self._nri_role is not None:
            self._nri_role.start()  # connects, or stands by while another instance is
        self.plugin.start()
        connecting = self._nri_role is not None and not self._nri_role.standing_by
        if self.pinning_mode != "required" or not connecting:
            # Otherwise the runtime's first Synchronize allows them (ContainerPinner).
            self.plugin.allow_claims()
        log.info(
            "resource manager started: policy %s, %d claims held, pinning %s",
            self._policy.name,
            len(self._policy.claim_uids()),
            self.pinning_mode,
        )

    def stop(self) -> None:
        """Stop serving (outside the lock: requests in flight hold it), then save.

        The save takes the locks a kubelet request takes, in the same order, and catches
        up first: during a rolling update the other instance may have committed since.
        A manager whose start never read the checkpoint (it refused it) saves nothing: its
        empty books would replace the claims the admin must still recover.
        """
        self.plugin.stop()
        if self._nri_role is not None:
            self._nri_role.stop()
        if self.ledger.seen is None:
            return
        with self.plugin.instance_lock.held(), self:
            self._save()

    def reconfigure(self, config: PolicyConfig) -> None:
        """Apply ``config`` live; PolicyError leaves the old one in force.

        Under the locks a kubelet request takes, in the same order, after catching up: a
        configuration must be checked against every claim granted, including those another
        instance committed during a rolling update.
        """
        with self.plugin.instance_lock.held(), self:
            self._check_pinnable(config)
            self._policy.reconfigure(config)

    # Internals -------------------------------------------------------------------------

    def _books_changed(self) -> None:
        """Claims came or went (lock held): containers may have to change CPUs."""
        self._claims_changed = True
        if self.containers is not None:
            self.containers.pinning.books_changed()
            self._updates_due = True

    def _check_pinnable(self, config: PolicyConfig) -> None:
        """With pinning, a configuration must leave a CPU no claim can take.

        Reserved CPUs are the shared pool's for good: without one, the claims could take
        every CPU and leave the containers without claims nowhere to run.
        """
        if self.nri is None:
            return
        if not config.reserved_cpus & self._policy.online_cpus():
            raise PolicyError(
                "with pinning on, reservedCPUs must name at least one online CPU: reserved "
                "CPUs are where containers without claims always run (set reservedCPUs, "
                "e.g. to CPU 0's core, or --pinning=off)"
            )

    def _save(self, crash_points: faults.SlotPoints | None = None) -> None:
        """Write the policy's state to the checkpoint (lock held; `Ledger.save`)."""
        self.ledger.save(self._policy, self.driver, self._reservations, crash_points)

    def _catch_up(self) -> None:
        """Take back the checkpoint if another instance replaced it (rolling updates only)."""
        if self.plugin.sockets.lock is None:
            return
        reservations = self.ledger.catch_up(self._policy, self.driver)
        if reservations is not None:
            self._reservations = reservations
            self._books_changed()

    def _take_back_durable(self) -> None:
        """Make the policy hold what the checkpoint holds (a commit failed; lock held)."""
        self._reservations = self.ledger.take_back(self._policy)
        self._books_changed()

    def _sweep_specs(self) -> None:
        """Remove the CDI specs and metadata of claims the policy does not hold (a crash's)."""
        held = self._policy.claim_uids()
        for uid in self.plugin.cdi.claim_uids():
            if uid not in held:
                log.info("removing the CDI spec of claim %s, which no policy holds", uid)
                self.plugin.cdi.remove_claim(uid)
        for uid in self.plugin.metadata.remove_unheld(held):
            log.info("removed the device metadata of claim %s, which no policy holds", uid or "?")
