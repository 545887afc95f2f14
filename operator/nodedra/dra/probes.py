"""What the API server keeps of a device: asked once per feature gate, by a dry run.

Some device fields sit behind feature gates (list-valued attributes; the node-allocatable
mappings of KEP-5517), and a gate cannot be seen through discovery. An API server with the
gate off drops the field it does not know, which either leaves the slice invalid or
publishes less than was meant, and a publisher comparing what it wrote with what is stored
would rewrite the slice forever. A field may also need the node's own support: the API
server refuses node-allocatable mappings for a node whose kubelet does not declare the
feature in ``status.declaredFeatures`` (a kubelet older than 1.36, or with the gate off),
since that kubelet would not give the pods the mapped CPUs and memory.

So we ask the one way that tells: a server-side dry run of a slice for our node carrying
such a device, which validates and admits everything and stores nothing, and a look at what
came back. Devices are then published without the fields that would not be kept.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodedra.lib.quantity import parse_quantity

from .kube import RESOURCE_API_VERSION, ClusterAPI, KubeAPIError
from .slices import Device

log = logging.getLogger(__name__)


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


PROBE_ATTRIBUTE = "listprobe"
PROBE_VALUE = [0, 1]
NODE_ALLOCATABLE_FIELD = "nodeAllocatableResources"

LIST_TYPE_ATTRIBUTES = Gate(
    "DRAListTypeAttributes",
    {"name": "probe", "attributes": {PROBE_ATTRIBUTE: {"ints": PROBE_VALUE}}},
    lambda device: (
        (device.get("attributes") or {}).get(PROBE_ATTRIBUTE, {}).get("ints") == PROBE_VALUE
    ),
)
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
    without=lambda device: {k: v for k, v in device.items() if k != NODE_ALLOCATABLE_FIELD},
    node_feature="DRANodeAllocatableResources",
    missing="devices are published without nodeAllocatableResources, so the scheduler counts "
    "the node's CPUs and memory twice, as devices and in the node's allocatable (turn the "
    "gate on in the API server, the scheduler and the kubelet, then restart nodedra)",
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
    missing="devices are published without allowMultipleAllocations and request policies, so "
    "a claim gets a whole device (a whole NUMA node with the topology-aware policy; turn the "
    "gate on in the API server, the scheduler and the kubelet, then restart nodedra)",
)
PUBLISHED_FIELD_GATES = (CONSUMABLE_CAPACITY, NODE_ALLOCATABLE_RESOURCES)
"""The gates whose fields devices are published with only while the gate is on."""


class GateProbe:
    """Which feature gates are on for our node, each asked once and remembered."""

    def __init__(self, api: ClusterAPI, node_name: str, driver: str) -> None:
        self._api = api
        self._node_name = node_name
        self._driver = driver
        self._mu = threading.Lock()
        self._known: dict[str, bool] = {}

    def known(self) -> dict[str, bool]:
        """The gates asked about so far, and whether each is on."""
        with self._mu:
            return dict(self._known)

    def on(self, gate: Gate) -> bool:
        """Whether ``gate`` is on; KubeAPIError (and asked again) when the server can't tell."""
        with self._mu:
            known = self._known.get(gate.name)
        if known is not None:
            return known
        why_off = self._why_off(gate)
        with self._mu:
            first = gate.name not in self._known
            self._known[gate.name] = why_off is None
        if first and why_off is not None and gate.missing:
            log.warning("%s: %s", why_off, gate.missing)
        return why_off is None

    def as_kept(self, devices: Sequence[Device]) -> Sequence[Device]:
        """``devices`` without the fields of gates that are off (KubeAPIError as :meth:`on`)."""
        for gate in PUBLISHED_FIELD_GATES:
            if any(gate.uses(d) for d in devices) and not self.on(gate):
                devices = [gate.without(d) for d in devices]
        return devices

    def _why_off(self, gate: Gate) -> str | None:
        """Dry-run a slice with the gate's device: None if its field came back, else why not.

        Off when the server has no resource.k8s.io/v1 or refuses the device (what it does
        when the dropped field leaves the device invalid), and when it forbids the device
        because our node does not declare the gate's node feature. Other API errors are
        raised, since they tell nothing about the answer.
        """
        try:
            stored = self._api.create_slice(self._probe_slice(gate), dry_run=True)
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
        return None if gate.kept(devices[0]) else f"the API server has feature gate {gate.name} off"

    def _node_declares(self, gate: Gate) -> bool:
        node = self._api.get_node(self._node_name)
        return gate.node_feature in ((node.get("status") or {}).get("declaredFeatures") or [])

    def _probe_slice(self, gate: Gate) -> dict[str, Any]:
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
                "devices": [dict(gate.device)],
            },
        }
