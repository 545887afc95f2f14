"""ResourceClaims as the plugin sees them: parsed at the boundary, checked, filtered by driver.

Claims arrive as API JSON. What the plugin uses of them is parsed here into small frozen
dataclasses, so that a malformed claim fails with a message naming the claim and the field,
before anything is allocated, and the rest of the code never guesses at shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_RESULTS = 32
"""The API's limit on the allocation results of one claim."""


class ClaimError(ValueError):
    """A claim that cannot be prepared as it is; the message names the claim and the problem."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in a request."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True)
class AllocationResult:
    """One device the scheduler allocated to a claim (``status.allocation.devices.results[]``).

    ``consumed_capacity`` maps capacity names to quantities as the API writes them (strings
    such as ``"2"`` or ``"4Gi"``); what they mean is the policy's business.
    """

    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    admin_access: bool | None = None

    @property
    def base_request(self) -> str:
        """The request name without a ``/subrequest`` part, as containers name it."""
        return self.request.split("/", 1)[0]


def claim_ref(claim: Mapping[str, Any]) -> ClaimRef:
    """Who ``claim`` is, from its metadata; a claim without a UID is refused."""
    meta = _mapping(claim.get("metadata"), "the claim's metadata")
    ref = ClaimRef(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
    )
    if not ref.uid:
        raise ClaimError(f"claim {ref.namespace}/{ref.name} has no metadata.uid")
    return ref


def is_allocated(claim: Mapping[str, Any]) -> bool:
    """Whether the scheduler has allocated ``claim``."""
    status = claim.get("status")
    return isinstance(status, Mapping) and status.get("allocation") is not None


def claim_results(claim: Mapping[str, Any], driver: str) -> list[AllocationResult]:
    """The allocation results of ``driver`` in ``claim``, in allocation order.

    A claim can span drivers: the others' results are left out, but every result is
    checked, since a malformed allocation is no allocation to act on.
    """
    ref = claim_ref(claim)
    allocation = _allocation(claim, ref)
    raw = allocation.get("results")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ClaimError(f"claim {ref}: status.allocation.devices.results is not a list")
    if len(raw) > MAX_RESULTS:
        raise ClaimError(
            f"claim {ref}: {len(raw)} allocation results, more than the API allows ({MAX_RESULTS})"
        )
    results = [_result(entry, ref, i) for i, entry in enumerate(raw)]
    return [r for r in results if r.driver == driver]


def claim_configs(claim: Mapping[str, Any], driver: str) -> list[Mapping[str, Any]]:
    """The opaque configs of ``driver`` in ``claim``'s allocation, class configs first.

    Entries come back unchanged: those from the DeviceClass first, then those from the
    claim, each group in its original order, so that applying them in order lets the
    claim's own configuration override its class's.
    """
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    configs = devices.get("config") if isinstance(devices, Mapping) else None
    ours = [
        c
        for c in configs or []
        if isinstance(c, Mapping)
        and isinstance(c.get("opaque"), Mapping)
        and c["opaque"].get("driver") == driver
    ]
    return [c for c in ours if c.get("source") == "FromClass"] + [
        c for c in ours if c.get("source") != "FromClass"
    ]


def _allocation(claim: Mapping[str, Any], ref: ClaimRef) -> Mapping[str, Any]:
    status = _mapping(claim.get("status"), f"claim {ref}: status")
    allocation = status.get("allocation")
    if allocation is None:
        raise ClaimError(f"claim {ref} is not allocated")
    allocation = _mapping(allocation, f"claim {ref}: status.allocation")
    devices = allocation.get("devices")
    return _mapping({} if devices is None else devices, f"claim {ref}: status.allocation.devices")


def _result(entry: object, ref: ClaimRef, index: int) -> AllocationResult:
    where = f"claim {ref}: status.allocation.devices.results[{index}]"
    result = _mapping(entry, where)
    strings = {}
    for key in ("request", "driver", "pool", "device"):
        value = result.get(key)
        if not isinstance(value, str) or not value:
            raise ClaimError(f"{where}.{key} must be a non-empty string, not {value!r}")
        strings[key] = value
    share_id = result.get("shareID")
    if share_id is not None and not isinstance(share_id, str):
        raise ClaimError(f"{where}.shareID must be a string, not {share_id!r}")
    admin_access = result.get("adminAccess")
    if admin_access is not None and not isinstance(admin_access, bool):
        raise ClaimError(f"{where}.adminAccess must be a boolean, not {admin_access!r}")
    consumed = result.get("consumedCapacity")
    consumed = _mapping({} if consumed is None else consumed, f"{where}.consumedCapacity")
    capacity = {}
    for name, quantity in consumed.items():
        if isinstance(quantity, bool) or not isinstance(quantity, str | int):
            raise ClaimError(f"{where}.consumedCapacity[{name}] is not a quantity: {quantity!r}")
        capacity[str(name)] = str(quantity)
    return AllocationResult(
        request=strings["request"],
        driver=strings["driver"],
        pool=strings["pool"],
        device=strings["device"],
        share_id=share_id or None,
        consumed_capacity=capacity,
        admin_access=admin_access,
    )


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ClaimError(f"{what} is not an object: {value!r}")
    return value
