"""Which claims the kubelet requests in flight are preparing or unpreparing.

A request makes its changes under the owner's lock, but the owner's ``commit`` may let the
lock go while the request's batch waits for other requests, and the request writes (or
removes) its CDI specs only after that. So another request may meet a claim between one
request's change and its spec: two pods sharing a claim, or a pod going away while another
comes. What one of them does must never undo what the other reports:

- a prepare that fails releases a claim only if nobody else prepares it in the meantime
  (it was not held before, see `ClaimRequests`, and no other request took it up since);
  its release is then an unprepare like any other;
- a claim being prepared is not unprepared, and one being unprepared is not prepared: the
  second request's claim fails, and the kubelet retries it once the first is answered.

Only ever used with the owner's lock held, which guards it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from .claims import ClaimError, ClaimRef


@dataclass
class _Claim:
    """A claim some requests in flight prepare or unprepare (never both)."""

    preparing: bool
    requests: set[int] = field(default_factory=set)
    """The requests (their tokens' ids) that took it up."""
    shared: bool = False
    """A second request prepared it while the first was in flight: no failure releases it."""


class ClaimsInFlight:
    """The claims of the requests in flight, by UID."""

    def __init__(self) -> None:
        self._claims: dict[str, _Claim] = {}

    @contextmanager
    def request(self) -> Iterator[RequestClaims]:
        """One request's part, until the request is answered (the lock held throughout)."""
        mine = RequestClaims(self._claims)
        try:
            yield mine
        finally:
            mine.done()


class RequestClaims:
    """The claims one request takes up."""

    def __init__(self, claims: dict[str, _Claim]) -> None:
        self._claims = claims
        self._mine: set[str] = set()

    def check_prepare(self, ref: ClaimRef) -> None:
        """Raise if another request in flight unprepares ``ref``."""
        self._check(ref, preparing=True)

    def prepared(self, ref: ClaimRef) -> None:
        """This request allocated ``ref`` (or found it allocated) and will write its spec."""
        claim = self._take(ref, preparing=True)
        claim.shared = claim.shared or bool(claim.requests - {id(self)})

    def roll_back(self, ref: ClaimRef) -> bool:
        """Whether this request, whose prepare of ``ref`` failed, may release it again.

        Not if another request prepared it since this one did: that one may have answered
        already, or may still wait for its batch, and reports the claim prepared. If it
        may, the request now unprepares ``ref``, so that no other request prepares it
        until the release is committed and the spec removed.
        """
        claim = self._claims.get(ref.uid)
        if claim is None or claim.shared:
            return False
        claim.preparing = False
        return True

    def unprepare(self, ref: ClaimRef) -> None:
        """This request releases ``ref``; raise if another request in flight prepares it."""
        self._take(ref, preparing=False)

    def done(self) -> None:
        """The request is answered: its claims are no longer in flight for it."""
        for uid in self._mine:
            claim = self._claims[uid]
            claim.requests.discard(id(self))
            if not claim.requests:
                del self._claims[uid]
        self._mine.clear()

    def _take(self, ref: ClaimRef, *, preparing: bool) -> _Claim:
        self._check(ref, preparing=preparing)
        claim = self._claims.setdefault(ref.uid, _Claim(preparing))
        claim.requests.add(id(self))
        self._mine.add(ref.uid)
        return claim

    def _check(self, ref: ClaimRef, *, preparing: bool) -> None:
        claim = self._claims.get(ref.uid)
        if claim is None or claim.preparing == preparing or claim.requests <= {id(self)}:
            return
        doing = "unprepares" if preparing else "prepares"
        raise ClaimError(
            f"claim {ref}: another kubelet request {doing} it just now; "
            "the kubelet retries once that one is answered"
        )
