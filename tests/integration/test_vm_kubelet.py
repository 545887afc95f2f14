"""The VM node's kubelet joins the host's control plane and runs a pod, as a production node.

The guest (tests.peers.vm) runs containerd (``SystemdCgroup = true``) and the kubelet
(``cgroupDriver: systemd``, ``failCgroupV1`` at its default: the guest is cgroup v2) as
systemd units. It reaches the API server only through one explicit forward (HOST_ALIAS:6443,
relayed to the API server's port on the test namespace's loopback); QEMU's user network is
``restrict=on``, so nothing else leaves it. The kubelet has the real node's credentials
(``ControlPlane.node_kubeconfig``, Node authorizer and NodeRestriction) and a serving
certificate of the test CA for the guest's address; the pause and workload images are
imported, never pulled. What counts is read inside the guest: the container's
``/proc/<pid>/status`` and its cgroup, a systemd scope under ``kubepods.slice``.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509

from tests.conftest import VMNodeFactory
from tests.peers.cluster import delete_node, poll
from tests.peers.controlplane import ControlPlane
from tests.peers.node import NOT_READY_TAINT, kubelet_configuration
from tests.peers.pods import container_id, create_pod, wait_pod_running, workload_pod
from tests.peers.vm import HOST_ALIAS, VMNode
from tests.peers.vm_image import GUEST_ADDRESS, GUEST_IMAGES_DIR, KUBELET_DIR

NODE_NAME = "nodedra-vm"
#: The kubelet's port in the guest; the tests reach it through QEMU's hostfwd from a free port
#: of the namespace's loopback.
KUBELET_PORT = 10250
API_PORT = 6443
CTR = "ctr -n k8s.io"
PKI = f"{KUBELET_DIR}/pki"


def _put(vm: VMNode, path: str, data: bytes) -> None:
    encoded = base64.b64encode(data).decode()
    vm.run(f"mkdir -p $(dirname {path}) && echo {encoded} | base64 -d > {path}").check()


def _install_credentials(vm: VMNode, cp: ControlPlane) -> None:
    """The kubelet's kubeconfig (the API server through the forward; its certificate names
    127.0.0.1, where it listens), serving certificate and configuration, into the guest."""
    kubeconfig = json.loads(cp.node_kubeconfig(NODE_NAME).read_text())
    cluster = kubeconfig["clusters"][0]["cluster"]
    cluster["server"] = f"https://{HOST_ALIAS}:{API_PORT}"
    cluster["tls-server-name"] = urllib.parse.urlsplit(cp.url).hostname
    _put(vm, f"{KUBELET_DIR}/kubelet.kubeconfig", json.dumps(kubeconfig).encode())
    serving = cp.ca.issue(
        f"kubelet-serving-{NODE_NAME}",
        f"system:node:{NODE_NAME}",
        organizations=("system:nodes",),
        dns_names=(NODE_NAME,),
        ip_addresses=(GUEST_ADDRESS,),
        server=True,
    )
    _put(vm, f"{PKI}/ca.crt", cp.ca.pair.cert.read_bytes())
    _put(vm, f"{PKI}/kubelet.crt", serving.cert.read_bytes())
    _put(vm, f"{PKI}/kubelet.key", serving.key.read_bytes())
    # cgroup v2 and systemd: failCgroupV1 stays at its default (true), as on a production node.
    config = kubelet_configuration(
        runtime_endpoint="unix:///run/containerd/containerd.sock",
        cgroup_driver="systemd",
        tls_cert=f"{PKI}/kubelet.crt",
        tls_key=f"{PKI}/kubelet.key",
        client_ca=f"{PKI}/ca.crt",
        feature_gates=cp.feature_gates,
    )
    _put(vm, f"{KUBELET_DIR}/kubelet.json", json.dumps(config, indent=2).encode())


@pytest.fixture(scope="module")
def vm_kubelet(vm_node_factory: VMNodeFactory, control_plane: ControlPlane) -> Iterator[VMNode]:
    """A guest whose kubelet has registered Node NODE_NAME, Ready and untainted."""
    port = urllib.parse.urlsplit(control_plane.url).port
    assert port is not None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        kubelet_port = probe.getsockname()[1]
    with vm_node_factory(
        guest_forwards={API_PORT: port}, host_forwards={kubelet_port: KUBELET_PORT}
    ) as vm:
        started = time.monotonic()
        vm.run("systemctl start containerd", timeout=180).check()
        for archive in ("pause", "workload"):
            vm.run(
                f"{CTR} images import --snapshotter overlayfs {GUEST_IMAGES_DIR}/{archive}.tar",
                timeout=300,
            ).check()
        imported = time.monotonic() - started
        _install_credentials(vm, control_plane)
        vm.run("systemctl start kubelet", timeout=180).check()
        seen: dict[str, Any] = {}

        def ready() -> dict[str, Any] | None:
            nonlocal seen
            try:
                seen = control_plane.request("GET", f"/api/v1/nodes/{NODE_NAME}")
            except RuntimeError:
                return None
            conditions = (seen.get("status") or {}).get("conditions") or []
            ok = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            return seen if ok else None

        def describe() -> str:
            journal = vm.run("journalctl -u kubelet --no-pager -n 40", timeout=60).output
            return f"Node {NODE_NAME} Ready; last seen {seen.get('status')}; kubelet:\n{journal}"

        try:
            node = poll(ready, 300, describe, 1.0)
            print(
                f"[vm] containerd + images {imported:.1f}s, the kubelet's Node Ready "
                f"{time.monotonic() - started - imported:.1f}s after that"
            )
            # The node-lifecycle controller does not run in the test control plane.
            taints = (node.get("spec") or {}).get("taints") or []
            kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
            control_plane.request(
                "PATCH",
                f"/api/v1/nodes/{NODE_NAME}",
                {"spec": {"taints": kept or None}},
                content_type="application/merge-patch+json",
            )
            yield vm
        finally:
            vm.run("systemctl stop kubelet", timeout=120)
            delete_node(control_plane, NODE_NAME)


def test_the_kubelet_registers_the_guest_as_a_cgroup_v2_systemd_node(
    vm_kubelet: VMNode, control_plane: ControlPlane
) -> None:
    node = control_plane.request("GET", f"/api/v1/nodes/{NODE_NAME}")
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == GUEST_ADDRESS, addresses
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://2.4.2"), info
    assert info["kubeletVersion"].startswith("v1.37.2"), info
    assert node["status"]["capacity"]["cpu"] == "4", node["status"]["capacity"]


def test_the_host_reaches_the_kubelet_only_through_the_forward(
    vm_kubelet: VMNode, control_plane: ControlPlane
) -> None:
    context = ssl.create_default_context(cafile=str(control_plane.ca.pair.cert))
    (host_port,) = vm_kubelet.host_forwards
    with (
        socket.create_connection(("127.0.0.1", host_port), timeout=60) as raw,
        context.wrap_socket(raw, server_hostname=NODE_NAME) as tls,
    ):
        request = f"GET /pods HTTP/1.1\r\nHost: {NODE_NAME}\r\nConnection: close\r\n\r\n"
        tls.sendall(request.encode())
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    subject = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    # The kubelet, by its serving certificate, refusing an anonymous client.
    assert f"CN=system:node:{NODE_NAME}" in subject, subject
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def test_a_pod_runs_in_a_systemd_scope_of_kubepods_slice(
    vm_kubelet: VMNode, control_plane: ControlPlane, namespace: str
) -> None:
    started = time.monotonic()
    create_pod(control_plane, namespace, workload_pod("probe", node_name=NODE_NAME))
    pod = wait_pod_running(control_plane, namespace, "probe", timeout=300)
    running = time.monotonic() - started
    cid = container_id(pod)
    tasks = vm_kubelet.run(f"{CTR} tasks list").check()
    (pid,) = [line.split()[1] for line in tasks.splitlines() if line.startswith(cid)]
    cgroup = vm_kubelet.run(f"cat /proc/{pid}/cgroup").check().strip()
    uid = pod["metadata"]["uid"].replace("-", "_")
    # The systemd driver's names: the pod's slice in its QoS class' slice, the container's scope.
    assert cgroup == (
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{uid}.slice/cri-containerd-{cid}.scope"
    ), cgroup
    group = f"/sys/fs/cgroup{cgroup[3:]}"
    status = vm_kubelet.run(f"grep -E '^(Cpus|Mems)_allowed_list' /proc/{pid}/status").check()
    fields = dict(line.split(":\t") for line in status.strip().splitlines())
    effective = vm_kubelet.run(
        f"cat {group}/cpuset.cpus.effective {group}/cpuset.mems.effective"
    ).check()
    # No claim and no CPU manager: the shared pool is the whole machine, both NUMA nodes.
    assert fields == {"Cpus_allowed_list": "0-3", "Mems_allowed_list": "0-1"}, status
    assert effective.split() == ["0-3", "0-1"], effective
    print(f"[vm] pod Running {running:.1f}s after it was created")
