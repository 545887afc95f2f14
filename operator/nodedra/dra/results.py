"""What preparing a claim answers, before it is put on the wire."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet is told about it."""

    requests: tuple[str, ...]
    """The requests the device serves, by base name (``req``, never ``req/sub``)."""
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    """The answer for one claim: its devices, or why it could not be prepared."""

    devices: tuple[PreparedDevice, ...] = ()
    error: Exception | None = None
