"""ResourceClaims made for the benchmarks: created as admin, allocated by writing the status.

No scheduler runs: the benchmarks write ``status.allocation`` themselves through the status
subresource, with results that name the driver, the node's pool and devices that are in the
driver's slices, as the scheduler would. nodedra's topology-aware devices are consumable,
so its results carry ``consumedCapacity`` (1 CPU and 256 MiB each) and a ``shareID``, as
the scheduler writes for devices that allow multiple allocations.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench.env import RESOURCE_API, Admin

REQUEST = "dev"


@dataclass(frozen=True)
class Allocation:
    """One allocation result: which driver, pool and device, and what it consumed."""

    driver: str
    pool: str
    device: str
    consumed: Mapping[str, str] | None = None


def claim_body(name: str, device_class: str, consumed: Mapping[str, str] | None) -> dict[str, Any]:
    """A ResourceClaim asking for one device of ``device_class`` (and ``consumed`` of it)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if consumed:
        exactly["capacity"] = {"requests": dict(consumed)}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": REQUEST, "exactly": exactly}]}},
    }


def allocation_status(allocation: Allocation) -> dict[str, Any]:
    """``status`` of a claim allocated as ``allocation`` says."""
    result: dict[str, Any] = {
        "request": REQUEST,
        "driver": allocation.driver,
        "pool": allocation.pool,
        "device": allocation.device,
    }
    if allocation.consumed:
        result["consumedCapacity"] = dict(allocation.consumed)
        result["shareID"] = str(uuid.uuid4())
    return {"allocation": {"devices": {"results": [result]}}}


def create_claim(
    api: Admin, namespace: str, name: str, allocation: Allocation | None
) -> dict[str, str]:
    """Create one claim, allocated as ``allocation`` (None: left unallocated); its ref."""
    consumed = allocation.consumed if allocation is not None else None
    claim = api.call(
        "POST",
        f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims",
        claim_body(name, f"class-{allocation.driver if allocation else 'none'}", consumed),
    )
    if allocation is not None:
        claim["status"] = allocation_status(allocation)
        claim = api.call(
            "PUT", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}/status", claim
        )
    meta = claim["metadata"]
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}


def create_claims(
    api: Admin,
    namespace: str,
    names: Sequence[str],
    allocations: Sequence[Allocation | None],
    threads: int = 4,
) -> list[dict[str, str]]:
    """Create claims ``names[i]`` allocated as ``allocations[i]``, a few at a time."""
    api.ensure_namespace(namespace)
    with ThreadPoolExecutor(threads) as pool:
        return list(
            pool.map(
                lambda pair: create_claim(api, namespace, *pair),
                zip(names, allocations, strict=True),
            )
        )


def delete_claims(api: Admin, namespace: str) -> None:
    """Delete every claim of ``namespace`` (DeleteCollection; nothing holds them)."""
    api.call("DELETE", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims")
