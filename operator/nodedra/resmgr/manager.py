"""The resource manager: the Owner of the DRA plugin and the host of the policy.

It holds the one lock that every kubelet request and every change of policy state takes,
makes each allocation durable before the plugin writes the claim's CDI spec, and runs the
start-up in the order that leaves nothing unaccounted: load the checkpoint, let the policy
take its claims back, remove the specs of claims nobody holds, register and publish, and
only then serve claims.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kubernetes import client as k8s

from nodedra.dra import ClusterAPI, Options, Plugin, PluginSettings, driver_name
from nodedra.dra.endpoint import instance_lock
from nodedra.lib import faults
from nodedra.policy import Grant, Policy, PolicyConfig

from .checkpoint import FILE_NAME, Checkpoint, CheckpointError, State

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ManagerOptions(PluginSettings):
    """The plugin's settings, and where the checkpoint lives."""

    state_dir: Path | str | None = None
    """Where the checkpoint lives; None: the plugin data directory."""


class ResourceManager:
    """Owner of the plugin, host of the policy, keeper of the checkpoint."""

    def __init__(
        self,
        policy: Policy,
        kube_client: k8s.ApiClient | ClusterAPI,
        options: ManagerOptions,
        on_shutdown: Callable[[str], None],
    ) -> None:
        self._lock = threading.Lock()
        self._policy = policy
        self._on_shutdown = on_shutdown
        self.driver = driver_name(policy.name)
        self.plugin = Plugin(
            self.driver,
            Options(
                **options.plugin_settings(), kube_client=kube_client, owner=self, policy=policy
            ),
        )
        state_dir = Path(options.state_dir or self.plugin.plugin_data_dir)
        self.checkpoint = Checkpoint(state_dir / FILE_NAME)
        self._saved: tuple[int, int] | None = None
        """The checkpoint file we wrote or read last; None until the first start."""
        self._committed: Mapping[str, tuple[Grant, ...]] = MappingProxyType({})
        """What the checkpoint holds as of ``_saved``, readable without the lock."""

    @property
    def policy(self) -> Policy:
        """The policy hosted (use it under the lock)."""
        return self._policy

    # The lock --------------------------------------------------------------------------

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock every change of policy state holds.

        During a rolling update another instance of the driver may have committed since we
        last looked: the policy then takes the checkpoint's claims back before anything
        reads or changes them, so the two instances never work from different books.
        """
        if not self._lock.acquire(blocking, timeout):
            return False
        try:
            self._catch_up()
        except BaseException:
            self._lock.release()
            raise
        return True

    def release(self) -> None:
        """Give the lock back."""
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: Any) -> None:
        self.release()

    # The Owner protocol ----------------------------------------------------------------

    def claim_allocated(self) -> None:
        """Save the policy's state: the allocation outlives us from here on."""
        self._save(faults.PREPARE_CHECKPOINT)

    def claim_released(self) -> None:
        """Save the policy's state after a release."""
        self._save(faults.UNPREPARE_CHECKPOINT)

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

    def committed_claims(self) -> frozenset[str]:
        """The UIDs of the claims held as last committed (see :meth:`committed_grants`)."""
        return frozenset(self._committed_view())

    def _committed_view(self) -> Mapping[str, tuple[Grant, ...]]:
        if self.plugin.sockets.lock is not None and self.checkpoint.identity() != self._saved:
            with self:  # catches up with the other instance's commits
                pass
        return self._committed

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
        with instance_lock(self.plugin.sockets.lock), self._lock:
            state = self.checkpoint.load()
            claims: Mapping[str, Any] = {}
            if state is not None:
                self._check_owner(state)
                claims = state.claims
            self._policy.start(self, claims)
            self._save()
            self._sweep_specs()
            for leftover in (
                *self.checkpoint.remove_leftovers(),
                *self.plugin.cdi.remove_leftovers(),
            ):
                log.info("removed %s, left by a write that a crash interrupted", leftover)
        self.plugin.start()
        self.plugin.allow_claims()
        log.info(
            "resource manager started: policy %s, %d claims held",
            self._policy.name,
            len(self._policy.claim_uids()),
        )

    def stop(self) -> None:
        """Stop serving (outside the lock: requests in flight hold it), then save.

        The save takes the locks a kubelet request takes, in the same order, and catches
        up first: during a rolling update the other instance may have committed since.
        """
        self.plugin.stop()
        with instance_lock(self.plugin.sockets.lock), self:
            self._save()

    def reconfigure(self, config: PolicyConfig) -> None:
        """Apply ``config`` live; PolicyError leaves the old one in force.

        Under the locks a kubelet request takes, in the same order, after catching up: a
        configuration must be checked against every claim granted, including those another
        instance committed during a rolling update.
        """
        with instance_lock(self.plugin.sockets.lock), self:
            self._policy.reconfigure(config)

    # Internals -------------------------------------------------------------------------

    def _save(self, crash_points: faults.WritePoints | None = None) -> None:
        state = State(self._policy.name, self.driver, self._policy.snapshot())
        self.checkpoint.save(state, crash_points)
        self._saved = self.checkpoint.identity()
        self._take_view()

    def _take_view(self) -> None:
        """Make what the policy holds now the view of what is committed (lock held)."""
        policy = self._policy
        self._committed = MappingProxyType({u: policy.grants(u) for u in policy.claim_uids()})

    def _catch_up(self) -> None:
        """Take back the checkpoint if another instance replaced it (rolling updates only)."""
        if self.plugin.sockets.lock is None or self._saved is None:
            return
        current = self.checkpoint.identity()
        if current == self._saved:
            return
        state = self.checkpoint.load()
        if state is not None:
            self._check_owner(state)
            self._policy.restore(state.claims)
        self._saved = current
        self._take_view()
        log.info("took back the claims another instance of %s committed", self.driver)

    def _check_owner(self, state: State) -> None:
        if state.policy != self._policy.name and state.claims:
            raise CheckpointError(
                f"checkpoint {self.checkpoint.path} holds {len(state.claims)} claims of policy "
                f"{state.policy}, but policy {self._policy.name} is configured: switching "
                f"policies would lose them. Switch back to {state.policy}, or drain the "
                "node's pods that use DRA claims first."
            )

    def _sweep_specs(self) -> None:
        """Remove the CDI specs of claims the policy does not hold (left by a crash)."""
        held = self._policy.claim_uids()
        for uid in self.plugin.cdi.claim_uids():
            if uid not in held:
                log.info("removing the CDI spec of claim %s, which no policy holds", uid)
                self.plugin.cdi.remove_claim(uid)
