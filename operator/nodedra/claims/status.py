"""Our entries of the ResourceClaims' ``status.devices``: what each prepared claim got.

The status writer keeps them in line with what the checkpoint holds, so that
``kubectl get resourceclaim -o yaml`` shows which CPUs and memory a claim got. Kubelet
requests (it is one of the plugin's observers) and the claim watch only queue claims; the
writer's thread writes them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nodedra.dra import ClaimRef, ClusterAPI, KubeAPIError, RequestReport
from nodedra.dra.claims import AllocationResult, ClaimError, claim_results
from nodedra.observability import StatusCounts
from nodedra.policy import Grant
from nodedra.resmgr import ResourceManager
from nodedra.topology import format_cpu_list

log = logging.getLogger(__name__)


QUIET_SECONDS = 0.25
"""Status writes wait until the kubelet has sent no request for this long..."""
MAX_DELAY_SECONDS = 2.0
"""...or until a claim's status has waited this long."""
RETRY_SECONDS = (0.5, 30.0)
"""First and longest wait, in seconds, before a failed status write is tried again."""
REFUSED = (400, 422)
"""Answers to a status write that trying again would only repeat: the server finds it
invalid (say, for a claim whose opaque parameters it re-encodes differently, see
docs/operations.md, "The ResourceClaim watch")."""


def status_entries(
    results: Sequence[AllocationResult], grants: Sequence[Grant]
) -> list[dict[str, Any]]:
    """Our ``status.devices`` entries: one per result, with what it got as ``data``."""
    entries = []
    for result, grant in zip(results, grants, strict=False):
        entry: dict[str, Any] = {
            "driver": result.driver,
            "pool": result.pool,
            "device": result.device,
            "data": {
                "cpus": format_cpu_list(grant.cpus),
                "mems": format_cpu_list(grant.mems),
                "memory": grant.memory,
            },
        }
        if result.share_id:
            entry["shareID"] = result.share_id
        entries.append(entry)
    return entries


class _WriteFailedError(Exception):
    """A status write failed in a way that trying again may mend."""


class StatusWriter:
    """Writes our entries of ``status.devices`` of the claims that changed, in a thread.

    Kubelet requests only enqueue: the kubelet must not wait for a status write, nor
    compete with one for the CPU and the GIL. So the writer waits until the kubelet has been
    quiet for ``quiet`` seconds (a burst of pod starts is served first), or until a claim
    has waited ``max_delay`` seconds, and a claim queued again before its turn is looked at
    once, in its newest state: a claim prepared and unprepared within the delay costs no
    write. What is written is what the checkpoint holds for the claim, compared with the
    claim as it was last seen (fetched by the prepare, or delivered by the watch), so that
    a claim whose status is already right costs no API call at all.

    A write that fails is tried again, after ``retry[0]`` seconds doubling up to
    ``retry[1]``, until it is made or the claim is gone (deleted, or replaced by one of
    another UID): nothing else would write it, since a claim is queued only when it
    changes. Each try reads the claim afresh, so that a conflict, or a claim changed or gone
    meanwhile, is seen. A write the server finds invalid is not tried again (it would be
    refused the same way), nor is a claim that cannot be parsed: either is queued again
    when the claim changes. Stopping tries each queued claim once more, and retries no
    longer.
    """

    def __init__(
        self,
        api: ClusterAPI,
        manager: ResourceManager,
        node_name: str,
        *,
        quiet: float = QUIET_SECONDS,
        max_delay: float = MAX_DELAY_SECONDS,
        retry: tuple[float, float] = RETRY_SECONDS,
    ) -> None:
        self._api = api
        self._manager = manager
        self._field_manager = f"nodedra-{node_name}"
        self._quiet = quiet
        self._max_delay = max_delay
        self._retry = retry
        self._pending: dict[str, _Job] = {}  # by claim UID, in the order first queued
        self._retrying: dict[str, _Job] = {}  # by claim UID: failed, waiting to try again
        self._last_request = -math.inf
        self._stopping = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._written = self._unchanged = self._failed = 0

    def counts(self) -> StatusCounts:
        """Writes made, skipped and failed so far, and claims waiting to be tried again."""
        with self._changed:
            retrying = len(self._retrying)
        return StatusCounts(self._written, self._unchanged, self._failed, retrying)

    def start(self) -> None:
        """Start the writer thread."""
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="claim-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Try what is queued once without waiting any longer, then stop."""
        thread, self._thread = self._thread, None
        if thread is not None:
            with self._changed:
                self._stopping = True
                self._changed.notify()
            thread.join()

    def enqueue(self, ref: ClaimRef, claim: Mapping[str, Any] | None = None) -> None:
        """Bring claim ``ref``'s status up to date soon; ``claim`` is how it looks now, if known."""
        with self._changed:
            self._wake_if_idle()
            self._queue(ref, claim)

    def request_done(self, report: RequestReport) -> None:
        """After a kubelet request: the claims it changed need their status written."""
        with self._changed:
            self._last_request = time.monotonic()
            self._wake_if_idle()
            for ref in report.claims:
                if report.errors.get(ref.uid) is None and ref.name:
                    self._queue(ref, report.fetched.get(ref.uid))

    def _wake_if_idle(self) -> None:
        """Wake the writer if it waits for work, or for a retry only (lock held).

        One with work waits for a deadline that it checks again when it wakes, and that a
        new request can only push back: waking it for each request would cost a thread
        switch per request, on the kubelet's time.
        """
        if not self._pending:
            self._changed.notify()

    def _queue(self, ref: ClaimRef, claim: Mapping[str, Any] | None) -> None:
        """Queue the newest state of a claim, keeping its place and age if already queued.

        The newest state wins: a snapshot taken by a prepare is newer than the queued job,
        and a job without one (an unprepare's) makes the writer read the claim afresh. A
        claim waiting to be tried again keeps its wait: a failing API server is not asked
        more often because a claim changed.
        """
        retrying = self._retrying.get(ref.uid)
        if retrying is not None:
            self._retrying[ref.uid] = replace(retrying, ref=ref, claim=claim)
            return
        queued = self._pending.get(ref.uid)
        since = queued.since if queued is not None else time.monotonic()
        self._pending[ref.uid] = _Job(ref, claim, since)

    def write(self, ref: ClaimRef, claim: Mapping[str, Any] | None = None) -> bool:
        """Make the claim's status name what we hold for it, once; whether a write was made.

        ``claim`` is the claim as last seen; without it, it is read from the API server.
        A failure is counted and logged, not retried (the writer's thread retries).
        """
        try:
            written = self._write(ref, claim)
        except _WriteFailedError as err:
            self._failed += 1
            log.warning("claim %s: %s", ref, err, extra={"claim": ref})
            return False
        self._count(written)
        return bool(written)

    def _count(self, written: bool | None) -> None:
        if written is None:
            self._failed += 1
        elif written:
            self._written += 1
        else:
            self._unchanged += 1

    def _write(self, ref: ClaimRef, claim: Mapping[str, Any] | None) -> bool | None:
        """Whether a write was made; None if it is refused for good.

        Refused for good: the claim cannot be described, or the server refuses what
        describes it; either is tried again only once the claim changes.

        _WriteFailedError: the claim could not be read or its status written.
        """
        try:
            if claim is None:
                claim = self._api.get_claim(ref.namespace, ref.name)
            if str(claim.get("metadata", {}).get("uid")) != ref.uid:
                return False  # replaced or gone: nothing of ours to describe
            results = claim_results(claim, self._manager.driver)
        except ClaimError as err:  # it stays so until it changes, and then it is queued
            log.warning(
                "claim %s: cannot describe it in its status: %s", ref, err, extra={"claim": ref}
            )
            return None
        except KubeAPIError as err:
            if err.not_found:
                return False
            raise _WriteFailedError(f"cannot read it for its status: {err}") from err
        desired = status_entries(results, self._manager.committed_grants(ref.uid))
        current = [
            d
            for d in (claim.get("status") or {}).get("devices") or []
            if d.get("driver") == self._manager.driver
        ]
        if _comparable(current) == _comparable(desired):
            return False
        return self._apply(ref, desired)

    def _apply(self, ref: ClaimRef, desired: list[dict[str, Any]]) -> bool | None:
        """Write our entries: True, or False if the claim is gone, None if refused for good.

        _WriteFailedError: the write failed, and may not if tried again.
        """
        try:
            self._api.apply_claim_status(ref, desired, self._field_manager)
        except KubeAPIError as err:
            if err.not_found:
                return False
            if err.status in REFUSED:
                log.warning(
                    "claim %s: the API server refuses its status: %s",
                    ref,
                    err,
                    extra={"claim": ref},
                )
                return None
            raise _WriteFailedError(f"writing its status failed: {err}") from err
        return True

    def _next(self) -> _Job | None:
        """The next claim to write once its time has come; None to stop.

        Stopping, every claim queued or waiting to be tried again comes at once.
        """
        with self._changed:
            while True:
                if self._stopping:
                    for jobs in (self._pending, self._retrying):
                        if jobs:
                            return jobs.pop(next(iter(jobs)))
                    return None
                now = time.monotonic()
                wait = math.inf
                if self._pending:
                    uid, job = next(iter(self._pending.items()))
                    due = min(self._last_request + self._quiet, job.since + self._max_delay)
                    if due <= now:
                        return self._pending.pop(uid)
                    wait = due - now
                if self._retrying:
                    uid, job = min(self._retrying.items(), key=lambda item: item[1].due)
                    if job.due <= now:
                        return self._retrying.pop(uid)
                    wait = min(wait, job.due - now)
                self._changed.wait(None if wait == math.inf else wait)

    def _run(self) -> None:
        while (job := self._next()) is not None:
            try:
                self._count(self._write(job.ref, job.claim))
                continue
            except _WriteFailedError as err:
                why = str(err)
            except Exception as err:  # one claim's trouble must not stop the writer
                log.exception(
                    "claim %s: writing its status failed", job.ref, extra={"claim": job.ref}
                )
                why = f"writing its status failed: {err!r}"
            self._failed += 1
            self._again(job, why)

    def _again(self, job: _Job, why: str) -> None:
        """Queue a claim whose write failed to be tried again, after a wait that doubles.

        A newer state queued meanwhile is the one tried; stopping, it is not tried again.
        """
        with self._changed:
            if self._stopping:
                log.warning(
                    "claim %s: %s; stopping, so its status is left as it is",
                    job.ref,
                    why,
                    extra={"claim": job.ref},
                )
                return
            wait = min(2 * job.wait, self._retry[1]) if job.wait else self._retry[0]
            newer = self._pending.pop(job.ref.uid, None)
            ref, claim = (newer.ref, newer.claim) if newer is not None else (job.ref, None)
            self._retrying[ref.uid] = _Job(
                ref, claim, job.since, wait=wait, due=time.monotonic() + wait
            )
        log.warning(
            "claim %s: %s; trying again in %g s", job.ref, why, wait, extra={"claim": job.ref}
        )


@dataclass(frozen=True)
class _Job:
    ref: ClaimRef
    claim: Mapping[str, Any] | None
    since: float
    """When the claim was first queued."""
    wait: float = 0.0
    """After a failed write: the wait before the next try (it doubles each time)."""
    due: float = -math.inf
    """After a failed write: when to try again."""


def _comparable(entries: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    keys = ("driver", "pool", "device", "shareID")
    return sorted((*(e.get(k) for k in keys), repr(e.get("data"))) for e in entries)
