"""The package's one cluster (see the package) and nodedra deployed on it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import VMNodeFactory
from tests.integration.vm_cluster import TEST_NAMESPACE
from tests.peers.build import PeerBinaries
from tests.peers.deployment import ToolError, rollout_status
from tests.peers.nodedra_node import ROOT
from tests.peers.vm_cluster import VMCluster


@pytest.fixture(scope="package")
def vm_cluster(
    vm_node_factory: VMNodeFactory,
    node_binaries: PeerBinaries,
    dra_gates: dict[str, bool],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VMCluster]:
    """The control plane and the guest joined to it, Node Ready."""
    started = time.monotonic()
    with VMCluster(
        node_binaries,
        tmp_path_factory.mktemp("vm-cluster"),
        dra_gates,
        vm_node_factory,
        repo=ROOT,
    ) as cluster:
        print(
            f"[vm] cluster up {time.monotonic() - started:.1f}s (guest boot "
            f"{cluster.vm.boot_seconds:.1f}s, containerd, kube-proxy and the kubelet to Ready "
            f"{cluster.join_seconds:.1f}s)"
        )
        cluster.cp.ensure_namespace(TEST_NAMESPACE)
        yield cluster


@pytest.fixture(scope="package")
def deployed(vm_cluster: VMCluster) -> VMCluster:
    """`kubectl apply -k deploy/overlays/quiet-cpus/` done (the manifests, and the host's files
    quietCPUs writes mounted; the feature stays off until test_quiet_cpus turns it on) and
    the DaemonSet rolled out on the guest."""
    started = time.monotonic()
    vm_cluster.kubectl("apply", "-k", str(ROOT / "deploy" / "overlays" / "quiet-cpus"))
    try:
        rollout_status(vm_cluster.kubectl, timeout=600)
    except ToolError as err:
        raise AssertionError(f"{err}\n{vm_cluster.nodedra_logs()}") from err
    print(f"[vm] nodedra rolled out {time.monotonic() - started:.1f}s after kubectl apply")
    return vm_cluster
