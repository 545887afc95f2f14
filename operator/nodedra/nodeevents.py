"""Events on the Node object: what an admin sees in ``kubectl describe node``.

Some of what nodedra finds needs a person, and a person looking at a node reads its Events
before any log: claims kept that hold huge pages the node no longer has, after a boot. Each
is an ``events.k8s.io/v1`` Event ``regarding`` the Node, in the ``default`` namespace, as the
kubelet records its Node events (the API server takes an Event about a cluster-scoped object
only in ``default`` or ``kube-system``), reported by the driver.

Recording is best-effort: what an Event says is in the log and the metrics too, so an Event
that cannot be posted (the API server away, the RBAC rule missing) is logged and dropped,
and never fails nodedra nor whatever it was doing.
"""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime

from nodedra.dra import ClusterAPI
from nodedra.dra.kube import EVENTS_API_VERSION

log = logging.getLogger(__name__)

NAMESPACE = "default"
"""Where Events about the Node go (the kubelet's go there too)."""
NOTE_LIMIT = 1024
"""Bytes of an Event's note the API server takes."""
FIELD_LIMIT = 128
"""Characters of an Event's reportingInstance (and action, reason) the API server takes."""
NAME_LIMIT = 253
"""Characters of an object's name."""


class NodeEvents:
    """Records Events regarding one Node, reported by one driver."""

    def __init__(self, api: ClusterAPI, node_name: str, controller: str) -> None:
        self._api = api
        self._node = node_name
        self._controller = controller
        """``reportingController``: the driver's name, a qualified name as the API requires."""
        self._node_uid: str | None = None

    def warning(self, reason: str, action: str, note: str) -> bool:
        """Record a Warning; whether it was posted (a failure is logged, never raised)."""
        return self._record("Warning", reason, action, note)

    def _record(self, kind: str, reason: str, action: str, note: str) -> bool:
        try:
            self._api.create_event(NAMESPACE, self._event(kind, reason, action, note))
        except Exception as err:  # best-effort, whatever the client raises
            log.warning("could not record Event %s on node %s: %s", reason, self._node, err)
            return False
        return True

    def _event(self, kind: str, reason: str, action: str, note: str) -> dict[str, object]:
        return {
            "apiVersion": EVENTS_API_VERSION,
            "kind": "Event",
            "metadata": {"name": _event_name(self._node)},
            "eventTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": self._controller,
            "reportingInstance": f"{self._controller}-{self._node}"[:FIELD_LIMIT],
            "action": action,
            "reason": reason,
            "type": kind,
            "note": _truncated(note, NOTE_LIMIT),
            "regarding": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self._node,
                "uid": self._uid(),
            },
        }

    def _uid(self) -> str:
        """The Node's UID, asked once (``kubectl describe node`` matches Events on it)."""
        if self._node_uid is None:
            self._node_uid = str(self._api.get_node(self._node)["metadata"]["uid"])
        return self._node_uid


def _event_name(node: str) -> str:
    """``<node>.<16 hex digits>``, as the kubelet names its Node Events.

    A name, not a generateName of ``<node>.``: the API server checks an Event's
    generateName as a whole name, and a name may not end in a dot.
    """
    return f"{node[: NAME_LIMIT - 17]}.{secrets.token_hex(8)}"


def _truncated(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8, on a character boundary."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "..."
