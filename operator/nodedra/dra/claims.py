"""ResourceClaims as the plugin sees them: parsed at the boundary, checked, filtered by driver.

Claims arrive as API JSON. What the plugin uses of them is parsed here into small frozen
dataclasses, so that a malformed claim fails with a message naming the claim and the field,
before anything is allocated, and the rest of the code never guesses at shapes.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_RESULTS = 32
"""The API's limit on the allocation results of one claim."""
CONFIG_SOURCES = ("FromClass", "FromClaim")
"""Where an allocation's config entry came from (``DeviceAllocationConfiguration.source``)."""


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


_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_NAMESPACE = re.compile(_DNS_LABEL)
_OBJECT_NAME = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")


def is_dns_label(name: str) -> bool:
    """Whether ``name`` is a DNS-1123 label (namespaces, request names, a pod's claim names)."""
    return len(name) <= 63 and _NAMESPACE.fullmatch(name) is not None


def is_valid_namespace(name: str) -> bool:
    """Whether ``name`` can be a namespace's (a DNS-1123 label, as the API requires)."""
    return is_dns_label(name)


def is_valid_object_name(name: str) -> bool:
    """Whether ``name`` can be a ResourceClaim's (a DNS-1123 subdomain, as the API requires)."""
    return len(name) <= 253 and _OBJECT_NAME.fullmatch(name) is not None


def claim_ref(claim: Mapping[str, Any]) -> ClaimRef:
    """Who ``claim`` is, from its metadata; a claim without a UID is refused."""
    meta = _mapping(_mapping(claim, "the claim").get("metadata"), "the claim's metadata")
    names = {}
    for key in ("namespace", "name", "uid"):
        value = meta.get(key)
        if value is not None and not isinstance(value, str):
            raise ClaimError(f"the claim's metadata.{key} must be a string, not {_show(value)}")
        names[key] = value or ""
    ref = ClaimRef(**names)
    if not ref.uid:
        raise ClaimError(f"claim {ref.namespace}/{ref.name} has no metadata.uid")
    return ref


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
    claim's own configuration override its class's. Entries without an opaque part and
    those of other drivers are left out unchecked, except that an opaque part must name
    its driver: without one nobody can tell whose it is. ``driver``'s own entries must be
    what the API allows (a known source, a list of request names, parameters that are a
    JSON object); anything else raises ClaimError, since acting on a configuration
    misread would be worse than refusing the claim.
    """
    claim = _mapping(claim, "the claim")
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    configs = devices.get("config") if isinstance(devices, Mapping) else None
    if configs is None:
        return []
    where = f"{_claim_name(claim)}: status.allocation.devices.config"
    if not isinstance(configs, list):
        raise ClaimError(f"{where} is not a list: {_show(configs)}")
    ours = [
        entry
        for index, entry in enumerate(configs)
        if _is_config_of(entry, driver, f"{where}[{index}]")
    ]
    return [c for c in ours if c["source"] == "FromClass"] + [
        c for c in ours if c["source"] != "FromClass"
    ]


def _is_config_of(entry: object, driver: str, where: str) -> bool:
    """Whether config ``entry`` is an opaque config of ``driver``, checking it if it is."""
    config = _mapping(entry, where)
    opaque = config.get("opaque")
    if opaque is None:
        return False
    opaque = _mapping(opaque, f"{where}.opaque")
    owner = opaque.get("driver")
    if not isinstance(owner, str) or not owner:
        raise ClaimError(
            f"{where}.opaque.driver must be a non-empty string, not {_show(owner)}: "
            "nobody can tell whose configuration it is"
        )
    if owner != driver:
        return False
    source = config.get("source")
    if source not in CONFIG_SOURCES:
        raise ClaimError(
            f"{where}.source must be one of {list(CONFIG_SOURCES)}, not {_show(source)}"
        )
    requests = config.get("requests")
    if requests is not None and (
        not isinstance(requests, list) or not all(isinstance(r, str) for r in requests)
    ):
        raise ClaimError(f"{where}.requests must be a list of request names, not {_show(requests)}")
    if not isinstance(opaque.get("parameters"), Mapping):
        raise ClaimError(
            f"{where}.opaque.parameters must be a JSON object, "
            f"not {_show(opaque.get('parameters'))}"
        )
    return True


def _claim_name(claim: Mapping[str, Any]) -> str:
    """``claim <ref>`` for messages, or just ``claim`` when its metadata say nothing useful."""
    try:
        return f"claim {claim_ref(claim)}"
    except ClaimError:
        return "claim"


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
            raise ClaimError(f"{where}.{key} must be a non-empty string, not {_show(value)}")
        strings[key] = value
    share_id = result.get("shareID")
    if share_id is not None and not isinstance(share_id, str):
        raise ClaimError(f"{where}.shareID must be a string, not {_show(share_id)}")
    admin_access = result.get("adminAccess")
    if admin_access is not None and not isinstance(admin_access, bool):
        raise ClaimError(f"{where}.adminAccess must be a boolean, not {_show(admin_access)}")
    consumed = result.get("consumedCapacity")
    consumed = _mapping({} if consumed is None else consumed, f"{where}.consumedCapacity")
    capacity = {}
    for name, quantity in consumed.items():
        text = quantity if isinstance(quantity, str) else None
        if isinstance(quantity, int) and not isinstance(quantity, bool):
            with contextlib.suppress(ValueError):  # more digits than Python prints
                text = str(quantity)
        if text is None:
            raise ClaimError(
                f"{where}.consumedCapacity[{name}] is not a quantity: {_show(quantity)}"
            )
        capacity[str(name)] = text
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
        raise ClaimError(f"{what} is not an object: {_show(value)}")
    return value


_SHOWN = 200
"""Characters of a bad value that an error message quotes."""


def _show(value: object) -> str:
    """``repr(value)`` for an error message, cut short: a claim may hold anything."""
    try:
        text = repr(value)
    except ValueError:  # an int with more digits than Python converts to text
        return f"an integer of {value.bit_length()} bits" if isinstance(value, int) else "?"
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"
