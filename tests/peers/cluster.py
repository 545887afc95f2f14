"""Cluster chores that a real node and kubelet would do, for tests.

There is no real kubelet in the test cluster, so somebody has to register a
Node and report it Ready with allocatable resources before the scheduler
will place pods on it. These helpers do that through ControlPlane.request
(the admin identity, standard library only), and poll for the states that
controllers and the scheduler produce, with a deadline and an error that
says what was last seen.
"""

from __future__ import annotations

import datetime
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from tests.peers.controlplane import ControlPlane

T = TypeVar("T")

#: What the test node offers; enough for any number of tiny test pods.
NODE_CAPACITY: Mapping[str, str] = {"cpu": "8", "memory": "16Gi", "pods": "110"}
#: What the test node declares (status.declaredFeatures), as a v1.37 kubelet with the DRA
#: gates nodedra uses does (tests.peers.profile): the API server admits node-allocatable
#: mappings only in slices of a node that declares their feature.
NODE_FEATURES: Sequence[str] = ("DRANodeAllocatableResources",)


class WaitTimeoutError(AssertionError):
    """A polled condition did not come true in time."""


def poll(
    check: Callable[[], T | None],
    timeout: float,
    describe: Callable[[], str],
    interval: float = 0.1,
) -> T:
    """Call `check` until it returns something other than None.

    On timeout, raise WaitTimeoutError with `describe()`, which should say what
    was expected and what was last observed.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeoutError(f"timed out after {timeout:.0f}s: {describe()}")
        time.sleep(interval)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def create_ready_node(
    cp: ControlPlane,
    name: str,
    capacity: Mapping[str, str] = NODE_CAPACITY,
    features: Sequence[str] = NODE_FEATURES,
) -> dict[str, Any]:
    """Register Node `name` and make it schedulable, as a kubelet would.

    The TaintNodesByCondition admission plugin taints a new Node
    not-ready; a kubelet's status update and the node lifecycle controller
    would lift that. Here the status is written directly and the taint
    removed (the node lifecycle controller is off; see CONTROLLERS).
    """
    cp.request(
        "POST",
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
            },
        },
    )
    now = _now()
    cp.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {
            "status": {
                "capacity": dict(capacity),
                "allocatable": dict(capacity),
                "declaredFeatures": list(features),
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "node readied by the nodedra test harness",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            }
        },
        content_type="application/merge-patch+json",
    )
    node: dict[str, Any] = cp.request(
        "PATCH",
        f"/api/v1/nodes/{name}",
        {"spec": {"taints": None}},
        content_type="application/merge-patch+json",
    )
    return node


def delete_node(cp: ControlPlane, name: str) -> None:
    cp.delete_if_present(f"/api/v1/nodes/{name}")


def ensure_test_namespace(cp: ControlPlane, namespace: str) -> None:
    """Create a namespace usable for pods even without the controller-manager:
    the ServiceAccount admission plugin rejects pods whose ServiceAccount
    does not exist yet, and only the controller-manager creates `default`."""
    cp.ensure_namespace(namespace)
    cp.create_if_absent(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
    )


def resource_slices(cp: ControlPlane, node: str, driver: str) -> list[dict[str, Any]]:
    """The ResourceSlices of `driver` on `node` (resource.k8s.io/v1)."""
    query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"})
    result = cp.request("GET", f"/apis/resource.k8s.io/v1/resourceslices?{query}")
    items: list[dict[str, Any]] = result["items"]
    return items


def pool_devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The devices of a pool's newest generation once all its slices are there, else None.

    That is when a scheduler uses a pool: ``resourceSliceCount`` slices of the highest
    generation. ``slices`` are one pool's (one driver on one node).
    """
    if not slices:
        return None
    top = max(s["spec"]["pool"]["generation"] for s in slices)
    current = [s for s in slices if s["spec"]["pool"]["generation"] == top]
    if len(current) != current[0]["spec"]["pool"]["resourceSliceCount"]:
        return None
    return [d for s in current for d in s["spec"].get("devices") or []]


def wait_for_slices(
    cp: ControlPlane, node: str, driver: str, devices: int, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Wait until `driver`'s pool on `node` is whole with `devices` devices; its devices."""
    seen: list[dict[str, Any]] = []

    def check() -> list[dict[str, Any]] | None:
        nonlocal seen
        seen = resource_slices(cp, node, driver)
        found = pool_devices(seen)
        return found if found is not None and len(found) == devices else None

    return poll(
        check, timeout, lambda: f"{devices} devices of {driver} on {node}; slices seen: {seen}"
    )


def pod_on(
    node: str,
    name: str,
    containers: Sequence[Mapping[str, Any]],
    claims: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A pod only ``node`` fits (by its hostname label), with ``containers`` and the pod
    claims ``claims`` (spec.resourceClaims), and no service account token."""
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "automountServiceAccountToken": False,
        "containers": [dict(c) for c in containers],
    }
    if claims:
        spec["resourceClaims"] = [dict(c) for c in claims]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def get_pod(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = cp.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return pod


def wait_pod_scheduled(
    cp: ControlPlane, namespace: str, name: str, timeout: float = 60.0
) -> dict[str, Any]:
    """Wait until the scheduler bound the pod to a node."""
    pod: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        nonlocal pod
        pod = get_pod(cp, namespace, name)
        return pod if pod["spec"].get("nodeName") else None

    def describe() -> str:
        conditions = (pod.get("status") or {}).get("conditions")
        return f"pod {namespace}/{name} to be bound to a node; status conditions: {conditions}"

    return poll(check, timeout, describe)


def pod_claim_name(pod: Mapping[str, Any], pod_claim: str) -> str | None:
    """The ResourceClaim name the controller-manager generated for a pod
    claim from a template (pod.status.resourceClaimStatuses)."""
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == pod_claim:
            name: str | None = status.get("resourceClaimName")
            return name
    return None


def get_claim(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    claim: dict[str, Any] = cp.request(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
    )
    return claim
