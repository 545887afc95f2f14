"""The pod network of a real test node: a bridge, the CNI plugins and kube-proxy.

Most test pods use the host network, which needs none of this. A pod that does not (nodedra's
DaemonSet pod, as an admin deploys it) needs what a real cluster gives it: an address of its
own (containernetworking's ``bridge`` and ``host-local`` plugins, which containerd runs) and a
way to the API server through the ``kubernetes`` Service (kube-proxy, in nftables mode, built
from the same k8s.io/kubernetes module as the kubelet). All of it lives in the test run's
private network namespace (tests.peers.netns): the bridge, the pods' veths and kube-proxy's
nftables rules are gone with it, and the machine's network and sysctls are not touched (the
``net.*`` settings the plugins and kube-proxy write belong to that namespace). kube-proxy is
told to leave the conntrack table's global limits alone.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.peers.build import PeerBinaries
from tests.peers.controlplane import ControlPlane, write_kubeconfig
from tests.peers.peer_groups import CNI_PLUGINS
from tests.peers.ports import free_port
from tests.peers.process import PeerProcess, PeerProcessError

#: The pods' addresses and the bridge they hang off; its first address is the pods' gateway.
POD_SUBNET = "10.244.0.0/24"
POD_BRIDGE = "nodedra-pods"


def conflist(masquerade: bool = False) -> dict[str, Any]:
    """The node's CNI network: a bridge with host-local addresses, the bridge the pods'
    default gateway (the node's own addresses, the API server's among them, are local
    there). On this machine nothing is masqueraded: nothing leaves the namespace. A VM node
    (tests.peers.vm_cluster) masquerades what leaves through its NIC, as real nodes do: the
    far side of the guest's network answers only the guest's own address."""
    bridge: dict[str, Any] = {
        "type": "bridge",
        "bridge": POD_BRIDGE,
        "isGateway": True,
        "ipMasq": masquerade,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": POD_SUBNET}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    }
    if masquerade:
        bridge["ipMasqBackend"] = "nftables"
    return {"cniVersion": "1.0.0", "name": "nodedra-pods", "plugins": [bridge]}


def kube_proxy_config(
    node_name: str, kubeconfig: str, healthz_address: str, metrics_address: str
) -> dict[str, Any]:
    """kube-proxy's configuration: nftables mode, the pods' CIDR, the kernel's conntrack
    limits and timeouts left alone (0: they belong to the machine)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": kubeconfig},
        "hostnameOverride": node_name,
        "clusterCIDR": POD_SUBNET,
        "healthzBindAddress": healthz_address,
        "metricsBindAddress": metrics_address,
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def install_cni(binaries: PeerBinaries, bin_dir: Path, conf_dir: Path) -> None:
    """Put the plugins where containerd looks for them and the network where it reads it."""
    for name in CNI_PLUGINS:
        link = bin_dir / name
        link.unlink(missing_ok=True)
        link.symlink_to(binaries[name])
    for old in conf_dir.glob("*.conflist"):
        old.unlink()
    (conf_dir / "10-pods.conflist").write_text(json.dumps(conflist(), indent=2))


class KubeProxy:
    """kube-proxy of one node, nftables mode, with the credentials bootstrap RBAC grants
    kube-proxy (user ``system:kube-proxy``, ClusterRole ``system:node-proxier``).

    ``argv_prefix`` runs it where the node's daemons run (its mount namespace).
    """

    def __init__(
        self,
        binaries: PeerBinaries,
        cp: ControlPlane,
        node_name: str,
        workdir: Path,
        *,
        env: Mapping[str, str],
        argv_prefix: list[str] | None = None,
    ) -> None:
        self.binaries = binaries
        self.cp = cp
        self.node_name = node_name
        self.workdir = workdir
        self.env = dict(env)
        self.argv_prefix = argv_prefix or []
        self.log_path = workdir / "kube-proxy.log"
        self.process: PeerProcess | None = None
        self.healthz_port = 0

    def _write_config(self) -> Path:
        pair = self.cp.ca.issue("kube-proxy", "system:kube-proxy")
        kubeconfig = write_kubeconfig(
            self.workdir / "kube-proxy.kubeconfig",
            self.cp.url,
            self.cp.ca.pair.cert,
            "system:kube-proxy",
            client=pair,
        )
        self.healthz_port = free_port()
        config = kube_proxy_config(
            self.node_name,
            str(kubeconfig),
            f"127.0.0.1:{self.healthz_port}",
            f"127.0.0.1:{free_port()}",
        )
        path = self.workdir / "kube-proxy-config.json"
        path.write_text(json.dumps(config, indent=2))
        return path

    def _serving(self) -> bool:
        # /healthz answers 200 once the rules of the first sync are in place.
        url = f"http://127.0.0.1:{self.healthz_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, ConnectionError):
            return False

    def start(self, timeout: float = 60.0) -> None:
        if self.process is not None:
            raise RuntimeError("kube-proxy is running")
        config = self._write_config()
        argv = [*self.argv_prefix, str(self.binaries.kube_proxy), f"--config={config}", "--v=2"]
        self.process = PeerProcess("kube-proxy", argv, self.log_path, env=self.env)
        try:
            self.process.wait_until(self._serving, timeout, "/healthz ok (rules synced)")
        except PeerProcessError:
            self.stop()
            raise

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
