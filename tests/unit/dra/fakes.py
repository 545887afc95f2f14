"""Fakes of nodedra's own protocols for the plugin's unit tests: Owner, ClaimPolicy, ClusterAPI.

The ClusterAPI fake stands in for our thin API wrapper only in unit tests of our own logic;
the integration tests run the same code against a real API server.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from nodedra.dra import AllocationResult, KubeAPIError

DRIVER = "test.nri.io"
SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
"""A DNS subdomain (RFC 1123), what the API server takes as an object's name."""
NODE = "node-a"


class FakeOwner:
    """A lock that counts, commits that can be made to fail, and recorded shutdowns.

    It follows the `Owner` protocol as the resource manager does: ``claim_allocated`` and
    ``claim_released`` only note a change, ``commit`` makes the noted changes durable (one
    commit counted), or fails and puts the policy (if given) back to what it last committed.
    ``while_committing``, if set, runs during a commit with the lock let go, as a commit
    that waits for other requests does.
    """

    def __init__(self, policy: FakePolicy | None = None) -> None:
        self._lock = threading.Lock()
        self._policy = policy
        self._durable: dict[str, list[str]] = {}
        self.locks = 0
        self.unlocks = 0
        self.noted = 0
        """Changes announced and not committed yet."""
        self.commits = 0
        self.commit_error: Exception | None = None
        self.while_committing: Callable[[], None] | None = None
        self.shutdowns: list[str] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        self.locks += got
        return got

    def release(self) -> None:
        self.unlocks += 1
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        with self:
            yield

    def locked(self) -> bool:
        return self._lock.locked()

    def claim_allocated(self) -> None:
        assert self._lock.locked(), "a change noted without the lock"
        self.noted += 1

    def claim_released(self) -> None:
        assert self._lock.locked(), "a change noted without the lock"
        self.noted += 1

    def commit(self) -> None:
        assert self._lock.locked(), "commit without the lock"
        if not self.noted:
            return
        hook, self.while_committing = self.while_committing, None
        if hook is not None:
            self._lock.release()
            try:
                hook()
            finally:
                self._lock.acquire()
        self.noted = 0
        self.commits += 1
        if self.commit_error is not None:
            if self._policy is not None:
                self._policy.allocated = copy.deepcopy(self._durable)
            raise self.commit_error
        if self._policy is not None:
            self._durable = copy.deepcopy(self._policy.allocated)

    def request_shutdown(self, reason: str) -> None:
        self.shutdowns.append(reason)


class FakePolicy:
    """Records what it was asked; by default one ``NRI_DEVICE=<device>`` env edit per result."""

    def __init__(self) -> None:
        self.claims: list[Mapping[str, Any]] = []
        self.results: list[list[AllocationResult]] = []
        self.allocated: dict[str, list[str]] = {}
        self.releases: list[str] = []
        self.edits: list[Mapping[str, Any]] | None = None
        self.allocate_error: Exception | None = None
        self.fail_uid: str | None = None
        self.release_error: Exception | None = None

    def allocate_claim(
        self, claim: Mapping[str, Any], results: Sequence[AllocationResult]
    ) -> list[Mapping[str, Any]]:
        uid = claim["metadata"]["uid"]
        self.claims.append(claim)
        self.results.append(list(results))
        if self.allocate_error is not None and self.fail_uid in (None, uid):
            raise self.allocate_error
        self.allocated[uid] = [r.device for r in results]
        if self.edits is not None:
            return self.edits
        return [{"env": [f"NRI_DEVICE={r.device}"]} for r in results]

    def result_attributes(self, uid: str) -> list[Mapping[str, Mapping[str, object]]]:
        return [{"device": {"string": device}} for device in self.allocated[uid]]

    def release_claim(self, uid: str) -> None:
        self.releases.append(uid)
        if self.release_error is not None:
            raise self.release_error
        self.allocated.pop(uid, None)

    def holds_claim(self, uid: str) -> bool:
        return uid in self.allocated


class FakeCluster:
    """An in-memory ClusterAPI: claims to get, one node, slices with names and versions,
    Events."""

    def __init__(self, node: str = NODE) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes = {node: str(uuid.uuid4())}
        self.slices: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.gets = 0
        """ResourceClaim GETs served."""
        self.fail_next: list[KubeAPIError] = []
        self.keeps_list_attributes = False
        self.keeps_node_allocatable = True
        """False: as a server with DRANodeAllocatableResources off, drop the field."""
        self.node_allocatable_field = "nodeAllocatableResources"
        """The field's name as the server spells it (1.36: nodeAllocatableResourceMappings);
        it drops the other spelling, a field it does not know."""
        self.keeps_consumable_capacity = True
        """False: as a server with DRAConsumableCapacity off, drop what it adds."""
        self.declared_features = ["DRANodeAllocatableResources"]
        """What the node's kubelet declares; a server keeping the field refuses it without."""
        self.status_owners: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
        self.events: list[dict[str, Any]] = []
        """Events recorded, as stored."""
        self._versions = itertools.count(1)
        self._names = itertools.count()
        self.lock = threading.Lock()

    def _maybe_fail(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self._maybe_fail()
        self.gets += 1
        try:
            return copy.deepcopy(self.claims[(namespace, name)])
        except KeyError:
            raise KubeAPIError(404, f'resourceclaims "{name}" not found') from None

    def get_node(self, name: str) -> dict[str, Any]:
        self._maybe_fail()
        if name not in self.nodes:
            raise KubeAPIError(404, f'nodes "{name}" not found')
        return {
            "metadata": {"name": name, "uid": self.nodes[name]},
            "status": {"declaredFeatures": list(self.declared_features)},
        }

    def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        self._maybe_fail()
        with self.lock:
            return [
                copy.deepcopy(s)
                for s in self.slices.values()
                if s["spec"]["nodeName"] == node_name and s["spec"]["driver"] == driver
            ]

    def _as_stored(self, body: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(body))
        devices = stored["spec"].get("devices") or []
        for device in devices:
            for field in ("nodeAllocatableResources", "nodeAllocatableResourceMappings"):
                if field != self.node_allocatable_field or not self.keeps_node_allocatable:
                    device.pop(field, None)
        if not self.keeps_consumable_capacity:
            for device in devices:
                device.pop("allowMultipleAllocations", None)
                for capacity in (device.get("capacity") or {}).values():
                    capacity.pop("requestPolicy", None)
        elif any("nodeAllocatableResources" in d for d in devices) and (
            "DRANodeAllocatableResources" not in self.declared_features
        ):
            node = stored["spec"]["nodeName"]
            raise KubeAPIError(
                403, f'node "{node}" does not support DRANodeAllocatableResources feature'
            )
        return stored

    def create_slice(self, body: Mapping[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        self._maybe_fail()
        stored = self._as_stored(body)
        meta = stored["metadata"]
        meta["name"] = meta.pop("generateName") + f"{next(self._names):05d}"
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._versions))
        if dry_run:
            if not self.keeps_list_attributes:
                for device in stored["spec"]["devices"]:
                    for attribute in device.get("attributes", {}).values():
                        attribute.pop("ints", None)
            return stored
        with self.lock:
            self.slices[meta["name"]] = stored
            self.writes.append(("create", meta["name"]))
        return copy.deepcopy(stored)

    def update_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._maybe_fail()
        stored = self._as_stored(body)
        name = stored["metadata"]["name"]
        with self.lock:
            current = self.slices.get(name)
            if current is None:
                raise KubeAPIError(404, f'resourceslices "{name}" not found')
            if current["metadata"]["resourceVersion"] != stored["metadata"]["resourceVersion"]:
                raise KubeAPIError(409, "the object has been modified")
            stored["metadata"]["resourceVersion"] = str(next(self._versions))
            self.slices[name] = stored
            self.writes.append(("update", name))
        return copy.deepcopy(stored)

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        self._maybe_fail()
        with self.lock:
            current = self.slices.get(name)
            if current is None:
                return
            meta = current["metadata"]
            if (meta["uid"], meta["resourceVersion"]) != (uid, resource_version):
                raise KubeAPIError(409, "precondition failed")
            del self.slices[name]
            self.writes.append(("delete", name))

    def apply_claim_status(
        self, claim: Any, devices: list[dict[str, Any]], field_manager: str
    ) -> dict[str, Any]:
        self._maybe_fail()
        stored = self.claims[(claim.namespace, claim.name)]
        if stored["metadata"]["uid"] != claim.uid:
            raise KubeAPIError(422, "metadata.uid: field is immutable")
        owned = self.status_owners.setdefault((claim.namespace, claim.name), {})
        owned[field_manager] = copy.deepcopy(devices)
        stored["status"]["devices"] = [d for entries in owned.values() for d in entries]
        self.writes.append(("status", claim.name))
        return copy.deepcopy(stored)

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Store an Event, refusing what the server's strict events.k8s.io/v1 checks would."""
        self._maybe_fail()
        event = copy.deepcopy(dict(body))
        problems = [
            field
            for field in (
                "eventTime",
                "reportingController",
                "reportingInstance",
                "action",
                "reason",
            )
            if not event.get(field)
        ]
        if event.get("type") not in ("Normal", "Warning"):
            problems.append("type")
        if len(event.get("note", "").encode()) > 1024:
            problems.append("note")
        if any(len(event.get(f, "")) > 128 for f in ("reportingInstance", "action", "reason")):
            problems.append("length")
        meta = event.setdefault("metadata", {})
        if "generateName" in meta:  # the API server checks it as a whole name, for Events
            meta["name"] = meta.pop("generateName")
        name = meta.get("name", "")
        if len(name) > 253 or not re.fullmatch(SUBDOMAIN, name):
            problems.append("metadata.name")
        regarding = event.get("regarding", {})
        if not regarding.get("namespace") and namespace not in ("default", "kube-system"):
            problems.append("namespace")
        if problems or event.get("apiVersion") != "events.k8s.io/v1":
            raise KubeAPIError(422, f"Event is invalid: {problems}")
        meta["namespace"] = namespace
        with self.lock:
            self.events.append(event)
            self.writes.append(("event", meta["name"]))
        return copy.deepcopy(event)

    # Helpers for tests -------------------------------------------------------------------

    def edit_slice(self, name: str, **spec: Any) -> None:
        """Someone else changes a slice."""
        with self.lock:
            self.slices[name]["spec"].update(spec)
            self.slices[name]["metadata"]["resourceVersion"] = str(next(self._versions))

    def pool_devices(self) -> list[dict[str, Any]]:
        """The devices of the current generation, in creation order."""
        with self.lock:
            slices = list(self.slices.values())
        top = max((s["spec"]["pool"]["generation"] for s in slices), default=0)
        return [
            d
            for s in slices
            if s["spec"]["pool"]["generation"] == top
            for d in s["spec"]["devices"]
        ]


def make_claim(
    uid: str,
    results: Sequence[Mapping[str, Any]],
    *,
    namespace: str = "default",
    name: str | None = None,
    config: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim in API JSON, allocated with ``results``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name or f"claim-{uid}", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": list(results), "config": list(config)}}},
    }


def result(
    request: str, device: str, *, driver: str = DRIVER, pool: str = "test-pool", **extra: Any
) -> dict[str, Any]:
    """One allocation result in API JSON."""
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}


def devices(count: int, prefix: str = "cpu") -> list[dict[str, Any]]:
    """``count`` published devices in API JSON."""
    return [{"name": f"{prefix}{i}", "attributes": {"index": {"int": i}}} for i in range(count)]
