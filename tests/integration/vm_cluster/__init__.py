"""The VM node as a production node: cgroup v2, systemd, nodedra deployed with the manifests
(through deploy/overlays/quiet-cpus/, which adds the host's files quietCPUs writes).

One cluster for the package (tests.peers.vm_cluster, the ``vm_cluster`` fixture of its
conftest): a control plane of its own on this machine and the guest joined to it. The modules
run in order, each test going on from where the one before left the cluster:
``test_beside_an_accelerator`` deploys the Go driver beside nodedra and aligns claims with its
accelerator (and removes it), ``test_cluster`` pins a claim, ``test_hugepages`` claims huge
pages, ``test_quiet_cpus`` keeps the host's work off a claim's CPU (and leaves that on),
``test_restarts`` restarts containerd, nodedra, and the whole guest (a reboot and a power
cut), ``test_two_nodes`` joins this machine's real node as a second node. What counts is read
inside the guest (and, for the second node, on this machine): each container's
``/proc/<pid>/status`` and the cgroup v2 files of its systemd scope and pod
slice.
"""

from __future__ import annotations

from typing import Any

from nodedra.topology import parse_cpu_list
from tests.peers.deployment import NAMESPACE
from tests.peers.nodedra_node import TOPOLOGY_AWARE
from tests.peers.pods import workload_pod
from tests.peers.vm_cluster import NODE_NAME, VMCluster

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


def edit_config(cluster: VMCluster, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in the deployed ConfigMap's config.yaml, and have the kubelet
    bring the file to nodedra's pod now.

    The kubelet refreshes a pod's ConfigMap volumes when it syncs the pod, which a change of
    the pod does at once (annotating it) where its periodic sync could take a minute.
    """
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/nodedra-config"
    config_map = cluster.cp.request("GET", path)
    text = config_map["data"]["config.yaml"]
    assert old in text, text
    config_map["data"]["config.yaml"] = text.replace(old, new)
    cluster.cp.request("PUT", path, config_map)
    (nodedra,) = cluster.nodedra_pods()
    cluster.kubectl(
        "-n", NAMESPACE, "annotate", "--overwrite", "pod", nodedra["metadata"]["name"],
        f"nodedra.test/config={config_map['metadata']['resourceVersion']}",
    )  # fmt: skip


#: The guest's top-level units: the host's (narrowed) and the pods' (never).
HOST_UNITS = ("system.slice", "init.scope")
PODS_UNIT = "kubepods.slice"
#: Host processes whose CPUs must follow their slice's: the node's own services.
SERVICES = ("kubelet", "containerd")


def host_processes(cluster: VMCluster) -> dict[str, frozenset[int]]:
    """Each unit's AllowedCPUs (as systemd says, empty if unset) and each service's process'
    allowed CPUs (as the kernel says)."""
    found = {}
    for unit in (*HOST_UNITS, PODS_UNIT):
        value = cluster.vm.run(f"systemctl show -P AllowedCPUs {unit}").check().strip()
        found[unit] = parse_cpu_list(value) if value else frozenset()
    for service in SERVICES:
        pid = cluster.vm.run(f"systemctl show -P MainPID {service}").check().strip()
        line = cluster.vm.run(f"grep Cpus_allowed_list /proc/{pid}/status").check()
        found[service] = parse_cpu_list(line.split(":")[1].strip())
    return found
