"""The Go driver (tests/peers/cmd/go-driver) deployed as its users deploy a DRA driver: an image
in the node's runtime and a DaemonSet whose pod registers with the kubelet through the plugin
registry directory, with a ServiceAccount that may write ResourceSlices.

The VM node's image carries the image (tests.peers.vm_image), so the guest never pulls it.
The pod runs on the in-cluster configuration (its projected token, the ``kubernetes``
Service) and reads the guest's own sysfs for ``resource.kubernetes.io/numaNode``.
"""

from __future__ import annotations

from typing import Any

from tests.peers.build import PeerBinaries
from tests.peers.oci import ImageSpec

IMAGE = "nodedra.test/go-driver:v1"
NAMESPACE = "go-driver"
NAME = "go-driver"
DRIVER = "accelerator.nodedra.test"
REGISTRY = "/var/lib/kubelet/plugins_registry"
PLUGINS = f"/var/lib/kubelet/plugins/{DRIVER}"
CDI = "/var/run/cdi"


def image_spec(binaries: PeerBinaries) -> ImageSpec:
    return ImageSpec(IMAGE, binaries.go_driver, "go-driver")


def manifests(devices: int, numa_nodes: str) -> list[dict[str, Any]]:
    """The namespace, ServiceAccount, its cluster role and binding, and the DaemonSet of a
    driver publishing ``devices`` accelerators, device i in NUMA node i of ``numa_nodes``
    (comma-separated, in turn)."""
    meta = {"name": NAME, "namespace": NAMESPACE}
    rules = [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    ]
    paths = {"registry": REGISTRY, "plugin": PLUGINS, "cdi": CDI}
    container = {
        "name": NAME,
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "args": [
            "--node-name=$(NODE_NAME)",
            f"--driver-name={DRIVER}",
            f"--registry-dir={REGISTRY}",
            f"--plugin-dir={PLUGINS}",
            f"--cdi-dir={CDI}",
            f"--devices={devices}",
            f"--numa-nodes={numa_nodes}",
        ],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "volumeMounts": [{"name": name, "mountPath": path} for name, path in paths.items()],
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NAME},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": NAME,
            },
            "subjects": [{"kind": "ServiceAccount", **meta}],
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": meta,
            "spec": {
                "selector": {"matchLabels": {"app": NAME}},
                "template": {
                    "metadata": {"labels": {"app": NAME}},
                    "spec": {
                        "serviceAccountName": NAME,
                        "containers": [container],
                        "volumes": [
                            {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
                            for name, path in paths.items()
                        ],
                    },
                },
            },
        },
    ]
