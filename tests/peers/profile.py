"""Which Kubernetes release and which DRA feature gates a test run's peers run with.

The whole suite runs at the newest release with every DRA gate nodedra uses turned on; the
compatibility runs choose another release (``NODEDRA_KUBERNETES``, e.g. ``v1.34.4``) or turn
every DRA gate that is not GA off (``NODEDRA_DRA_GATES=ga``). Tests ask the profile what the
cluster has (``profile.on("DRAConsumableCapacity")``, read from the running API server) and
assert what nodedra does there: the feature, or the documented fallback.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodedra.dra.probes import (
    NODE_ALLOCATABLE_FIELD,
    NODE_ALLOCATABLE_FIELD_1_36,
    NODE_ALLOCATABLE_RESOURCES,
    PUBLISHED_FIELD_GATES,
)
from tests.peers.peer_groups import KUBERNETES_VERSIONS

KUBERNETES_ENV = "NODEDRA_KUBERNETES"
GATES_ENV = "NODEDRA_DRA_GATES"
GATE_MODES = ("alpha", "ga")

#: The DRA gates nodedra relies on, turned on (mode "alpha") wherever a release lets one set
#: them: consumable capacity and multiple allocations per device (the topology-aware
#: policy), list-typed attributes, node allocatable resources backed by devices, shared
#: counters, device taints.
NODEDRA_GATES = (
    "DRAConsumableCapacity",
    "DRAListTypeAttributes",
    "DRANodeAllocatableResources",
    "DRAPartitionableDevices",
    "DRADeviceTaints",
)

_SETTABLE = re.compile(r"kube:(\w+)=true\|false \((ALPHA|BETA) - default=(true|false)\)")


class ProfileError(ValueError):
    """The environment asks for a release or gate mode the peers do not have."""


def chosen_version() -> str:
    """The release this run uses: ``NODEDRA_KUBERNETES`` (``v1.34.4`` or ``1.34``), else
    the newest."""
    wanted = os.environ.get(KUBERNETES_ENV, "").strip()
    if not wanted:
        return KUBERNETES_VERSIONS[0]
    for version in KUBERNETES_VERSIONS:
        if version == wanted or version.removeprefix("v").startswith(
            wanted.removeprefix("v") + "."
        ):
            return version
    raise ProfileError(
        f"{KUBERNETES_ENV}={wanted}: the peers are built at {', '.join(KUBERNETES_VERSIONS)} "
        "(tests/peers/peer_groups.py KUBERNETES_VERSIONS)"
    )


def chosen_gate_mode() -> str:
    mode = os.environ.get(GATES_ENV, "").strip() or GATE_MODES[0]
    if mode not in GATE_MODES:
        raise ProfileError(f"{GATES_ENV}={mode}: choose {' or '.join(GATE_MODES)}")
    return mode


@functools.cache
def settable_gates(apiserver: Path) -> dict[str, tuple[str, bool]]:
    """The alpha and beta gates of a kube-apiserver binary: stage and default (its -h)."""
    text = subprocess.run(
        [str(apiserver), "-h"], capture_output=True, text=True, check=False
    ).stdout
    return {name: (stage, default == "true") for name, stage, default in _SETTABLE.findall(text)}


def gates_for(apiserver: Path, mode: str) -> dict[str, bool]:
    """The --feature-gates every component of the run gets.

    "alpha": NODEDRA_GATES on, where settable (a GA gate cannot always be set, and an
    unknown one stops the component). "ga": every DRA gate that is not GA off.
    """
    settable = settable_gates(apiserver)
    if mode == "alpha":
        return {gate: True for gate in NODEDRA_GATES if gate in settable}
    return {gate: False for gate in sorted(settable) if gate.startswith("DRA")}


#: resource.k8s.io versions every run serves: v1 is what nodedra and the kubelet use; the
#: betas are for clients that still speak them.
API_VERSIONS = ("v1", "v1beta1", "v1beta2")


def runtime_config(apiserver: Path, gates: Mapping[str, bool]) -> str:
    """The API server's --runtime-config for ``gates``: with DRADeviceTaints on where it is
    alpha, also v1alpha3, which serves its DeviceTaintRules (the scheduler waits for them)."""
    versions = list(API_VERSIONS)
    if (
        gates.get("DRADeviceTaints")
        and settable_gates(apiserver).get("DRADeviceTaints", ("",))[0] == "ALPHA"
    ):
        versions.append("v1alpha3")
    return ",".join(f"resource.k8s.io/{v}=true" for v in versions)


@dataclass(frozen=True)
class ClusterProfile:
    """A run's release and gates, and which features its API server has on."""

    version: str
    mode: str
    gates: Mapping[str, bool]
    """What every component is given."""
    enabled: Mapping[str, bool] = field(default_factory=dict)
    """Every gate the API server knows, as it reports it (kubernetes_feature_enabled)."""

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])

    @property
    def newest(self) -> bool:
        """The newest release with every gate nodedra uses: where the whole suite runs."""
        return self.version == KUBERNETES_VERSIONS[0] and self.mode == "alpha"

    def on(self, gate: str) -> bool:
        """Whether the API server has ``gate`` on (False for a gate it does not know)."""
        return self.enabled.get(gate, False)

    def describe(self) -> str:
        return f"Kubernetes {self.version}, DRA gates {self.mode}"

    def as_published(self, devices: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """What nodedra publishes of a policy's ``devices`` here (for a node that declares
        its features): without what the gates that are off would add."""
        published = list(devices)
        for gate in PUBLISHED_FIELD_GATES:
            if not self.on(gate.name):
                published = [gate.without(d) for d in published]
        return self.spelled(published)

    def spelled(self, devices: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """``devices`` with each gated field as this release spells it (1.36 spells the
        node-allocatable mappings otherwise)."""
        spelled = list(devices)
        for gate in PUBLISHED_FIELD_GATES:
            if (older := gate.spelling_at(self.minor)) is not None:
                spelled = [older.rewrite(d) for d in spelled]
        return spelled

    @property
    def node_allocatable_field(self) -> str:
        """The device field of the node-allocatable mappings at this release."""
        return (
            NODE_ALLOCATABLE_FIELD_1_36
            if NODE_ALLOCATABLE_RESOURCES.spelling_at(self.minor)
            else NODE_ALLOCATABLE_FIELD
        )


def read_enabled(metrics: str) -> dict[str, bool]:
    """The gates of an API server's /metrics text, and whether each is on."""
    pattern = re.compile(r'^kubernetes_feature_enabled\{name="(\w+)",stage="\w*"\} (\d)', re.M)
    return {name: value == "1" for name, value in pattern.findall(metrics)}
