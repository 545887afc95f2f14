"""Where the API server has DRAConsumableCapacity off, topology-aware devices are withheld.

A real API server with the gate off (the run's own where it is off, else one of this
module's) drops a claim's capacity request, so a claim of one CPU would take a whole NUMA
node. `nodedra run` (a process, with its DaemonSet pod's credentials, beside the kubelet
harness) then publishes none of those devices, is not ready with a problem naming the gate,
posts an Event on the Node and counts the devices in ``nodedra_devices_withheld``; with
NODEDRA_ALLOW_WHOLE_NUMA_NODE_DEVICES=true it publishes them whole and is ready. nodedra
reads the four-NUMA-node fixture machine: four devices.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import Withheld
from nodedra.wholenuma import REASON, problem
from tests.conftest import KubeletFactory, NodedraFactory
from tests.peers.build import PeerBinaries
from tests.peers.cluster import create_ready_node, delete_node, poll, resource_slices
from tests.peers.controlplane import ControlPlane
from tests.peers.kubelet import KubeletHarness
from tests.peers.nodedra_node import TOPOLOGY_AWARE, NodedraProcess, install_nodedra
from tests.peers.profile import ClusterProfile

GATE = "DRAConsumableCapacity"
DEVICES = ("cpudevnuma000", "cpudevnuma001", "cpudevnuma002", "cpudevnuma003")


@pytest.fixture(scope="module")
def gate_off(
    control_plane: ControlPlane,
    cluster_profile: ClusterProfile,
    peer_binaries: PeerBinaries,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ControlPlane]:
    """A control plane with DRAConsumableCapacity off and manifests/ applied: the run's own
    where the gate is off (a release where it is alpha, or only GA DRA), else one of its own."""
    if not cluster_profile.on(GATE):
        install_nodedra(control_plane)
        yield control_plane
        return
    cp = ControlPlane(
        peer_binaries,
        tmp_path_factory.mktemp("consumable-off"),
        {**control_plane.feature_gates, GATE: False},
    )
    cp.start()
    try:
        install_nodedra(cp)
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def node(gate_off: ControlPlane) -> Iterator[str]:
    name = f"whole-numa-{uuid.uuid4().hex[:8]}"
    create_ready_node(gate_off, name)
    try:
        yield name
    finally:
        delete_node(gate_off, name)


@pytest.fixture
def kubelet(
    gate_off: ControlPlane, node: str, peer_binaries: PeerBinaries, peer_workdir: Path
) -> Iterator[KubeletHarness]:
    factory = KubeletFactory(gate_off, peer_binaries, peer_workdir)
    try:
        harness = factory(node)
        harness.wait_slice_wipe("")
        yield harness
    finally:
        factory.stop_all()


@pytest.fixture
def nodedras(gate_off: ControlPlane, peer_workdir: Path) -> Iterator[NodedraFactory]:
    factory = NodedraFactory(gate_off, peer_workdir)
    try:
        yield factory
    finally:
        factory.stop_all()


def readiness(nodedra: NodedraProcess) -> tuple[int, dict[str, Any]]:
    status, body = nodedra.readyz()
    return status, json.loads(body)


def node_events(cp: ControlPlane, node: str) -> list[dict[str, Any]]:
    """The events.k8s.io Events regarding Node ``node`` (in default, as the kubelet's)."""
    found = cp.request("GET", "/apis/events.k8s.io/v1/namespaces/default/events")
    return [
        e
        for e in found["items"]
        if (e.get("regarding") or {}).get("kind") == "Node" and e["regarding"]["name"] == node
    ]


def test_by_default_no_whole_numa_node_is_published_and_that_is_said(
    gate_off: ControlPlane, node: str, kubelet: KubeletHarness, nodedras: NodedraFactory
) -> None:
    nodedra = nodedras(kubelet, whole_numa_nodes=False)
    # Registered and published (nothing): what is left between it and ready is the gate.
    nodedra.process.wait_until(
        lambda: all(readiness(nodedra)[1][c] for c in ("serving", "registered", "published")),
        60,
        "registered, serving and its (empty) ResourceSlices published",
    )
    status, checks = readiness(nodedra)
    assert (status, checks["ready"]) == (503, False)
    assert checks["problems"] == [problem(Withheld(GATE, DEVICES))]
    assert (
        "DRAConsumableCapacity is alpha and off by default in Kubernetes 1.34 and 1.35"
        in (checks["problems"][0])
    )
    stored = resource_slices(gate_off, node, TOPOLOGY_AWARE)
    assert [d for s in stored for d in s["spec"].get("devices") or []] == []
    assert nodedra.metric("nodedra_devices_withheld", {"gate": GATE}) == len(DEVICES)
    assert nodedra.metric("nodedra_devices_published") == 0
    nodedra.wait_for_log("4 devices withheld (cpudevnuma000")

    event = poll(
        lambda: next((e for e in node_events(gate_off, node) if e["reason"] == REASON), None),
        30,
        lambda: f"an Event {REASON} on node {node}: {node_events(gate_off, node)}",
    )
    assert (event["type"], event["reportingController"]) == ("Warning", TOPOLOGY_AWARE)
    assert event["note"] == problem(Withheld(GATE, DEVICES))
    uid = gate_off.request("GET", f"/api/v1/nodes/{node}")["metadata"]["uid"]
    assert event["regarding"]["uid"] == uid


def test_allowed_whole_numa_nodes_are_published_whole(
    gate_off: ControlPlane, node: str, kubelet: KubeletHarness, nodedras: NodedraFactory
) -> None:
    nodedra = nodedras(kubelet, whole_numa_nodes=True)
    nodedra.wait_serving(gate_off, kubelet, TOPOLOGY_AWARE, len(DEVICES))
    status, checks = readiness(nodedra)
    assert (status, checks["ready"], checks["problems"]) == (200, True, [])
    stored = [
        d for s in resource_slices(gate_off, node, TOPOLOGY_AWARE) for d in s["spec"]["devices"]
    ]
    assert sorted(d["name"] for d in stored) == list(DEVICES)
    assert not any("allowMultipleAllocations" in d for d in stored)
    assert nodedra.metric("nodedra_devices_withheld", {"gate": GATE}) is None
    assert nodedra.metric("nodedra_devices_published") == len(DEVICES)
    assert [e for e in node_events(gate_off, node) if e["reason"] == REASON] == []
