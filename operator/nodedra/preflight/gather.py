"""Reading what the checks need and running them: one place for the command and the agent.

``nodedra preflight`` and ``nodedra run`` run the same checks on the same inputs: the
kubelet's files (paths from the settings), the Node and the node's ResourceSlices (from the
API server, with the permissions nodedra's pod already has: get nodes, list resourceslices)
and the feature gates probed by a dry run. A source that cannot be read makes its checks
``unknown``, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nodedra.dra.kube import KubeAPIError

from . import checks
from .checks import Check
from .kubelet import read_config, read_state


class NodeFacts(Protocol):
    """What the checks ask of the API server."""

    def get_node(self, name: str) -> dict[str, Any]:
        """The Node ``name``."""
        ...

    def list_node_slices(self, node_name: str) -> list[dict[str, Any]]:
        """Every driver's ResourceSlices on ``node_name``."""
        ...


@dataclass(frozen=True)
class Inputs:
    """Where the kubelet's files are and what nodedra reserves."""

    state_file: Path | None
    kubelet_config: Path | None
    reserved: frozenset[int]


def kubelet_checks(inputs: Inputs, asked: int = 0) -> list[Check]:
    """The checks of the kubelet's files, read now (cheap: run them as often as needed).

    ``asked``: cpusets the kubelet asked for since nodedra started (``nodedra run`` knows).
    """
    state = read_state(inputs.state_file)
    config = read_config(inputs.kubelet_config)
    return [
        checks.cpu_manager(state, config, asked),
        checks.kubelet_managers(config),
        checks.reserved_cpus(inputs.reserved, config),
    ]


@dataclass(frozen=True)
class ControlPlane:
    """What the checks know of the control plane and of what nodedra asks of it."""

    gates: Callable[[], Mapping[str, bool | None]]
    """The feature gates probed so far: on, off, or None (unknown)."""
    meaning: Mapping[str, str]
    """What each gate off costs."""
    server_version: str
    """The API server's (``v1.36.3``)."""
    numa_form: Callable[[], str]
    """The configuration's ``numaNodeAttribute.form`` now."""


def cluster_checks(api: NodeFacts, node_name: str, control: ControlPlane) -> list[Check]:
    """The checks of what the API server knows of this node (a few requests)."""
    node: dict[str, Any] | None = None
    node_why = ""
    try:
        node = api.get_node(node_name)
    except KubeAPIError as err:
        node_why = f"cannot read Node {node_name}: {err}"
    slices: list[dict[str, Any]] | None = None
    slices_why = ""
    try:
        slices = api.list_node_slices(node_name)
    except KubeAPIError as err:
        slices_why = f"cannot list the ResourceSlices of node {node_name}: {err}"
    gates = control.gates()
    return [
        checks.container_runtime(node, node_why),
        checks.other_cpu_drivers(slices, slices_why),
        checks.feature_gates(gates, control.meaning),
        checks.numa_attribute(
            control.numa_form(), gates.get(checks.LIST_GATE), control.server_version
        ),
    ]


def failed(results: list[Check]) -> bool:
    """Whether any check failed (``nodedra preflight`` then exits non-zero)."""
    return any(c.status == "fail" for c in results)


def render_text(results: list[Check]) -> str:
    """One line per check, ``STATUS name: detail``, and its fix indented below."""
    lines = []
    for check in results:
        lines.append(f"{check.status.upper():7} {check.name}: {check.detail}")
        if check.fix and check.status != "ok":
            lines.append(f"        fix: {check.fix}")
    return "\n".join(lines) + "\n"
