"""The VM node as a production node: cgroup v2, systemd, nodedra deployed with the manifests.

One cluster for the package (tests.peers.vm_cluster, the ``vm_cluster`` fixture of its
conftest): a control plane of its own on this machine and the guest joined to it. The modules
run in order, each test going on from where the one before left the cluster:
``test_cluster`` deploys nodedra and pins a claim, ``test_restarts`` restarts containerd,
nodedra, and the whole guest (a reboot and a power cut). What counts is read inside the guest:
each container's ``/proc/<pid>/status`` and the cgroup v2 files of its systemd scope and pod
slice.
"""

from __future__ import annotations

from typing import Any

from tests.peers.nodedra_node import TOPOLOGY_AWARE
from tests.peers.pods import workload_pod
from tests.peers.vm_cluster import NODE_NAME

TEST_NAMESPACE = "vm-tests"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{TEST_NAMESPACE}/resourceclaims"
#: What a claim on NUMA node 1 asks for (topology-aware: one device per NUMA node).
CLAIM_CPU = 1
CLAIM_MEMORY = "64Mi"


def numa1_claim(name: str) -> dict[str, Any]:
    """A ResourceClaim of one CPU and some memory of NUMA node 1 (its device, by the
    standard attribute)."""
    selector = 'device.attributes["resource.kubernetes.io"].numaNode == 1'
    request = {
        "deviceClassName": TOPOLOGY_AWARE,
        "selectors": [{"cel": {"expression": selector}}],
        "capacity": {"requests": {"cpu": str(CLAIM_CPU), "memory": CLAIM_MEMORY}},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "cpus", "exactly": request}]}},
    }


def claim_pod(name: str, claim: str, **options: Any) -> dict[str, Any]:
    """A pod on the guest whose container uses the ResourceClaim ``claim``."""
    return workload_pod(
        name,
        node_selector={"kubernetes.io/hostname": NODE_NAME},
        claims=[{"name": "cpus", "resourceClaimName": claim}],
        **options,
    )
