"""The index of the ResourceClaims allocated to our driver on our node, fed by the watch.

Every claim of the cluster streams past the claim watch (``nodedra.claims.watch``); the
index keeps the few that are ours, by UID, and says which raw watch events are worth
parsing at all. It also says whether it follows the cluster now (*synced*): the orphan
check (``nodedra.claims.orphans``) trusts nothing else.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from nodedra.dra import ClaimRef
from nodedra.dra.claims import ClaimError, claim_ref, claim_results


class ClaimIndex:
    """The claims allocated to our driver on our node, by UID; fed by the claim watch."""

    def __init__(self, driver: str, pool: str) -> None:
        self._driver = driver
        self._pool = pool
        self._marks = (_quoted(driver), _quoted(pool))
        self._claims: dict[str, ClaimRef] = {}
        self._uid_marks: tuple[bytes, ...] = ()
        self._synced = False
        self._stretch = 0  # how many times the index became synced
        self._lock = threading.Lock()

    def observe(self, event_type: str | None, claim: Mapping[str, Any]) -> ClaimRef | None:
        """Take a watch event; the claim's ref if it is allocated to us (and not deleted).

        Whether the claim has a result of ours is decided on the raw mapping first: the
        claims of other nodes and drivers, nearly all of them, are never parsed further.
        """
        ref: ClaimRef | None = None
        if event_type != "DELETED" and self._allocated_here(claim):
            try:
                results = claim_results(claim, self._driver)
                if any(r.pool == self._pool for r in results):
                    ref = claim_ref(claim)
            except ClaimError:  # malformed: not ours to prepare
                pass
        uid = _get(_get(claim, "metadata"), "uid")
        with self._lock:
            if ref is not None:
                self._claims[ref.uid] = ref
                self._uid_marks = tuple(_quoted(u) for u in self._claims)
                return ref
            if isinstance(uid, str) and self._claims.pop(uid, None) is not None:
                self._uid_marks = tuple(_quoted(u) for u in self._claims)
        return None

    def listed(self, uids: set[str]) -> None:
        """A complete list of the cluster's claims has been observed: ``uids`` are ours.

        Claims indexed before it and not in it were deleted while nobody watched.
        """
        with self._lock:
            self._claims = {u: r for u, r in self._claims.items() if u in uids}
            self._uid_marks = tuple(_quoted(u) for u in self._claims)
            self._synced = True
            self._stretch += 1

    def following(self) -> None:
        """The server took a watch resumed from the last version the index saw.

        It sends what changed since that version first, in order, so the index is as
        current again as any watched index is. Only after a complete list, though: a
        version is resumed from only once the list it follows is complete.
        """
        with self._lock:
            if not self._synced:
                self._synced = True
                self._stretch += 1

    def lost(self) -> None:
        """The watch ended or failed: until a list or a resumed watch, nothing new comes."""
        with self._lock:
            self._synced = False

    @property
    def synced(self) -> bool:
        """Whether the index follows the cluster now: if not, a missing claim means nothing.

        It does from a complete list, or a resumed watch, until that watch ends or fails.
        """
        return self._synced

    def stretch(self) -> int | None:
        """Which stretch of being synced the index is in (they are numbered); None if not.

        Two looks at the index in the same stretch saw it follow the cluster all along in
        between; in different stretches, it may have missed events for a while.
        """
        with self._lock:
            return self._stretch if self._synced else None

    def mentioned_in(self, event: bytes) -> bool:
        """Whether a raw watch event may concern us, so that it is worth parsing.

        It does if it names our driver and our pool (allocated to us, perhaps), or the UID
        of a claim we index (deallocated or deleted, perhaps); false hits only cost a parse.
        """
        driver, pool = self._marks
        if driver in event and pool in event:
            return True
        return any(mark in event for mark in self._uid_marks)

    def uids(self) -> frozenset[str]:
        """The UIDs of the claims indexed now."""
        with self._lock:
            return frozenset(self._claims)

    def __len__(self) -> int:
        with self._lock:
            return len(self._claims)

    def _allocated_here(self, claim: Mapping[str, Any]) -> bool:
        allocation = _get(_get(claim, "status"), "allocation")
        results = _get(_get(allocation, "devices"), "results")
        return isinstance(results, list) and any(
            _get(r, "driver") == self._driver and _get(r, "pool") == self._pool for r in results
        )


def _get(value: object, key: str) -> object:
    """``value[key]`` if ``value`` is a mapping, else None: for objects of any shape."""
    return value.get(key) if isinstance(value, Mapping) else None


def _quoted(text: str) -> bytes:
    return json.dumps(text).encode()
