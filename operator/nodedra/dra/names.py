"""Names shared by the kubelet plugin, the CDI specs it writes and whoever reads them back.

A claim's CDI device is named ``<driver>/device=claim-<uid>-<index>``. The name is all a
container runtime hands on to its plugins, so it has to carry the claim UID and the index of
the allocation result by itself; :func:`claim_of_cdi_device` reads both back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple, Protocol

DRA_DOMAIN = "nri.io"
"""The DNS domain of every driver name nodedra uses."""

CDI_CLASS = "device"
"""The CDI class of the devices of prepared claims: their kind is ``<driver>/device``."""

CDI_CLAIM_PREFIX = "claim-"

# CDI's rules for the parts of a qualified device name "vendor/class=name".
_VENDOR_OR_CLASS = r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
_DEVICE = r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?"
_QUALIFIED = re.compile(rf"({_VENDOR_OR_CLASS})/({_VENDOR_OR_CLASS})=({_DEVICE})")
_VENDOR = re.compile(_VENDOR_OR_CLASS)
_DEVICE_NAME = re.compile(_DEVICE)


class CDIClaimDevice(NamedTuple):
    """What the CDI device name of a prepared claim says about it."""

    driver: str
    uid: str
    index: int  # type: ignore[assignment]  # shadows tuple.index, as the seed API names it


class HasCDIDevices(Protocol):
    """A container as far as :func:`container_claims` cares: the CDI devices it got."""

    @property
    def cdi_devices(self) -> Iterable[str]: ...


def driver_name(policy_name: str) -> str:
    """The DRA driver name of the named policy, e.g. ``topology-aware.nri.io``."""
    return f"{policy_name}.{DRA_DOMAIN}"


def is_valid_cdi_vendor(vendor: str) -> bool:
    """Whether CDI accepts ``vendor`` as the vendor part of a kind."""
    return _VENDOR.fullmatch(vendor) is not None


def is_valid_cdi_device_name(name: str) -> bool:
    """Whether CDI accepts ``name`` as the name of a device in a spec."""
    return _DEVICE_NAME.fullmatch(name) is not None


def cdi_device_name(uid: str, index: int) -> str:
    """The name, inside our spec, of the device of a claim's ``index``-th result."""
    return f"{CDI_CLAIM_PREFIX}{uid}-{index}"


def qualified_cdi_device(driver: str, uid: str, index: int) -> str:
    """The fully qualified CDI ID the kubelet hands to the runtime."""
    return f"{driver}/{CDI_CLASS}={cdi_device_name(uid, index)}"


def claim_of_cdi_device(qualified_name: str) -> CDIClaimDevice | None:
    """The driver, claim UID and result index a prepared claim's CDI device names.

    ``None`` for any other name: unqualified names, another class, a name without the
    ``claim-`` prefix, an empty UID or a missing or non-numeric index, or an index written
    otherwise than :func:`qualified_cdi_device` writes it (``007``).
    """
    match = _QUALIFIED.fullmatch(qualified_name)
    if match is None:
        return None
    vendor, cdi_class, device = match.groups()
    if cdi_class != CDI_CLASS or not device.startswith(CDI_CLAIM_PREFIX):
        return None
    uid, sep, index = device[len(CDI_CLAIM_PREFIX) :].rpartition("-")
    if not sep or not uid or not index.isascii() or not index.isdigit():
        return None
    if index.startswith("0") and index != "0":  # "007": not how an index is written
        return None
    try:
        number = int(index)
    except ValueError:  # more digits than Python converts: no index of ours
        return None
    return CDIClaimDevice(vendor, uid, number)


def container_claims(container: HasCDIDevices, driver: str) -> dict[str, list[int]]:
    """The claims of ``driver`` a container holds, with the result indexes it holds of each.

    The kubelet gives a container only the CDI devices of the requests it names, so a
    container which names some requests of a claim holds only their results: the indexes
    found are exactly those. Indexes come sorted and without duplicates.
    """
    held: dict[str, set[int]] = {}
    for name in container.cdi_devices:
        device = claim_of_cdi_device(name)
        if device is not None and device.driver == driver:
            held.setdefault(device.uid, set()).add(device.index)
    return {uid: sorted(indexes) for uid, indexes in held.items()}
