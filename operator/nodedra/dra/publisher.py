"""Keeps the node's ResourceSlices published, in the background, whatever happens to them.

The kubelet deletes every slice of its node when it starts, and a driver's slices 30 s
after the driver goes away; people and controllers delete or edit slices too. So publishing
is not a single write: a thread re-applies the desired devices whenever they change, when
someone calls :meth:`SlicePublisher.resync` (the operator does on every watch event of our
slices), and every ``resync_period`` seconds in any case. A failed pass is retried with
exponential backoff, cut short by new devices or a resync, and reported as recoverable.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
from collections.abc import Callable, Sequence

from .errors import RecoverableError
from .slices import ApplyReport, Device, SliceApplier

log = logging.getLogger(__name__)

ErrorHandler = Callable[[Exception, str], None]


class SlicePublisher:
    """A thread that applies the latest devices until the server has them."""

    def __init__(
        self,
        applier: SliceApplier,
        on_error: ErrorHandler,
        *,
        resync_period: float = 30.0,
        min_backoff: float = 0.5,
        max_backoff: float = 30.0,
        adapt: Callable[[Sequence[Device]], Sequence[Device]] = lambda devices: devices,
    ) -> None:
        """A publisher for ``applier``'s pool.

        ``adapt`` turns the desired devices into what the server will keep, in each pass;
        its errors fail the pass, which is retried like any other.
        """
        self._applier = applier
        self._adapt = adapt
        self._on_error = on_error
        self._resync_period = resync_period
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._cond = threading.Condition()
        self._devices: list[Device] = []
        self._version = 0  # bumped by every publish() and resync()
        self._synced_version = -1
        self._last_report: ApplyReport | None = None
        self._last_error: Exception | None = None
        """Why the last pass failed; None once a pass has succeeded since."""
        self._stopping = False
        self._thread: threading.Thread | None = None

    def publish(self, devices: Sequence[Device]) -> None:
        """Make ``devices`` (copied) the desired state and apply it soon."""
        with self._cond:
            self._devices = copy.deepcopy(list(devices))
            self._version += 1
            self._cond.notify_all()

    def resync(self) -> None:
        """Check the server against the desired state now, e.g. after a watch event."""
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def start(self) -> None:
        """Start the thread; the first pass runs at once."""
        with self._cond:
            if self._thread is not None:
                raise RuntimeError("slice publisher already started")
            self._stopping = False
            self._version += 1
            self._thread = threading.Thread(target=self._run, name="slice-publisher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread, waiting for a pass in progress. The slices stay published."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._stopping = True
            self._cond.notify_all()
        if thread is not None:
            thread.join()

    def wait_synced(self, timeout: float) -> ApplyReport | None:
        """Wait until a pass has applied everything asked for so far; its report, or None."""
        with self._cond:
            target = self._version
            if self._cond.wait_for(lambda: self._synced_version >= target, timeout):
                return self._last_report
            return None

    def state(self) -> tuple[bool, str | None]:
        """Whether a pass has succeeded and none failed since, and the last failure if any.

        What readiness needs to know: the node's devices are on the API server (perhaps not
        the newest change yet, which is seconds away), or why they are not.
        """
        with self._cond:
            error = None if self._last_error is None else str(self._last_error)
            return self._last_report is not None and error is None, error

    def _run(self) -> None:
        backoff = self._min_backoff
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._stopping or self._version != self._synced_version,
                    self._resync_period,
                )
                if self._stopping:
                    return
                version, devices = self._version, self._devices
            try:
                report = self._applier.apply(self._adapt(devices))
            except Exception as err:  # every failure of a pass is retried
                self._on_error(RecoverableError(err), "publishing ResourceSlices failed")
                with self._cond:
                    self._last_error = err
                    # New devices or a resync (a watch event: the server is back) end the
                    # wait early; the backoff keeps growing until a pass succeeds.
                    self._cond.wait_for(functools.partial(self._retry_now, version), backoff)
                    if self._stop_requested():
                        return
                backoff = min(backoff * 2, self._max_backoff)
                continue
            backoff = self._min_backoff
            with self._cond:
                self._synced_version = version
                self._last_report = report
                self._last_error = None
                self._cond.notify_all()

    def _retry_now(self, failed_version: int) -> bool:
        """Whether a failed pass should be retried before its backoff is over."""
        return self._stopping or self._version != failed_version

    def _stop_requested(self) -> bool:
        """Whether stop() was called (a method: the flag changes while we wait)."""
        return self._stopping
