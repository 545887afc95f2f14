"""What the DRA plugin asks of those it works with, and what it tells them.

The plugin decides nothing: its owner serializes and commits (``Owner``), the policy
allocates (``ClaimPolicy``), observers hear how requests went (``RequestObserver``). These
contracts are their own module so that the plugin and the code serving its requests
(``requests.py``) both import them, and neither the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from .claims import AllocationResult, ClaimRef

ContainerEdits = Mapping[str, Any]


class Owner(Protocol):
    """Who the plugin serializes kubelet requests against, commits through, and asks to stop.

    The owner *is* a lock: the plugin takes it for every kubelet request, once per request,
    through ``batched`` (its ``commit`` may let it go while it waits to share a write). It
    makes the changes of a whole request durable at once: the kubelet learns of a prepared
    claim only from the answer, and a container can get a claim's CDI devices only after
    that, so one write before the claims' specs are written (and before the answer) keeps
    every guarantee of one write per claim.
    """

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock."""
        ...

    def release(self) -> None:
        """Give the lock back."""
        ...

    def __enter__(self) -> object: ...

    def __exit__(self, *exc_info: object) -> object: ...

    def batched(self) -> AbstractContextManager[object]:
        """The lock, held for one kubelet request (instead of ``with owner``).

        Its changes may be committed with those of other requests: ``commit`` may let the
        lock go while it waits for them.
        """
        ...

    def claim_allocated(self) -> None:
        """Note the allocation the policy just made; ``commit`` makes it durable.

        Called with the lock held, once per claim, before the request's commit: what a
        container may be started with must be on disk before its CDI spec is written.
        """
        ...

    def claim_released(self) -> None:
        """Note the release the policy just made; ``commit`` makes it durable."""
        ...

    def commit(self) -> None:
        """Make every change since the last commit durable, at once.

        The changes are those ``claim_allocated`` and ``claim_released`` announced. On
        failure, put the policy back to what is durable, then raise. Called with the lock
        held, once per request, before any CDI spec of the request is written or removed.
        It may let the lock go while it waits (for other requests to join one write) and
        take it back before it returns: another request may then meet this one's claims
        before their specs are written (see `inflight`).
        """
        ...

    def request_shutdown(self, reason: str) -> None:
        """Ask the owner to shut down, for an error the plugin cannot recover from.

        Runs on the very thread whose failure it reports, which ``Plugin.stop`` may wait
        for: it must return and leave stopping the plugin to the shutdown it triggers.
        """
        ...


class ClaimPolicy(Protocol):
    """What the plugin asks of the policy."""

    def allocate_claim(
        self, claim: Mapping[str, Any], results: Sequence[AllocationResult]
    ) -> Sequence[ContainerEdits]:
        """Allocate ``claim``'s resources; one non-empty CDI container edit per result.

        ``results`` are this driver's results only. Called again for a claim prepared
        before, the policy must answer the same and allocate nothing more. On failure it
        raises and leaves nothing allocated.
        """
        ...

    def result_attributes(self, uid: str) -> Sequence[Mapping[str, Mapping[str, object]]]:
        """What the containers of claim ``uid`` (allocated) are told of each result.

        Attributes as in a ResourceSlice (``{"numaNode": {"int": 0}}``), at most 32 per
        result, in the order of ``allocate_claim``'s results: the claim's device metadata.
        """
        ...

    def release_claim(self, uid: str) -> None:
        """Release what ``allocate_claim`` allocated; an unknown UID is not an error."""
        ...

    def holds_claim(self, uid: str) -> bool:
        """Whether claim ``uid`` is allocated now, its allocation committed or not.

        What "prepared before" means: a failed prepare of a claim held before must not
        release it (containers may run with it, or another request reports it prepared).
        """
        ...


@dataclass(frozen=True)
class PluginHealth:
    """What an admin (and a readiness probe) needs to know about the plugin."""

    serving: bool
    """The gRPC servers run and claims are allowed."""
    registered: bool
    """The kubelet told us it registered the driver."""
    published: bool
    """The node's ResourceSlices are on the API server."""
    problems: tuple[str, ...] = ()
    """Why any of the above is not so, as far as known."""

    @property
    def ready(self) -> bool:
        """Whether the kubelet can use the driver now."""
        return self.serving and self.registered and self.published


@dataclass(frozen=True)
class RequestReport:
    """How one kubelet request went, for those observing the plugin."""

    kind: str
    """``"prepare"`` or ``"unprepare"``."""
    claims: tuple[ClaimRef, ...]
    errors: Mapping[str, Exception | None]
    """Claim UID -> why it failed, or None."""
    seconds: float
    fetched: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Claim UID -> the claim as the API server gave it for this request (prepare only)."""


class RequestObserver(Protocol):
    """Someone who wants to know how kubelet requests went."""

    def request_done(self, report: RequestReport) -> None:
        """A kubelet request was answered.

        Called on the request's thread after the owner's lock is released: it must be quick
        and must not call back into the plugin's requests.
        """
        ...
