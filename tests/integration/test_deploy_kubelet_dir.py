"""The Helm chart on a real node whose kubelet has another root directory, as k0s has.

The kubelet is told the DRA socket's path, so the socket must be at the same path inside
nodedra's container and on the node: with ``kubeletDir`` the chart moves the hostPath volumes,
their mount paths and nodedra's registry and plugin directories together. Here the node's
kubelet runs with ``--root-dir=/var/lib/k0s/kubelet`` (tests.peers.deployment, its own cluster)
and has no /var/lib/kubelet/plugins_registry: nodedra registers only if everything followed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.peers.build import PeerBinaries
from tests.peers.cluster import resource_slices
from tests.peers.deployment import NAMESPACE, DeploymentCluster
from tests.peers.nodedra_node import ROOT, TOPOLOGY_AWARE

pytestmark = pytest.mark.timeout(600)

KUBELET_ROOT = "/var/lib/k0s/kubelet"


@pytest.fixture(scope="module")
def k0s_layout(
    node_binaries: PeerBinaries,
    dra_gates: dict[str, bool],
    nodedra_image: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DeploymentCluster]:
    cluster = DeploymentCluster(
        node_binaries,
        tmp_path_factory.mktemp("deploy-k0s"),
        dra_gates,
        [nodedra_image.archive],
        kubelet_root=KUBELET_ROOT,
        repo=ROOT,
    )
    with cluster:
        yield cluster


def test_chart_follows_the_kubelet_root_directory(k0s_layout: DeploymentCluster) -> None:
    """`helm install --set kubeletDir=/var/lib/k0s/kubelet`: the kubelet registers nodedra,
    whose sockets are in its root directory, and the node's slices are published."""
    cluster = k0s_layout
    registry = f"{KUBELET_ROOT}/plugins_registry"
    listed = cluster.node.namespace.run(
        ["ls", "-d", registry, "/var/lib/kubelet/plugins_registry"], check=False
    )
    assert registry in listed.stdout, listed
    assert "/var/lib/kubelet/plugins_registry" not in listed.stdout, (
        "the node has the default registry directory too: the test would not show that "
        "nodedra follows kubeletDir"
    )
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl(
        "label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged"
    )
    cluster.helm(
        "install",
        "nodedra",
        str(ROOT / "charts" / "nodedra"),
        "--namespace",
        NAMESPACE,
        "--set",
        "namespace.create=false",
        "--set",
        f"kubeletDir={KUBELET_ROOT}",
        "--wait",
        "--timeout=5m",
        timeout=360,
    )
    pod = cluster.wait_single_ready_pod()
    (container,) = pod["status"]["containerStatuses"]
    assert container["restartCount"] == 0
    # Ready means the kubelet confirmed the registration, which it can only have found in
    # its own root directory: the node has no other.
    log = cluster.node.log_paths()["kubelet"].read_text()
    assert re.search(r'"Registered DRA plugin" .*driverName="topology-aware\.nri\.io"', log), (
        "the kubelet never registered nodedra"
    )
    # The machine's view of the node's root directory (/var/lib/k0s/kubelet in its namespace).
    registrations = [p.name for p in cluster.node.registry_dir.iterdir() if p.is_socket()]
    assert any(name.startswith(f"{TOPOLOGY_AWARE}-") for name in registrations), registrations
    plugin_dir = cluster.node.plugins_dir / TOPOLOGY_AWARE
    assert any(p.is_socket() for p in plugin_dir.iterdir()), sorted(plugin_dir.iterdir())
    assert resource_slices(cluster.cp, cluster.node.node_name, TOPOLOGY_AWARE)
