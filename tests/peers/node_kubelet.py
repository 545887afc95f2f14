"""The kubelet of a real node (tests.peers.node): its configuration, its process, what it reports.

`RealNode` runs a container runtime (tests.peers.runtime) and a kubelet in the node's mount
namespace; this is the kubelet's part: its KubeletConfiguration (`kubelet_configuration`, what
the kubelet of every node of the tests has, this machine's and the VM node's, and what this
machine's node adds), its kubeconfig and serving certificate from the test control plane, its
process and health, the pods it knows (its own ``/pods``), and the Node it registers, which it
reports Ready (`NodeKubelet.wait_ready` then lifts the not-ready taint as the node-lifecycle
controller would). Failures raise `KubeletError`, which `RealNode` reports as a NodeError.
"""

from __future__ import annotations

import json
import shutil
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.peers.build import PeerBinaries
from tests.peers.cluster import poll
from tests.peers.controlplane import ControlPlane
from tests.peers.mountns import MountNamespace
from tests.peers.ports import free_port
from tests.peers.process import PeerProcess, PeerProcessError

#: The taint a new Node gets at registration (admission plugin TaintNodesByCondition). The
#: node-lifecycle controller lifts it once the node is Ready; the test control plane runs
#: without that controller (see CONTROLLERS), so `NodeKubelet.wait_ready` lifts it as it would.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def kubelet_configuration(
    *,
    runtime_endpoint: str,
    cgroup_driver: str,
    tls_cert: str,
    tls_key: str,
    client_ca: str,
    feature_gates: Mapping[str, bool],
) -> dict[str, Any]:
    """What the kubelet of every node of the tests has (this machine's real node, the VM
    node): the runtime and cgroup driver given, no read-only port, a serving certificate of
    the test CA, clients authenticated by that CA or the API server's webhook and authorized by
    the webhook, no CPU manager (nodedra sets cpusets through NRI; the CPU manager would fight
    it) and the control plane's feature gates."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": runtime_endpoint,
        "cgroupDriver": cgroup_driver,
        "readOnlyPort": 0,
        "tlsCertFile": tls_cert,
        "tlsPrivateKeyFile": tls_key,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": client_ca},
        },
        "authorization": {"mode": "Webhook"},
        "cpuManagerPolicy": "none",
        "featureGates": dict(feature_gates),
    }


class KubeletError(RuntimeError):
    """The kubelet failed to start or to make its Node Ready; the message says what."""


class NodeKubelet:
    """The kubelet of one real node, run in the node's mount namespace.

    ``root_dir`` is its --root-dir as the kubelet sees it, ``cert_dir`` and ``pod_logs_dir``
    its certificate and pod log directories; ``config_overrides`` is merged over its
    KubeletConfiguration (top-level keys); ``env`` gives its environment at each start. Its
    files live in ``workdir``.
    """

    def __init__(
        self,
        binaries: PeerBinaries,
        cp: ControlPlane,
        node_name: str,
        node_ip: str,
        workdir: Path,
        *,
        root_dir: str,
        cert_dir: Path,
        pod_logs_dir: Path,
        namespace: MountNamespace,
        env: Callable[[], Mapping[str, str]],
        feature_gates: Mapping[str, bool],
        config_overrides: Mapping[str, Any],
        verbosity: int,
    ) -> None:
        self.binaries = binaries
        self.cp = cp
        self.node_name = node_name
        self.node_ip = node_ip
        self.root_dir = root_dir
        self.cert_dir = cert_dir
        self.pod_logs_dir = pod_logs_dir
        self.namespace = namespace
        self.env = env
        self.feature_gates = feature_gates
        self.config_overrides = dict(config_overrides)
        self.verbosity = verbosity
        self.config_path = workdir / "kubelet-config.json"
        self.kubeconfig = workdir / "kubelet.kubeconfig"
        self.log_path = workdir / "kubelet.log"
        self.port = 0
        self.healthz_port = 0
        self.process: PeerProcess | None = None
        """The kubelet's process while it runs."""

    def write_files(self, runtime_socket: Path, cgroup_root: str) -> None:
        """The kubelet's kubeconfig, serving certificate and configuration: the runtime's CRI
        socket ``runtime_socket``, pods below ``cgroup_root``."""
        node_kubeconfig = self.cp.node_kubeconfig(self.node_name)
        shutil.copyfile(node_kubeconfig, self.kubeconfig)
        self.kubeconfig.chmod(0o600)
        serving = self.cp.ca.issue(
            f"kubelet-serving-{self.node_name}",
            f"system:node:{self.node_name}",
            organizations=("system:nodes",),
            dns_names=(self.node_name,),
            ip_addresses=(self.node_ip,),
            server=True,
        )
        self.port = free_port(self.node_ip)
        self.healthz_port = free_port("127.0.0.1")
        config = kubelet_configuration(
            runtime_endpoint=f"unix://{runtime_socket}",
            cgroup_driver="cgroupfs",
            tls_cert=str(serving.cert),
            tls_key=str(serving.key),
            client_ca=str(self.cp.ca.pair.cert),
            feature_gates=self.feature_gates,
        )
        config.update(
            {
                "cgroupRoot": cgroup_root,
                # cgroup v1 is deprecated: since 1.35 the kubelet refuses it unless told not to.
                "failCgroupV1": False,
                "failSwapOn": False,
                "address": self.node_ip,
                "port": self.port,
                "healthzBindAddress": "127.0.0.1",
                "healthzPort": self.healthz_port,
                # A test machine's disk and memory are whatever they are: never evict, never
                # collect images (kind's node configuration does the same).
                "evictionHard": {
                    "memory.available": "0%",
                    "nodefs.available": "0%",
                    "nodefs.inodesFree": "0%",
                    "imagefs.available": "0%",
                    "imagefs.inodesFree": "0%",
                },
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "podLogsDir": str(self.pod_logs_dir),
                "seccompDefault": False,
            }
        )
        config.update(self.config_overrides)
        self.config_path.write_text(json.dumps(config, indent=2))

    def _healthy(self) -> bool:
        url = f"http://127.0.0.1:{self.healthz_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.read().strip() == b"ok")
        except urllib.error.URLError:
            return False

    def start(self, timeout: float = 120.0) -> None:
        """Start the kubelet in the node's mount namespace and wait for its /healthz."""
        if self.process is not None:
            raise KubeletError("the kubelet is running")
        argv = [
            str(self.binaries.kubelet),
            f"--config={self.config_path}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.cert_dir}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={self.node_ip}",
            f"--v={self.verbosity}",
        ]
        self.process = PeerProcess(
            "kubelet", self.namespace.enter(argv), self.log_path, env=self.env()
        )
        try:
            self.process.wait_until(self._healthy, timeout, "/healthz ok")
        except PeerProcessError as err:
            self.stop()
            raise KubeletError(str(err)) from None

    def stop(self) -> None:
        """Stop the kubelet alone; pods go on running."""
        if self.process is not None:
            self.process.stop()
            self.process = None

    def pods(self) -> list[dict[str, Any]]:
        """The pods the kubelet knows, from its own API (``/pods``), as the API server's
        client identity asks it."""
        context = ssl.create_default_context(cafile=str(self.cp.ca.pair.cert))
        context.load_cert_chain(str(self.cp.kubelet_client.cert), str(self.cp.kubelet_client.key))
        url = f"https://{self.node_ip}:{self.port}/pods"
        with urllib.request.urlopen(url, context=context, timeout=10) as resp:
            items: list[dict[str, Any]] = json.load(resp).get("items") or []
        return items

    def wait_pods_synced(self, timeout: float = 120.0) -> None:
        """Wait until the kubelet knows every pod the API server has bound to the node and
        not finished."""
        want: set[str] = set()
        have: set[str] = set()

        def synced() -> bool | None:
            nonlocal want, have
            query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={self.node_name}"})
            pods = self.cp.request("GET", f"/api/v1/pods?{query}")["items"]
            want = {
                p["metadata"]["uid"]
                for p in pods
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                and not p["metadata"].get("deletionTimestamp")
            }
            try:
                have = {p["metadata"]["uid"] for p in self.pods()}
            except (OSError, ValueError):
                return None
            return True if want <= have else None

        poll(synced, timeout, lambda: f"the kubelet to know pods {want}; it knows {have}", 0.2)

    def node(self) -> dict[str, Any]:
        """The Node object."""
        node: dict[str, Any] = self.cp.request("GET", f"/api/v1/nodes/{self.node_name}")
        return node

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until the kubelet reports the Node Ready, then lift the not-ready taint as the
        node-lifecycle controller would; returns the Node."""
        seen: dict[str, Any] = {}

        def ready() -> dict[str, Any] | None:
            nonlocal seen
            if self.process is not None and not self.process.alive():
                raise KubeletError(
                    f"the kubelet exited with code {self.process.popen.returncode}; log "
                    f"{self.process.log_path}:\n{self.process.tail()}"
                )
            try:
                seen = self.node()
            except RuntimeError:
                return None
            conditions = (seen.get("status") or {}).get("conditions") or []
            return (
                seen
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
                else None
            )

        def describe() -> str:
            conditions = (seen.get("status") or {}).get("conditions")
            return f"Node {self.node_name} Ready; conditions: {conditions}"

        node = poll(ready, timeout, describe, 0.2)
        taints = (node.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
        if len(kept) != len(taints):
            node = self.cp.request(
                "PATCH",
                f"/api/v1/nodes/{self.node_name}",
                {"spec": {"taints": kept or None}},
                content_type="application/merge-patch+json",
            )
        return node
