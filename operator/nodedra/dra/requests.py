"""Serving one kubelet request's claims: fetch them, then prepare or unprepare in two phases.

Prepare: the policy allocates every claim of the request and the owner is told per claim;
then the owner commits them all at once (one checkpoint write, shared with the requests
that come in together); then each claim's device metadata and CDI spec are written.
Unprepare: the policy releases, the owner commits, the specs and metadata are removed. The
kubelet learns of a claim only from the answer, and a container can get a claim's devices
only after that, so one write before the specs keeps every guarantee of one write per claim.
One claim's failure stays its own.

The owner's commit may let the lock go while it waits for other requests, so another
request may meet a claim between its allocation and its spec: `inflight` keeps them from
undoing each other's claims.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nodedra.lib import faults

from .cdi import CDIStore, ClaimSpec
from .claims import (
    AllocationResult,
    ClaimError,
    ClaimRef,
    claim_configs,
    claim_ref,
    claim_results,
    is_valid_namespace,
    is_valid_object_name,
)
from .contracts import ClaimPolicy, Owner
from .inflight import ClaimsInFlight, RequestClaims
from .kube import ClusterAPI
from .metadata import ClaimMetadata, MetadataStore
from .results import PreparedDevice, PrepareResult

log = logging.getLogger(__name__)

FETCH_WORKERS = 8
"""Claims of one request fetched at once: enough to hide round trips, few for the server."""


class ClaimRequests:
    """The claims of kubelet requests, for one driver: owner, policy, CDI specs, metadata, API.

    ``prepare`` and ``unprepare`` must be called with nothing of the owner's lock held: they
    take it, once per request (`Owner.batched`).
    """

    def __init__(
        self,
        driver: str,
        owner: Owner,
        policy: ClaimPolicy,
        api: ClusterAPI,
        *,
        cdi: CDIStore,
        metadata: MetadataStore,
    ) -> None:
        self._driver = driver
        self._owner = owner
        self._policy = policy
        self._cdi = cdi
        self._metadata = metadata
        self._api = api
        self._in_flight = ClaimsInFlight()

    def prepare(self, claims: Sequence[Mapping[str, Any]]) -> dict[str, PrepareResult]:
        """Prepare each claim on its own; one result per claim UID.

        The kubelet asks for all the claims of a pod at once but records the answer per
        claim and retries the failed ones, so failing them together would only throw away
        the claims that were prepared. In two phases: the policy allocates every claim and
        the owner commits them all at once, then their CDI specs are written.
        """
        answers: dict[str, PrepareResult] = {}
        staged: list[_Staged] = []
        with self._owner.batched(), self._in_flight.request() as mine:
            for claim in claims:
                try:
                    ref = claim_ref(claim)
                except ClaimError as err:
                    answers[""] = PrepareResult(error=err)
                    continue
                try:
                    stage = self._stage_claim(ref, claim, mine)
                except Exception as err:  # one claim's failure, whatever it is, stays its own
                    answers[ref.uid] = PrepareResult(error=_logged(ref, err))
                    continue
                if stage is None:
                    answers[ref.uid] = PrepareResult(devices=())
                else:
                    staged.append(stage)
            try:
                self._commit(faults.PREPARE_COMMITTED)
            except Exception as err:
                for stage in staged:
                    error = ClaimError(
                        f"claim {stage.ref}: committing the allocation failed: {err}"
                    )
                    answers[stage.ref.uid] = PrepareResult(error=_logged(stage.ref, error))
                return answers
            undone = []
            for stage in staged:
                try:
                    answers[stage.ref.uid] = PrepareResult(devices=self._write_spec(stage))
                except Exception as err:
                    answers[stage.ref.uid] = PrepareResult(error=_logged(stage.ref, err))
                    if self._undo(stage, mine):
                        undone.append(stage.ref)
            if undone:
                self._finish_release(undone, faults.UNPREPARE_COMMITTED)
        return answers

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, Exception | None]:
        """Release what was prepared for each claim; unknown claims succeed.

        In two phases, as a prepare: the policy releases every claim and the owner commits
        them all at once, then their CDI specs are removed.
        """
        answers: dict[str, Exception | None] = {}
        released: list[ClaimRef] = []
        with self._owner.batched(), self._in_flight.request() as mine:
            for ref in claims:
                try:
                    if not ref.uid:
                        raise ClaimError(
                            f"claim {ref.namespace}/{ref.name}: the request has no claim UID"
                        )
                    mine.unprepare(ref)
                    self._release(ref)
                    released.append(ref)
                    answers[ref.uid] = None
                except Exception as err:
                    answers[ref.uid] = _logged(ref, err)
            answers.update(self._finish_release(released, faults.UNPREPARE_COMMITTED))
        return answers

    def fetch_all(self, refs: Sequence[ClaimRef]) -> list[Mapping[str, Any] | ClaimError]:
        """Each claim of ``refs`` from the API server, or why it could not be had."""

        def fetch(ref: ClaimRef) -> Mapping[str, Any] | ClaimError:
            try:
                return self._fetch(ref)
            except ClaimError as err:
                return err

        if len(refs) < 2:
            return [fetch(ref) for ref in refs]
        with ThreadPoolExecutor(min(len(refs), FETCH_WORKERS), "claim-get") as pool:
            return list(pool.map(fetch, refs))

    def _fetch(self, ref: ClaimRef) -> Mapping[str, Any]:
        """The claim ``ref`` names, from the API server, checked to be that claim."""
        if not ref.uid:
            raise ClaimError(f"claim {ref.namespace}/{ref.name}: the request has no claim UID")
        # The names go into the request's URL: refuse what no claim can be called.
        if not is_valid_namespace(ref.namespace):
            raise ClaimError(f"claim {ref}: the request names no valid namespace")
        if not is_valid_object_name(ref.name):
            raise ClaimError(f"claim {ref}: the request names no valid claim name")
        try:
            claim = self._api.get_claim(ref.namespace, ref.name)
        except Exception as err:  # KubeAPIError or not: this claim's failure, not the request's
            raise ClaimError(f"claim {ref}: cannot get it from the API server: {err}") from err
        if not isinstance(claim, Mapping):
            raise ClaimError(f"claim {ref}: the API server's answer is not an object")
        try:
            found = claim_ref(claim)
        except ClaimError as err:
            raise ClaimError(f"claim {ref}: the API server's copy is malformed: {err}") from None
        if found.uid != ref.uid:
            raise ClaimError(f"claim {ref} was replaced: the API server has UID {found.uid!r}")
        if (found.namespace, found.name) != (ref.namespace, ref.name):
            raise ClaimError(f"claim {ref}: the API server answered with claim {found}")
        status = claim.get("status")
        if not isinstance(status, Mapping) or status.get("allocation") is None:
            raise ClaimError(f"claim {ref} is not allocated")
        return claim

    def _stage_claim(
        self, ref: ClaimRef, claim: Mapping[str, Any], mine: RequestClaims
    ) -> _Staged | None:
        """The first phase of a prepare: the policy allocates, the owner is told.

        None when the claim has nothing of ours to prepare. On failure nothing of a claim
        not prepared before stays allocated. Prepared before means held by the policy,
        committed or in the batch under way (another request may be about to write its
        spec): whether its spec is on disk yet says nothing.
        """
        results = claim_results(claim, self._driver)
        if not results:
            log.warning(
                "claim %s has no devices of %s: nothing to prepare",
                ref,
                self._driver,
                extra={"claim": ref},
            )
            return None
        claim_configs(claim, self._driver)  # our policies take no parameters, but check them
        mine.check_prepare(ref)
        prepared_before = self._policy.holds_claim(ref.uid)
        try:
            edits = list(self._policy.allocate_claim(claim, results))
        except Exception as err:
            raise ClaimError(f"claim {ref}: the policy failed to allocate it: {err}") from err
        faults.crash_point(faults.PREPARE_ALLOCATED)
        try:
            if len(edits) != len(results):
                raise ClaimError(
                    f"claim {ref}: the policy gave {len(edits)} CDI edits "
                    f"for {len(results)} allocation results"
                )
            # What fails to be made fails before the commit.
            metadata = self._metadata.claim_metadata(
                ref, claim, results, self._policy.result_attributes(ref.uid)
            )
            spec = self._cdi.claim_spec(ref.uid, metadata.with_mounts(edits))
            try:
                self._owner.claim_allocated()
            except Exception as err:
                raise ClaimError(f"claim {ref}: committing the allocation failed: {err}") from err
        except Exception:
            if not prepared_before:
                self._policy.release_claim(ref.uid)  # nothing of it is durable yet
            raise
        mine.prepared(ref)
        return _Staged(ref, tuple(results), spec, metadata, prepared_before)

    def _write_spec(self, stage: _Staged) -> tuple[PreparedDevice, ...]:
        """The second phase of a prepare, once the allocation is durable: the files.

        The device metadata first: the CDI spec mounts it, and is the last thing written.
        """
        try:
            self._metadata.write(stage.metadata)
        except OSError as err:
            raise ClaimError(
                f"claim {stage.ref}: writing its device metadata to "
                f"{self._metadata.directory} failed: {err}"
            ) from err
        try:
            names = self._cdi.write_spec(stage.spec, faults.PREPARE_SPEC)
        except OSError as err:
            raise ClaimError(
                f"claim {stage.ref}: writing its CDI spec to {self._cdi.directory} failed: {err}"
            ) from err
        faults.crash_point(faults.PREPARE_WRITTEN)
        return tuple(
            PreparedDevice(
                requests=(result.base_request,),
                pool_name=result.pool,
                device_name=result.device,
                cdi_device_ids=(name,),
                share_id=result.share_id,
            )
            for result, name in zip(stage.results, names, strict=True)
        )

    def _undo(self, stage: _Staged, mine: RequestClaims) -> bool:
        """Undo a failed prepare, unless the claim was prepared before or by another request.

        Returns whether it was released (the release still has to be committed). A claim
        prepared before may have running containers: a failed re-prepare must not take their
        resources away, so it stays allocated as it was. Nor may a failure take a claim from
        another request that prepared it meanwhile and reports it prepared.
        """
        ref = stage.ref
        if stage.prepared_before:
            log.warning(
                "claim %s was prepared before: it stays allocated", ref, extra={"claim": ref}
            )
            return False
        if not mine.roll_back(ref):
            log.warning(
                "claim %s is prepared by another kubelet request too: it stays allocated",
                ref,
                extra={"claim": ref},
            )
            return False
        try:
            self._release(ref)
        except Exception as err:
            log.error(
                "claim %s: rolling back the failed prepare failed too: %s",
                ref,
                err,
                extra={"claim": ref},
            )
            return False
        return True

    def _release(self, ref: ClaimRef) -> None:
        """The first phase of a release: the policy releases, the owner is told."""
        try:
            self._policy.release_claim(ref.uid)
        except Exception as err:
            raise ClaimError(f"claim {ref}: the policy failed to release it: {err}") from err
        faults.crash_point(faults.UNPREPARE_RELEASED)
        try:
            self._owner.claim_released()
        except Exception as err:
            raise ClaimError(f"claim {ref}: committing the release failed: {err}") from err

    def _finish_release(
        self, refs: Sequence[ClaimRef], committed: str
    ) -> dict[str, Exception | None]:
        """Commit the releases of ``refs``, then remove their specs and metadata.

        In that order, what a failure leaves behind is a spec, never an allocation nobody
        accounts for. Returns the claims that failed now, with why.
        """
        failed: dict[str, Exception | None] = {}
        if not refs:
            return failed
        try:
            self._commit(committed)
        except Exception as err:
            for ref in refs:
                error = ClaimError(f"claim {ref}: committing the release failed: {err}")
                failed[ref.uid] = _logged(ref, error)
            return failed
        for ref in refs:
            try:
                self._cdi.remove_claim(ref.uid)
                self._metadata.remove_claim(ref)
            except OSError as err:
                error = ClaimError(
                    f"claim {ref}: released, but removing its CDI spec from "
                    f"{self._cdi.directory} or its device metadata from "
                    f"{self._metadata.directory} failed: {err}"
                )
                failed[ref.uid] = _logged(ref, error)
                continue
            faults.crash_point(faults.UNPREPARE_REMOVED)
        return failed

    def _commit(self, committed: str) -> None:
        """The owner's commit of the request so far (it may let the lock go meanwhile)."""
        self._owner.commit()
        faults.crash_point(committed)


@dataclass(frozen=True)
class _Staged:
    """A claim of a prepare request between its two phases."""

    ref: ClaimRef
    results: tuple[AllocationResult, ...]
    spec: ClaimSpec
    metadata: ClaimMetadata
    prepared_before: bool


def _logged(ref: ClaimRef, err: Exception) -> ClaimError:
    """``err`` as the claim's error (a ClaimError naming it), logged."""
    error = err if isinstance(err, ClaimError) else _claim_error(ref, err)
    log.error("%s", error, extra={"claim": ref})
    return error


def conflicts(refs: Sequence[ClaimRef]) -> dict[str, ClaimError]:
    """An error for each UID that the request gives to more than one claim.

    The kubelet answers per UID, so two claims with one UID cannot both be answered: and
    which of them the UID really names only the API server could say. Neither is prepared.
    """
    named: dict[str, list[ClaimRef]] = {}
    for ref in refs:
        named.setdefault(ref.uid, []).append(ref)
    return {
        uid: ClaimError(
            f"claim {same[0]}: the request gives UID {uid!r} to {len(same)} different claims "
            f"({', '.join(f'{r.namespace}/{r.name}' for r in same)}); none of them is prepared"
        )
        for uid, same in named.items()
        if len(same) > 1
    }


def _claim_error(ref: ClaimRef, err: Exception) -> ClaimError:
    error = ClaimError(f"claim {ref}: {type(err).__name__}: {err}")
    error.__cause__ = err
    return error
