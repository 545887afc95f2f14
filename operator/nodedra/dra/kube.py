"""The few Kubernetes API calls the plugin makes, on raw JSON.

The plugin works on objects in their API JSON form (camelCase mappings), the form kopf and
the REST API use. The official client's typed models would silently drop any field they do
not know, such as alpha device fields a newer API server serves, so every call here goes
through the client's transport and returns the JSON the server sent.

:class:`ClusterAPI` is the protocol the plugin needs (and beside it the claim status writer
and the Events recorded on the node); :class:`KubeClusterAPI` implements it on a
``kubernetes.client.ApiClient``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, cast

from kubernetes import client as k8s

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"
RESOURCE_API_VERSION = f"{RESOURCE_GROUP}/{RESOURCE_VERSION}"
"""The ``apiVersion`` of ResourceSlices and ResourceClaims as nodedra reads and writes them."""
RESOURCE_API = f"/apis/{RESOURCE_API_VERSION}"
EVENTS_API_VERSION = "events.k8s.io/v1"
"""The ``apiVersion`` of the Events nodedra records."""
REQUEST_TIMEOUT = 30.0
"""Seconds one API call may take; the kubelet gives a whole prepare call 45 s."""

JSON = dict[str, Any]


class ClaimIdentity(Protocol):
    """Which ResourceClaim (a ClaimRef is one)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...


class KubeAPIError(Exception):
    """An API call failed; ``status`` is the HTTP status, 0 when no answer came."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"({status}) {message}" if status else message)
        self.status = status

    @property
    def not_found(self) -> bool:
        """Whether the object (or the whole API) does not exist."""
        return self.status == 404


class ClusterAPI(Protocol):
    """What the plugin asks of the API server."""

    def get_claim(self, namespace: str, name: str) -> JSON:
        """The ResourceClaim ``namespace/name``."""
        ...

    def get_node(self, name: str) -> JSON:
        """The Node ``name`` (its UID owns the slices; its status declares its features)."""
        ...

    def list_slices(self, node_name: str, driver: str) -> list[JSON]:
        """The ResourceSlices of ``driver`` on ``node_name``."""
        ...

    def create_slice(self, body: Mapping[str, Any], *, dry_run: bool = False) -> JSON:
        """Create a ResourceSlice; with ``dry_run`` the server validates but stores nothing."""
        ...

    def update_slice(self, body: Mapping[str, Any]) -> JSON:
        """Replace the ResourceSlice ``body`` names (its resourceVersion is a precondition)."""
        ...

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        """Delete a ResourceSlice if it is still the one we saw; a missing one is fine."""
        ...

    def apply_claim_status(
        self, claim: ClaimIdentity, devices: list[JSON], field_manager: str
    ) -> JSON:
        """Make ``devices`` our entries of the claim's ``status.devices`` (server-side apply).

        Entries of other drivers, owned by other field managers, are left alone; applying
        an empty list removes ours. The claim's UID is a precondition.
        """
        ...

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        """Record an Event (``events.k8s.io/v1``, ``body``) in ``namespace``."""
        ...


class KubeClusterAPI:
    """:class:`ClusterAPI` on the official client's ``ApiClient`` (auth, TLS, retries)."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._client = api_client

    def get_claim(self, namespace: str, name: str) -> JSON:
        return self._call("GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")

    def get_node(self, name: str) -> JSON:
        return self._call("GET", f"/api/v1/nodes/{name}")

    def list_slices(self, node_name: str, driver: str) -> list[JSON]:
        selector = f"spec.nodeName={node_name},spec.driver={driver}"
        answer = self._call("GET", f"{RESOURCE_API}/resourceslices", fieldSelector=selector)
        return list(answer.get("items") or [])

    def list_node_slices(self, node_name: str) -> list[JSON]:
        """Every driver's ResourceSlices on ``node_name`` (for ``nodedra preflight``)."""
        selector = f"spec.nodeName={node_name}"
        answer = self._call("GET", f"{RESOURCE_API}/resourceslices", fieldSelector=selector)
        return list(answer.get("items") or [])

    def create_slice(self, body: Mapping[str, Any], *, dry_run: bool = False) -> JSON:
        query = {"dryRun": "All"} if dry_run else {}
        return self._call("POST", f"{RESOURCE_API}/resourceslices", body, **query)

    def update_slice(self, body: Mapping[str, Any]) -> JSON:
        name = body["metadata"]["name"]
        return self._call("PUT", f"{RESOURCE_API}/resourceslices/{name}", body)

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        options = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"uid": uid, "resourceVersion": resource_version},
        }
        try:
            self._call("DELETE", f"{RESOURCE_API}/resourceslices/{name}", options)
        except KubeAPIError as err:
            if not err.not_found:
                raise

    def apply_claim_status(
        self, claim: ClaimIdentity, devices: list[JSON], field_manager: str
    ) -> JSON:
        body = {
            "apiVersion": RESOURCE_API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid},
            "status": {"devices": devices},
        }
        path = f"{RESOURCE_API}/namespaces/{claim.namespace}/resourceclaims/{claim.name}/status"
        return self._call(
            "PATCH",
            path,
            body,
            content_type="application/apply-patch+yaml",
            fieldManager=field_manager,
            force="true",
        )

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        return self._call("POST", f"/apis/{EVENTS_API_VERSION}/namespaces/{namespace}/events", body)

    def _call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        **query: str,
    ) -> JSON:
        params = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query.items()),
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=dict(body) if body is not None else None,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._client.call_api(*params, _request_timeout=REQUEST_TIMEOUT)
            data: bytes = response.read()  # type: ignore[no-untyped-call]
        except Exception as err:  # urllib3 raises many kinds; all mean "no answer"
            raise KubeAPIError(0, f"{method} {path}: {err}") from err
        if not 200 <= response.status < 300:
            raise KubeAPIError(response.status, f"{method} {path}: {_status_message(data)}")
        return cast(JSON, json.loads(data))


def _status_message(data: bytes | None) -> str:
    """The message of a Status object the server answered with, or the raw answer."""
    text = (data or b"").decode("utf-8", "replace")
    try:
        status = json.loads(text)
    except ValueError:
        return text.strip() or "no message"
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return text.strip()
