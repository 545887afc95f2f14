"""The ledger: the checkpoint as the resource manager last wrote or read it.

The manager makes the policy's books durable before anything acts on them, and others read
what is committed without waiting for its lock. What that takes is kept here: the state the
checkpoint holds as last written or read (what a failed commit takes back), which write that
was (so that a state another instance committed during a rolling update is seen and taken
back), and a view of the grants committed, replaced on every commit, that readers take
without the lock. The manager calls all of it with its lock held, except `replaced` and
`committed`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

from nodedra.lib import faults
from nodedra.lib.durable import NotDurableError
from nodedra.policy import Grant, Policy

from .checkpoint import Checkpoint, CheckpointError, Identity, State
from .pinning import Reservation

log = logging.getLogger(__name__)


class Ledger:
    """The checkpoint, the state it holds as last written or read, and the committed view."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.seen: Identity | None = None
        """The checkpoint as we wrote or read it last; None until the first start (then
        an identity, also when there is no file: one made later is then noticed)."""
        self.committed: Mapping[str, tuple[Grant, ...]] = MappingProxyType({})
        """What the checkpoint holds as of ``seen``, readable without the lock."""
        self.durable: State | None = None
        """The state the checkpoint holds, as last written or read."""

    def replaced(self) -> bool:
        """Whether anyone wrote the checkpoint since we wrote or read it last."""
        return self.checkpoint.identity() != self.seen

    def save(
        self,
        policy: Policy,
        driver: str,
        reservations: Mapping[str, Reservation],
        crash_points: faults.SlotPoints | None = None,
    ) -> None:
        """Write the policy's state to the checkpoint; raise on failure.

        Once the new state is written it is what a restart and the other instance read,
        whatever fails after: from then on it is the durable state that a failed commit
        takes back, and the view of what is committed.
        """
        held = {uid: r.to_json() for uid, r in reservations.items() if uid in policy.claim_uids()}
        state = State(policy.name, driver, policy.snapshot(), held)
        try:
            identity = self.checkpoint.save(state, crash_points)
        except NotDurableError:
            self._on_disk(state, policy, self.checkpoint.identity())
            raise
        self._on_disk(state, policy, identity)

    def _on_disk(self, state: State, policy: Policy, identity: Identity) -> None:
        """``state`` is the checkpoint now: what a failed commit takes back, what is committed."""
        self.durable = state
        self.take_view(policy)
        self.seen = identity

    def take_view(self, policy: Policy) -> None:
        """Make what the policy holds now the view of what is committed."""
        self.committed = MappingProxyType({u: policy.grants(u) for u in policy.claim_uids()})

    def catch_up(self, policy: Policy, driver: str) -> dict[str, Reservation] | None:
        """Take back the checkpoint if another instance replaced it (rolling updates only).

        The policy then holds its claims; returns their reservations (None: none to take
        back). ``driver`` names the instances in the log.
        """
        if self.seen is None or self.checkpoint.identity() == self.seen:
            return None
        # What was read, and its identity, come from the same reads: a commit met half
        # written is read as the one before it, and read again once whole.
        state, identity = self.checkpoint.read()
        reservations = None
        if state is not None:
            self.check_owner(state, policy)
            policy.restore(state.claims)
            reservations = reservations_of(state)
            self.durable = state
        self.seen = identity
        self.take_view(policy)
        log.info("took back the claims another instance of %s committed", driver)
        return reservations

    def take_back(self, policy: Policy) -> dict[str, Reservation]:
        """Make the policy hold what the checkpoint holds (a commit failed).

        Returns the reservations of its claims. From the copy of the last state put in
        place or read, not from the disk, which just failed us: the state before the commit,
        or the commit's own if it was written before the failure.
        """
        durable = self.durable
        policy.restore(durable.claims if durable is not None else {})
        reservations = reservations_of(durable) if durable is not None else {}
        log.warning(
            "a commit failed: the policy holds the %d claims of the checkpoint again",
            len(durable.claims) if durable is not None else 0,
        )
        return reservations

    def check_owner(self, state: State, policy: Policy) -> None:
        """Refuse a checkpoint that holds claims of another policy than ``policy``."""
        if state.policy != policy.name and state.claims:
            raise CheckpointError(
                f"checkpoint {self.checkpoint.path} holds {len(state.claims)} claims of policy "
                f"{state.policy}, but policy {policy.name} is configured: switching "
                f"policies would lose them. Switch back to {state.policy}, or drain the "
                "node's pods that use DRA claims first."
            )


def reservations_of(state: State) -> dict[str, Reservation]:
    """The reservations of a checkpoint, of the claims it holds; CheckpointError if bad."""
    try:
        return {
            str(uid): Reservation.from_json(record)
            for uid, record in state.reservations.items()
            if uid in state.claims
        }
    except (ValueError, TypeError, AttributeError) as err:
        raise CheckpointError(f"the checkpoint's reservations are malformed: {err}") from None
