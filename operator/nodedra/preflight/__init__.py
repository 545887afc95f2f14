"""Checks of the node nodedra runs on: what would make pinning fight someone, or fail.

The kubelet's CPU, memory and topology managers and its reserved CPUs, the container runtime
and its NRI, other CPU drivers on the node, the API server's feature gates: each check a
verdict (ok, unknown, warn, fail) and a fix. ``nodedra preflight`` prints them; ``nodedra
run`` keeps them (:class:`Preflight`): at start, in ``/readyz``, as Events on the Node, and a
failing CPU manager check holds pinning until it passes.
"""

from .checks import Check
from .gather import (
    ControlPlane,
    Inputs,
    NodeFacts,
    cluster_checks,
    failed,
    kubelet_checks,
    render_text,
)
from .keeper import Preflight

__all__ = [
    "Check",
    "ControlPlane",
    "Inputs",
    "NodeFacts",
    "Preflight",
    "cluster_checks",
    "failed",
    "kubelet_checks",
    "render_text",
]
