"""Orphans: claims held here whose ResourceClaim is gone from the API.

The kubelet tells a driver which claims to prepare, but nobody tells it when a claim is gone
for good. With the claim index (``nodedra.claims.index``), nodedra reports claims it still
holds whose ResourceClaim has disappeared (and releases them only when asked to).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from nodedra.dra import ClaimRef

from .index import ClaimIndex

log = logging.getLogger(__name__)


class OrphanTracker:
    """Claims we hold whose ResourceClaim has been gone from the API for a while.

    A claim vanishes before the kubelet unprepares it more often than one would think
    (deleted with its pod), so only claims missing for longer than ``grace`` seconds count.

    Only an index that is synced now says a claim is missing: while the watch fails, a new
    claim never reaches the index, and releasing it would take the CPUs of a running pod.
    So the grace clocks run only between two checks of the same synced stretch: they stop
    when the watch ends or fails, and go on from where they were once it is back (a claim
    that went missing during it starts at zero). A clock that ran through the outage would
    count it as missing time, and release a claim the resumed watch has not delivered yet.
    """

    def __init__(
        self,
        index: ClaimIndex,
        held: Callable[[], frozenset[str]],
        grace: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._index = index
        self._held = held
        self._grace = grace
        self._clock = clock
        self._missing_for: dict[str, float] = {}  # seconds, counted while synced only
        self._last: tuple[int, float] | None = None  # the stretch and time of the last check
        self._reported: set[str] = set()

    def check(self) -> frozenset[str] | None:
        """The orphans now, each logged once when it becomes one; None if nothing is known.

        Nothing is known while the index is not synced: the watch has not listed yet, or
        it failed or ended and has not caught up again.
        """
        stretch = self._index.stretch()
        if stretch is None:
            self._last = None
            return None
        now = self._clock()
        missing = self._held() - self._index.uids()
        if self._index.stretch() != stretch:  # lost while we looked: the look may be stale
            self._last = None
            return None
        last, self._last = self._last, (stretch, now)
        elapsed = now - last[1] if last is not None and last[0] == stretch else 0.0
        self._missing_for = {
            u: self._missing_for[u] + elapsed if u in self._missing_for else 0.0 for u in missing
        }
        orphans = frozenset(u for u, gone in self._missing_for.items() if gone >= self._grace)
        for uid in sorted(orphans - self._reported):
            log.warning(
                "claim %s is held here but its ResourceClaim has been gone from the API for "
                "%.0f s; its CPUs stay allocated (set --release-orphans to release such claims)",
                uid,
                self._missing_for[uid],
                extra={"claim": ClaimRef("", "", uid)},
            )
        self._reported = set(orphans)
        return orphans
