"""nodedra's endpoints where its pod's settings put them: for ``nodedra get`` and ``gather``.

The addresses are the pod's own settings (``NODEDRA_METRICS_ADDRESS``,
``NODEDRA_HEALTH_ADDRESS``, ``NODEDRA_STATUS_ADDRESS``), which a command run with
``kubectl exec`` inherits from the container's environment; unset, ``nodedra run``'s
defaults.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from nodedra.endpoints import Answer, get
from nodedra.settings import (
    DEFAULT_HEALTH_ADDRESS,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_STATUS_ADDRESS,
)


@dataclass(frozen=True)
class Endpoint:
    """One path nodedra serves, and the setting that says where."""

    path: str
    variable: str
    default: str


ENDPOINTS = {
    "readyz": Endpoint("/readyz", "NODEDRA_METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS),
    "metrics": Endpoint("/metrics", "NODEDRA_METRICS_ADDRESS", DEFAULT_METRICS_ADDRESS),
    "healthz": Endpoint("/healthz", "NODEDRA_HEALTH_ADDRESS", DEFAULT_HEALTH_ADDRESS),
    "status": Endpoint("/status", "NODEDRA_STATUS_ADDRESS", DEFAULT_STATUS_ADDRESS),
}


def address_of(name: str, environ: Mapping[str, str] = os.environ) -> str:
    """Where ``name`` is served: its setting's variable, else nodedra run's default."""
    endpoint = ENDPOINTS[name]
    return environ.get(endpoint.variable, endpoint.default)


def get_named(name: str, timeout: float = 10.0, environ: Mapping[str, str] = os.environ) -> Answer:
    """What the endpoint ``name`` (readyz, metrics, healthz, status) answers here."""
    return get(address_of(name, environ), ENDPOINTS[name].path, timeout)
