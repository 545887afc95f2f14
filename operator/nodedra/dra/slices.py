"""The node's ResourceSlices: the desired state, and one pass that brings the API server to it.

All devices go into one pool named after the node, split into slices no larger than the API
allows. Readers (the scheduler) treat a pool as usable only when they see
``resourceSliceCount`` slices of its highest ``generation``, so a change that touches more
than one slice is written under a new generation: readers see the old pool or the new one,
never a mix.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nodedra.lib.quantity import parse_quantity

from .kube import JSON, RESOURCE_API_VERSION, ClusterAPI

log = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS = 64
"""The smaller limit the API sets for slices whose devices have taints or consume counters."""

Device = Mapping[str, Any]


def slice_capacity(devices: Sequence[Device]) -> int:
    """How many of ``devices`` one slice may hold."""
    if any(d.get("taints") or d.get("consumesCounters") for d in devices):
        return MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
    return MAX_DEVICES_PER_SLICE


def split_devices(devices: Sequence[Device]) -> list[list[Device]]:
    """The devices of each slice, in order; one empty slice when there are no devices.

    The empty slice matters: it tells readers the driver is alive and has nothing, which a
    pool with no slices at all does not.
    """
    size = slice_capacity(devices)
    return [list(devices[i : i + size]) for i in range(0, len(devices), size)] or [[]]


@dataclass
class ApplyReport:
    """What one pass changed: the API writes it used and the pool generation it left."""

    created: int = 0
    updated: int = 0
    deleted: int = 0
    generation: int = 0

    @property
    def writes(self) -> int:
        """All API writes of the pass."""
        return self.created + self.updated + self.deleted


@dataclass
class _Plan:
    generation: int
    matched: list[tuple[JSON, list[Device]]] = field(default_factory=list)
    to_create: list[list[Device]] = field(default_factory=list)
    to_delete: list[JSON] = field(default_factory=list)


class SliceApplier:
    """Brings the node's pool on the API server to a list of devices, one pass at a time.

    A pass lists the slices, plans, then deletes what is not wanted, updates what changed
    and creates what is missing. It raises on the first failed call; the next pass starts
    from what the server then has, so a failed pass is simply retried.
    """

    def __init__(self, api: ClusterAPI, node_name: str, driver: str) -> None:
        self._api = api
        self._node_name = node_name
        self._driver = driver
        self._node_uid: str | None = None
        # name -> (resourceVersion, spec) of what we last wrote, to tell a slice we left
        # as it is from one someone changed, without comparing against the server's
        # normalized form of every field.
        self._written: dict[str, tuple[str, JSON]] = {}

    @property
    def pool_name(self) -> str:
        """One pool per node, named after it."""
        return self._node_name

    def apply(self, devices: Sequence[Device]) -> ApplyReport:
        """One pass to make the node's slices publish exactly ``devices``."""
        chunks = split_devices([copy.deepcopy(dict(d)) for d in devices])
        plan = self._plan(self._api.list_slices(self._node_name, self._driver), chunks)
        report = ApplyReport(generation=plan.generation)
        for old in plan.to_delete:
            meta = old["metadata"]
            self._api.delete_slice(meta["name"], meta["uid"], meta["resourceVersion"])
            self._written.pop(meta["name"], None)
            report.deleted += 1
        count = len(chunks)
        for current, chunk in plan.matched:
            spec = _keep_taint_times(current, self._spec(chunk, plan.generation, count))
            if not self._in_sync(current, spec):
                self._remember(self._api.update_slice({**current, "spec": spec}), spec)
                report.updated += 1
        for chunk in plan.to_create:
            new = self._new_slice(chunk, plan.generation, count)
            self._remember(self._api.create_slice(new), new["spec"])
            report.created += 1
        if report.writes:
            log.info(
                "ResourceSlices of pool %s: %d created, %d updated, %d deleted, generation %d",
                self.pool_name,
                report.created,
                report.updated,
                report.deleted,
                report.generation,
            )
        return report

    def _plan(self, existing: list[JSON], chunks: list[list[Device]]) -> _Plan:
        ours = [s for s in existing if _pool(s).get("name") == self.pool_name]
        generation = max((int(_pool(s).get("generation", 0)) for s in ours), default=0)
        current = [s for s in ours if int(_pool(s).get("generation", 0)) == generation]
        plan = _Plan(generation)
        unmatched = list(current)
        for chunk in chunks:
            names = _device_names(chunk)
            found = next((s for s in unmatched if _device_names(_devices(s)) == names), None)
            if found is None:
                plan.to_create.append(chunk)
            else:
                unmatched.remove(found)
                plan.matched.append((found, chunk))
        if len(current) == 1 and len(chunks) == 1 and plan.to_create:
            # One slice for one: always the same slice, whatever its devices.
            plan.matched, plan.to_create, unmatched = [(current[0], chunks[0])], [], []
        plan.to_delete = [s for s in existing if s not in current] + unmatched
        changes = sum(
            not self._in_sync(s, _keep_taint_times(s, self._spec(c, generation, len(chunks))))
            for s, c in plan.matched
        )
        if not current or plan.to_create or unmatched or changes > 1:
            plan.generation = generation + 1
        return plan

    def _spec(self, chunk: list[Device], generation: int, count: int) -> JSON:
        return {
            "driver": self._driver,
            "nodeName": self._node_name,
            "pool": {
                "name": self.pool_name,
                "generation": generation,
                "resourceSliceCount": count,
            },
            "devices": chunk,
        }

    def _new_slice(self, chunk: list[Device], generation: int, count: int) -> JSON:
        if self._node_uid is None:
            self._node_uid = str(self._api.get_node(self._node_name)["metadata"]["uid"])
        return {
            "apiVersion": RESOURCE_API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": f"{self._node_name}-{self._driver}-",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self._node_name,
                        "uid": self._node_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": self._spec(chunk, generation, count),
        }

    def _in_sync(self, current: JSON, spec: JSON) -> bool:
        meta = current["metadata"]
        if self._written.get(meta["name"]) == (meta.get("resourceVersion"), spec):
            return True
        # Not what we last wrote (another process wrote it, or someone changed it): compare
        # as the server does. It stores what we write normalized, so the plain JSON of an
        # untouched slice differs from ours, and a restarted plugin rewrote every slice.
        return bool(_canonical(current.get("spec") or {}) == _canonical(spec))

    def _remember(self, stored: JSON, spec: JSON) -> None:
        meta = stored["metadata"]
        self._written[meta["name"]] = (meta.get("resourceVersion"), spec)


def _canonical(value: Any, path: tuple[str, ...] = ()) -> Any:
    """A ResourceSlice spec as the API server compares it; ``path``: where ``value`` is in it.

    The server writes back what it stores in its own form: it leaves out empty lists, maps
    and strings (``devices: []`` of the empty slice, a device's ``attributes: {}``) and
    writes quantities in canonical form ("1024Mi" comes back as "1Gi", "2000" as "2k",
    "1.5" as "1500m"). So empty values are dropped and quantities become exact numbers.
    """
    if isinstance(value, Mapping):
        canonical = {str(k): _canonical(v, (*path, str(k))) for k, v in value.items()}
        return {k: v for k, v in canonical.items() if not _is_empty(v)}
    if isinstance(value, list):
        return [_canonical(v, (*path, "[]")) for v in value]
    if _is_quantity_field(path):
        return _quantity_value(value)
    return value


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, str | list | dict) and not value)


def _is_quantity_field(path: tuple[str, ...]) -> bool:
    """Whether ``path`` names a quantity of a ResourceSlice spec."""
    # devices[].capacity.<name>.value, and the quantities of its requestPolicy (default,
    # validValues[], validRange.min/max/step): every leaf of a capacity is one.
    if path[:3] == ("devices", "[]", "capacity") and len(path) > 4:
        return True
    # devices[].consumesCounters[].counters.<name>.value, sharedCounters[].counters...
    return len(path) >= 3 and path[-3] == "counters" and path[-1] == "value"


def _quantity_value(value: Any) -> Any:
    """The exact value of a quantity ("1Gi", "1073741824"), or ``value`` if it is none."""
    try:
        return parse_quantity(value)
    except ValueError:
        return value


def _keep_taint_times(current: JSON, spec: JSON) -> JSON:
    """``spec`` with the ``timeAdded`` the server gave ``current``'s taints, where ours has none.

    The server sets a taint's ``timeAdded`` to the time of the write when it is missing,
    so writing a taint without it again would restart the clock of every NoExecute
    toleration, and would make an untouched slice look changed. (The Go resourceslice
    controller keeps them the same way.)
    """
    old_devices = {d.get("name"): d for d in _devices(current)}
    devices: list[Device] = []
    for device in spec["devices"]:
        old_taints = old_devices.get(device.get("name"), {}).get("taints") or []
        taints = [
            _with_time(taint, old_taints) if "timeAdded" not in taint else taint
            for taint in device.get("taints") or []
        ]
        devices.append({**device, "taints": taints} if taints else device)
    return {**spec, "devices": devices}


def _with_time(taint: Mapping[str, Any], old_taints: Sequence[Mapping[str, Any]]) -> JSON:
    keys = ("key", "value", "effect")
    for old in old_taints:
        if old.get("timeAdded") and all(old.get(k) == taint.get(k) for k in keys):
            return {**taint, "timeAdded": old["timeAdded"]}
    return dict(taint)


def _pool(resource_slice: JSON) -> JSON:
    return dict((resource_slice.get("spec") or {}).get("pool") or {})


def _devices(resource_slice: JSON) -> list[Device]:
    return list((resource_slice.get("spec") or {}).get("devices") or [])


def _device_names(devices: Sequence[Device]) -> frozenset[str]:
    return frozenset(str(d.get("name")) for d in devices)
