"""The resource manager's one lock, which kubelet requests that come in together share.

Every change of policy state holds this lock. Kubelet requests hold it through
:meth:`BatchLock.hold_for_request`; while other requests wait for it, a request whose
changes are made lets it go in :meth:`BatchLock.wait_for_commit` and waits until one commit
covers them all, made by the last of them (or by the first after ``BATCH_WAIT``). Everyone
else (runtime events, reconfiguration, readers of a consistent state) takes it with
:meth:`BatchLock.acquire`, which waits until no request is in flight: they never see a batch
between its changes and its commit, or between its commit and its CDI specs. New requests
let those waiting holders go first, so that nobody starves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

BATCH_WAIT = 0.02
"""Seconds the first request of a batch waits at most for others to join it before the
batch is committed: about the time a few requests' changes and one fsync take."""
KEPT_FAILURES = 64
"""Failed batches whose error is kept for the requests that waited for them: far more than
can be waiting, since a batch's requests look as soon as they have the lock back."""


class BatchLock:
    """A lock for kubelet requests that may be committed together, and for everyone else."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        """Notified, lock held, when a batch was committed (or not), or the waiting changed."""
        self._joining = 0
        """Kubelet requests waiting for the lock (counted under ``_counting``)."""
        self._counting = threading.Lock()
        self._others_queued = 0
        """Other holders inside :meth:`acquire` (counted under ``_counting``)."""
        self._requests_in_flight = 0
        """Kubelet requests holding the lock, or waiting for their batch's commit."""
        self._others_waiting = 0
        """Other holders of the lock waiting for a moment without requests."""
        self._batch = 0
        """The batch the changes made under the lock now will be committed in."""
        self._batch_opened: float | None = None
        """When the first request began waiting for the current batch's commit."""
        self._failures: dict[int, BaseException] = {}
        """Why the last batches that failed did (for those waiting for them)."""

    @property
    def requests_waiting(self) -> int:
        """Kubelet requests waiting to take the lock now."""
        return self._joining

    @property
    def others_waiting(self) -> int:
        """Other holders waiting to take the lock now: for it, or for a moment without requests.

        Tests look at both counts to know who waits before they let a holder go on.
        """
        return self._others_queued

    def idle(self) -> bool:
        """Whether nobody holds the lock or waits for it just now (a glance: it may change).

        The NRI connection handles an event on its reader thread when it is, saving a
        thread hand-off; when it is not, the event waits on a thread of its own.
        """
        return not (
            self._lock.locked() or self._joining or self._others_queued or self._requests_in_flight
        )

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock once no kubelet request is in flight; whether it was taken."""
        deadline = None if timeout < 0 else time.monotonic() + timeout
        with self._counting:
            self._others_queued += 1
        try:
            if not self._lock.acquire(blocking, timeout):
                return False
            try:
                quiet = self._quiet(blocking, deadline)
            except BaseException:
                self._lock.release()
                raise
        finally:
            with self._counting:
                self._others_queued -= 1
        if not quiet:
            self._lock.release()
        return quiet

    def release(self) -> None:
        """Give the lock back."""
        self._lock.release()

    def hold_for_request(self) -> None:
        """Take the lock for a kubelet request, after the holders waiting for a quiet moment."""
        with self._counting:
            self._joining += 1
        try:
            self._lock.acquire()
        finally:
            with self._counting:
                self._joining -= 1
        try:
            while self._others_waiting:
                self._changed.wait()
        except BaseException:
            self._lock.release()
            raise
        self._requests_in_flight += 1

    def request_done(self) -> None:
        """The request holding the lock is done with it (it still holds it: release next)."""
        self._requests_in_flight -= 1
        if not self._requests_in_flight:
            self._changed.notify_all()

    def wait_for_commit(self, commit: Callable[[], None]) -> None:
        """Wait (lock held, let go meanwhile) for the current batch's commit; raise its error.

        ``commit`` makes it (through `commit_batch`) when nobody else is coming, when a
        holder waits for a quiet moment, or after ``BATCH_WAIT``.
        """
        batch = self._batch
        if self._batch_opened is None:
            self._batch_opened = time.monotonic()
        while self._batch == batch:
            if (
                not self._joining
                or self._others_waiting
                or time.monotonic() - self._batch_opened >= BATCH_WAIT
            ):
                commit()
                break
            self._changed.wait(BATCH_WAIT)
        error = self._failures.get(batch)
        if error is not None:
            raise error

    def commit_batch(self, save: Callable[[], None]) -> None:
        """Commit the current batch with ``save`` (lock held); tell those waiting for it."""
        batch, self._batch = self._batch, self._batch + 1
        self._batch_opened = None
        try:
            save()
        except BaseException as err:
            self._failures = {b: e for b, e in self._failures.items() if b > batch - KEPT_FAILURES}
            self._failures[batch] = err
            raise
        finally:
            self._changed.notify_all()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _quiet(self, blocking: bool, deadline: float | None) -> bool:
        """Wait (lock held, let go meanwhile) until no request is in flight; whether none is."""
        self._others_waiting += 1
        self._changed.notify_all()  # a batch waiting for more requests commits now
        try:
            while self._requests_in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if not blocking or (remaining is not None and remaining <= 0):
                    return False
                self._changed.wait(remaining)
            return True
        finally:
            self._others_waiting -= 1
            if not self._others_waiting:
                self._changed.notify_all()
