"""Whether the API server keeps device attributes whose value is a list.

List-valued attributes (``ints``, ``bools``, ``strings``, ``versions``) sit behind an API
server feature gate, and a gate cannot be seen through discovery. A server without it drops
the list field, which leaves the attribute without a value and the slice invalid. So we ask
the one way that tells: a server-side dry run of a slice carrying such an attribute, which
validates everything and stores nothing.
"""

from __future__ import annotations

from typing import Any

from .kube import RESOURCE_API_VERSION, ClusterAPI, KubeAPIError

PROBE_ATTRIBUTE = "listprobe"
PROBE_VALUE = [0, 1]


def probe_list_attributes(api: ClusterAPI, node_name: str, driver: str) -> bool:
    """Dry-run a slice with a list attribute; True if the server keeps the list.

    False when the server has no resource.k8s.io/v1 or refuses the attribute; other API
    errors are raised, since they tell nothing about the answer.
    """
    body: dict[str, Any] = {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node_name}-{driver}-probe-"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": f"{node_name}-probe", "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": "probe", "attributes": {PROBE_ATTRIBUTE: {"ints": PROBE_VALUE}}}],
        },
    }
    try:
        stored = api.create_slice(body, dry_run=True)
    except KubeAPIError as err:
        if err.status in (400, 404, 422):  # no such API, or the attribute has no value
            return False
        raise
    devices = (stored.get("spec") or {}).get("devices") or [{}]
    attribute = (devices[0].get("attributes") or {}).get(PROBE_ATTRIBUTE) or {}
    return bool(attribute.get("ints") == PROBE_VALUE)
