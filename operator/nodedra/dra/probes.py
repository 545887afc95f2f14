"""What the API server keeps of a device: asked once per feature gate, by a dry run.

Some device fields sit behind feature gates (list-valued attributes, KEP-5491; the
node-allocatable mappings of KEP-5517), and a gate cannot be seen through discovery. An API
server with the gate off drops the field it does not know, which either leaves the slice
invalid or publishes less than was meant, and a publisher comparing what it wrote with what
is stored would rewrite the slice forever. A field may also need the node's own support: the
API server refuses node-allocatable mappings for a node whose kubelet does not declare the
feature in ``status.declaredFeatures`` (a kubelet older than 1.36, or with the gate off),
since that kubelet would not give the pods the mapped CPUs and memory.

So we ask the one way that tells: a server-side dry run of a slice for our node carrying
such a device, which validates and admits everything and stores nothing, and a look at what
came back. Devices are then published without the fields that would not be kept.

A field an older release spells otherwise is asked in each spelling, newest first, and
published in the first one kept: Kubernetes 1.36 takes the node-allocatable mappings as
``nodeAllocatableResourceMappings`` (``capacityKey`` and ``allocationMultiplier``, no
overheads), 1.37 as ``nodeAllocatableResources``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodedra.lib.attributes import first_values, has_lists
from nodedra.lib.quantity import parse_quantity

from .kube import RESOURCE_API_VERSION, ClusterAPI, KubeAPIError
from .slices import Device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Spelling:
    """How a release spells a gate's field.

    A probe device in that spelling, whether the stored probe device still has it, and a
    device of the newest spelling rewritten to it.
    """

    until: int | None
    """The last minor release of Kubernetes 1 that spells it so; None: releases still do."""
    device: Device
    kept: Callable[[Device], bool]
    rewrite: Callable[[Device], Device]


@dataclass(frozen=True)
class Gate:
    """A feature gate, as seen in what the API server keeps of a probe device."""

    name: str
    device: Device
    """A device that uses the gated field."""
    kept: Callable[[Device], bool]
    """Whether the stored probe device still has the field."""
    uses: Callable[[Device], bool] = lambda device: False
    """Whether a device uses what the gate adds (then it is published only while it is on)."""
    without: Callable[[Device], Device] = lambda device: device
    """A device without what the gate adds."""
    node_feature: str = ""
    """The feature the node must declare for the server to admit the field, if any."""
    missing: str = ""
    """What it means for the node when the field is not published (logged once)."""
    older: tuple[Spelling, ...] = ()
    """How older releases spell the field, newest first (asked after the gate's own)."""

    @property
    def spellings(self) -> tuple[Spelling, ...]:
        """Every spelling of the field, the newest (the gate's own device) first."""
        return (Spelling(None, self.device, self.kept, lambda device: device), *self.older)

    def spelling_at(self, minor: int) -> Spelling | None:
        """The older spelling Kubernetes 1.<minor> takes; None where it takes the newest."""
        return next((s for s in reversed(self.older) if s.until and minor <= s.until), None)


PROBE_ATTRIBUTE = "listprobe"
PROBE_VALUE = [0, 1]
NODE_ALLOCATABLE_FIELD = "nodeAllocatableResources"


def _without_lists(device: Device) -> Device:
    return {**device, "attributes": first_values(device.get("attributes") or {})}


LIST_TYPE_ATTRIBUTES = Gate(
    "DRAListTypeAttributes",
    {"name": "probe", "attributes": {PROBE_ATTRIBUTE: {"ints": PROBE_VALUE}}},
    lambda device: (
        (device.get("attributes") or {}).get(PROBE_ATTRIBUTE, {}).get("ints") == PROBE_VALUE
    ),
    uses=lambda device: has_lists(device.get("attributes") or {}),
    without=_without_lists,
    missing="resource.kubernetes.io/numaNode is published as the device's NUMA node alone, "
    "not the list of numaNodeAttribute.form (turn the gate on in the API server and the "
    "scheduler, then restart nodedra)",
)
NODE_ALLOCATABLE_FIELD_1_36 = "nodeAllocatableResourceMappings"


def _node_allocatable_as_in_1_36(device: Device) -> Device:
    """A device with its mappings as 1.36 spells them.

    A capacity's mapping keeps its ``capacityKey`` and multiplies by
    ``allocationMultiplier``; a per-device mapping is an ``allocationMultiplier`` alone.
    1.36 has no overheads: an entry with only an overhead is left out.
    """
    entries = device.get(NODE_ALLOCATABLE_FIELD)
    if entries is None:
        return device
    rewritten = {k: v for k, v in device.items() if k != NODE_ALLOCATABLE_FIELD}
    mappings = {}
    for resource, entry in entries.items():
        mapping = entry.get("mapping")
        if mapping is None:
            continue
        if "capacityKey" in mapping:
            mappings[resource] = {
                "capacityKey": mapping["capacityKey"],
                "allocationMultiplier": mapping.get("capacityMultiplier", "1"),
            }
        else:
            mappings[resource] = {"allocationMultiplier": mapping["deviceMultiplier"]}
    if mappings:
        rewritten[NODE_ALLOCATABLE_FIELD_1_36] = mappings
    return rewritten


def _without_node_allocatable(device: Device) -> Device:
    """The device without its mappings, and without the capacities mapped to huge pages.

    A container may use huge pages only up to what the kubelet accounts to its pod, and a
    claim's are accounted only through the mapping: without it they would be promised to a
    claim whose containers cannot touch them.
    """
    mapped = {
        (entry.get("mapping") or {}).get("capacityKey")
        for resource, entry in (device.get(NODE_ALLOCATABLE_FIELD) or {}).items()
        if resource.startswith("hugepages-")
    }
    bare = {k: v for k, v in device.items() if k != NODE_ALLOCATABLE_FIELD}
    if mapped & set(device.get("capacity") or {}):
        bare["capacity"] = {k: v for k, v in device["capacity"].items() if k not in mapped}
    return bare


NODE_ALLOCATABLE_RESOURCES = Gate(
    "DRANodeAllocatableResources",
    {
        "name": "probe",
        "capacity": {"cpu": {"value": "1"}},
        NODE_ALLOCATABLE_FIELD: {
            "cpu": {"mapping": {"capacityKey": "cpu", "capacityMultiplier": "1"}}
        },
    },
    lambda device: bool((device.get(NODE_ALLOCATABLE_FIELD) or {}).get("cpu")),
    uses=lambda device: NODE_ALLOCATABLE_FIELD in device,
    without=_without_node_allocatable,
    node_feature="DRANodeAllocatableResources",
    missing="devices are published without nodeAllocatableResources, so the scheduler counts "
    "the node's CPUs and memory twice, as devices and in the node's allocatable (turn the "
    "gate on in the API server, the scheduler and the kubelet, then restart nodedra)",
    older=(
        Spelling(
            36,
            {
                "name": "probe",
                "capacity": {"cpu": {"value": "1"}},
                NODE_ALLOCATABLE_FIELD_1_36: {
                    "cpu": {"capacityKey": "cpu", "allocationMultiplier": "1"}
                },
            },
            lambda device: bool((device.get(NODE_ALLOCATABLE_FIELD_1_36) or {}).get("cpu")),
            _node_allocatable_as_in_1_36,
        ),
    ),
)


def _uses_consumable_capacity(device: Device) -> bool:
    return "allowMultipleAllocations" in device or any(
        "requestPolicy" in capacity for capacity in (device.get("capacity") or {}).values()
    )


def _without_consumable_capacity(device: Device) -> Device:
    """The device as a whole: no multiple allocations and no request policies.

    Mappings of consumed capacity become what the whole device stands for: a claim then
    gets all of it, and its allocation carries no consumed capacity for the scheduler to map.
    """
    capacities = device.get("capacity") or {}
    bare = {k: v for k, v in device.items() if k != "allowMultipleAllocations"}
    if capacities:
        bare["capacity"] = {
            name: {k: v for k, v in capacity.items() if k != "requestPolicy"}
            for name, capacity in capacities.items()
        }
    if NODE_ALLOCATABLE_FIELD in device:
        bare[NODE_ALLOCATABLE_FIELD] = {
            resource: _whole_device(entry, capacities)
            for resource, entry in device[NODE_ALLOCATABLE_FIELD].items()
        }
    return bare


def _whole_device(entry: Mapping[str, Any], capacities: Mapping[str, Any]) -> Mapping[str, Any]:
    mapping = entry.get("mapping") or {}
    key = mapping.get("capacityKey")
    if key is None:
        return entry
    amount = parse_quantity(capacities[key]["value"]) * parse_quantity(
        mapping.get("capacityMultiplier", "1")
    )
    whole = str(amount.numerator) if amount.denominator == 1 else f"{float(amount):g}"
    return {**entry, "mapping": {"deviceMultiplier": whole}}


CONSUMABLE_CAPACITY = Gate(
    "DRAConsumableCapacity",
    {
        "name": "probe",
        "capacity": {"cpu": {"value": "2", "requestPolicy": {"default": "1"}}},
        "allowMultipleAllocations": True,
    },
    lambda device: device.get("allowMultipleAllocations") is True,
    uses=_uses_consumable_capacity,
    without=_without_consumable_capacity,
    missing="a claim would get the whole of a device offered in parts (a whole NUMA node with "
    "the topology-aware policy): such devices are withheld, or where allowed published whole, "
    "without allowMultipleAllocations and request policies (turn the gate on in the API "
    "server, the scheduler and the kubelet, then restart nodedra)",
)
PUBLISHED_FIELD_GATES = (CONSUMABLE_CAPACITY, NODE_ALLOCATABLE_RESOURCES, LIST_TYPE_ATTRIBUTES)
"""The gates whose fields devices are published with only while the gate is on."""


class GateProbe:
    """Which feature gates are on for our node, each asked once and remembered."""

    def __init__(self, api: ClusterAPI, node_name: str, driver: str) -> None:
        self._api = api
        self._node_name = node_name
        self._driver = driver
        self._mu = threading.Lock()
        self._known: dict[str, Spelling | None] = {}

    def known(self) -> dict[str, bool]:
        """The gates asked about so far, and whether each is on."""
        with self._mu:
            return {name: spelling is not None for name, spelling in self._known.items()}

    def on(self, gate: Gate) -> bool:
        """Whether ``gate`` is on; KubeAPIError (and asked again) when the server can't tell."""
        return self.spelling(gate) is not None

    def spelling(self, gate: Gate) -> Spelling | None:
        """The spelling of ``gate``'s field the server keeps; None if none (or as :meth:`on`)."""
        with self._mu:
            if gate.name in self._known:
                return self._known[gate.name]
        kept, why_off = None, None
        for spelling in gate.spellings:
            why = self._why_off(gate, spelling)
            if why is None:
                kept = spelling
                break
            why_off = why_off or why
        with self._mu:
            first = gate.name not in self._known
            self._known[gate.name] = kept
        if first and kept is None and gate.missing:
            log.warning("%s: %s", why_off, gate.missing)
        if first and kept is not None and kept.until is not None:
            log.info(
                "the API server takes %s's field as Kubernetes 1.%d spells it: devices are "
                "published so",
                gate.name,
                kept.until,
            )
        return kept

    def as_kept(self, devices: Sequence[Device]) -> Sequence[Device]:
        """``devices`` as the server keeps them: each field in its spelling, or left out.

        KubeAPIError as :meth:`on`.
        """
        for gate in PUBLISHED_FIELD_GATES:
            if not any(gate.uses(d) for d in devices):
                continue
            spelling = self.spelling(gate)
            rewrite = gate.without if spelling is None else spelling.rewrite
            devices = [rewrite(d) for d in devices]
        return devices

    def _why_off(self, gate: Gate, spelling: Spelling) -> str | None:
        """Dry-run a slice with the spelling's device: None if its field came back, else why not.

        Off when the server has no resource.k8s.io/v1 or refuses the device (what it does
        when the dropped field leaves the device invalid), and when it forbids the device
        because our node does not declare the gate's node feature. Other API errors are
        raised, since they tell nothing about the answer.
        """
        try:
            stored = self._api.create_slice(self._probe_slice(spelling.device), dry_run=True)
        except KubeAPIError as err:
            if err.status in (400, 404, 422):  # no such API, or the device has no value left
                return f"the API server has feature gate {gate.name} off ({err})"
            if err.status == 403 and gate.node_feature and not self._node_declares(gate):
                return (
                    f"node {self._node_name} does not declare feature {gate.node_feature} "
                    "(its kubelet is older than 1.36 or has the gate off)"
                )
            raise
        devices = (stored.get("spec") or {}).get("devices") or [{}]
        if spelling.kept(devices[0]):
            return None
        return f"the API server has feature gate {gate.name} off"

    def _node_declares(self, gate: Gate) -> bool:
        node = self._api.get_node(self._node_name)
        return gate.node_feature in ((node.get("status") or {}).get("declaredFeatures") or [])

    def _probe_slice(self, device: Device) -> dict[str, Any]:
        return {
            "apiVersion": RESOURCE_API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"generateName": f"{self._node_name}-{self._driver}-probe-"},
            "spec": {
                "driver": self._driver,
                "nodeName": self._node_name,
                "pool": {
                    "name": f"{self._node_name}-probe",
                    "generation": 0,
                    "resourceSliceCount": 1,
                },
                "devices": [dict(device)],
            },
        }
