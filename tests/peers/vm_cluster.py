"""A cluster whose node is the VM node (tests.peers.vm), joined as a production node joins.

The control plane runs on this machine, in the test run's private network namespace, with the
workload controllers (the DaemonSet's); the guest runs containerd (``SystemdCgroup = true``),
the kubelet (``cgroupDriver: systemd``, ``failCgroupV1`` at its default: the guest is cgroup
v2), kube-proxy (nftables) and a pod network (CNI bridge, masqueraded out of the guest's NIC)
as systemd units. What joins them, and nothing else:

* the API server listens on HOST_ALIAS, an address put on the namespace's ``lo``, and the
  guest reaches it there on the API server's own port (QEMU's guestfwd, relayed to the
  namespace's address). The API server advertises that address, so it is the endpoint of the
  ``kubernetes`` Service and a pod (nodedra's) reaches it through kube-proxy, as in any
  cluster: in the guest, and on a node of this machine that joins too (tests.peers.host_node);
* the API server reaches the kubelet at the guest's address (GUEST_ADDRESS), which is also put
  on the namespace's ``lo`` and forwarded by QEMU to the guest's kubelet port: ``kubectl logs``
  works as on a real cluster;
* the images are in the guest's containerd from its image's build (tests.peers.vm_image
  imports them there): the guest never pulls.

``kubectl`` is the admin's, built from the Go module proxy.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.peers.build import PeerBinaries
from tests.peers.cluster import get_pod, poll
from tests.peers.controlplane import ControlPlane, write_kubeconfig
from tests.peers.deployment import NAMESPACE, Kubectl, nodedra_pods
from tests.peers.netns import add_loopback_address
from tests.peers.node_kubelet import NOT_READY_TAINT, kubelet_configuration
from tests.peers.podnet import kube_proxy_config
from tests.peers.pods import container_id
from tests.peers.prometheus import sample
from tests.peers.vm import HOST_ALIAS, VMError, VMNode
from tests.peers.vm_image import GUEST_ADDRESS, KUBE_PROXY_CONFIG, KUBELET_DIR

NODE_NAME = "nodedra-vm"
KUBELET_PORT = 10250
CTR = "ctr -n k8s.io"
PKI = f"{KUBELET_DIR}/pki"

#: Boots a guest with VMNode's options (the tests' ``vm_node_factory``).
Boot = Callable[..., contextlib.AbstractContextManager[VMNode]]


class ContainerNotRunningError(AssertionError):
    """The container a pod's status names is not running in the guest (yet)."""


class VMCluster:
    """The control plane and the joined VM node (see the module); a context manager."""

    def __init__(
        self,
        binaries: PeerBinaries,
        workdir: Path,
        feature_gates: Mapping[str, bool],
        boot: Boot,
        *,
        repo: Path,
    ) -> None:
        self.cp = ControlPlane(binaries, workdir / "cp", feature_gates, address=HOST_ALIAS)
        self.workdir = workdir
        self.kubectl = Kubectl(binaries.kubectl, self.cp.admin_kubeconfig, cwd=repo)
        self.boot = boot
        self._stack = contextlib.ExitStack()
        self._vm: VMNode | None = None
        self.join_seconds = 0.0

    @property
    def vm(self) -> VMNode:
        if self._vm is None:
            raise RuntimeError("the VM cluster is not started")
        return self._vm

    def __enter__(self) -> VMCluster:
        with self._stack:
            self._stack.callback(self.cp.stop)
            add_loopback_address(HOST_ALIAS)
            self.cp.start()
            self.cp.start_workload_controllers()
            add_loopback_address(GUEST_ADDRESS)
            port = self.api_port
            self._vm = self._stack.enter_context(
                self.boot(
                    guest_forwards={port: (HOST_ALIAS, port)},
                    host_forwards={(GUEST_ADDRESS, KUBELET_PORT): KUBELET_PORT},
                    persistent=True,
                )
            )
            self._join()
            self._stack = self._stack.pop_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()
        self._vm = None

    @property
    def api_port(self) -> int:
        return int(self.cp.url.rsplit(":", 1)[1])

    @property
    def api_server(self) -> str:
        """The API server as the guest reaches it."""
        return f"https://{HOST_ALIAS}:{self.api_port}"

    # -- joining ----------------------------------------------------------------------------

    def put(self, path: str, data: bytes) -> None:
        """Write a file in the guest."""
        encoded = base64.b64encode(data).decode()
        self.vm.run(f"mkdir -p $(dirname {path}) && echo {encoded} | base64 -d > {path}").check()

    def _join(self) -> None:
        started = time.monotonic()
        # Enabled, as on a node that joined: they start again after a reboot.
        self.vm.run("systemctl enable --now containerd", timeout=180).check()
        self._install_credentials()
        self.vm.run("systemctl enable --now kube-proxy kubelet", timeout=180).check()
        self.wait_ready()
        self.join_seconds = time.monotonic() - started

    def _kubeconfig(self, user: str, organizations: tuple[str, ...] = ()) -> bytes:
        """A kubeconfig of ``user`` (a client certificate of the test CA) for the guest."""
        name = user.replace(":", "-")
        pair = self.cp.ca.issue(name, user, organizations=organizations)
        path = self.workdir / f"{name}.kubeconfig"
        written = write_kubeconfig(path, self.api_server, self.cp.ca.pair.cert, user, client=pair)
        return written.read_bytes()

    def _install_credentials(self) -> None:
        """The kubelet's and kube-proxy's kubeconfigs (the users bootstrap RBAC and the Node
        authorizer know), the kubelet's serving certificate and both configurations."""
        self.put(
            f"{KUBELET_DIR}/kubelet.kubeconfig",
            self._kubeconfig(f"system:node:{NODE_NAME}", ("system:nodes",)),
        )
        serving = self.cp.ca.issue(
            f"kubelet-serving-{NODE_NAME}",
            f"system:node:{NODE_NAME}",
            organizations=("system:nodes",),
            dns_names=(NODE_NAME,),
            ip_addresses=(GUEST_ADDRESS,),
            server=True,
        )
        self.put(f"{PKI}/ca.crt", self.cp.ca.pair.cert.read_bytes())
        self.put(f"{PKI}/kubelet.crt", serving.cert.read_bytes())
        self.put(f"{PKI}/kubelet.key", serving.key.read_bytes())
        # cgroup v2 and systemd: failCgroupV1 stays at its default (true), as on a production
        # node.
        config = kubelet_configuration(
            runtime_endpoint="unix:///run/containerd/containerd.sock",
            cgroup_driver="systemd",
            tls_cert=f"{PKI}/kubelet.crt",
            tls_key=f"{PKI}/kubelet.key",
            client_ca=f"{PKI}/ca.crt",
            feature_gates=self.cp.feature_gates,
        )
        self.put(f"{KUBELET_DIR}/kubelet.json", json.dumps(config, indent=2).encode())
        proxy_kubeconfig = f"{KUBELET_DIR}/kube-proxy.kubeconfig"
        self.put(proxy_kubeconfig, self._kubeconfig("system:kube-proxy"))
        proxy = kube_proxy_config(NODE_NAME, proxy_kubeconfig, "127.0.0.1:10256", "127.0.0.1:10249")
        self.put(KUBE_PROXY_CONFIG, json.dumps(proxy, indent=2).encode())

    def node(self) -> dict[str, Any]:
        node: dict[str, Any] = self.cp.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        return node

    def wait_ready(self, timeout: float = 300.0) -> dict[str, Any]:
        """The Node once Ready, with the not-ready taint lifted as the node-lifecycle
        controller (which the test control plane does not run) would lift it."""
        seen: dict[str, Any] = {}

        def ready() -> dict[str, Any] | None:
            nonlocal seen
            try:
                seen = self.node()
            except RuntimeError:
                return None
            conditions = (seen.get("status") or {}).get("conditions") or []
            ok = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            return seen if ok else None

        def describe() -> str:
            journal = self.vm.run("journalctl -u kubelet --no-pager -n 40", timeout=60).output
            return f"Node {NODE_NAME} Ready; last seen {seen.get('status')}; kubelet:\n{journal}"

        node = poll(ready, timeout, describe, 1.0)
        taints = (node.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
        if kept != taints:
            self.cp.request(
                "PATCH",
                f"/api/v1/nodes/{NODE_NAME}",
                {"spec": {"taints": kept or None}},
                content_type="application/merge-patch+json",
            )
        return node

    # -- what the guest says ------------------------------------------------------------------

    def pid(self, pod: Mapping[str, Any], container: str) -> int:
        """The guest's PID of a running container of ``pod``."""
        cid = container_id(pod, container)
        tasks = self.vm.run(f"{CTR} tasks list").check()
        pids = [line.split()[1] for line in tasks.splitlines() if line.startswith(cid)]
        if len(pids) != 1:
            raise ContainerNotRunningError(
                f"container {cid} of {container} is not running: {tasks}"
            )
        return int(pids[0])

    def cgroup(self, pid: int) -> str:
        """The process' cgroup v2 directory in the guest."""
        line = self.vm.run(f"cat /proc/{pid}/cgroup").check().strip()
        if not line.startswith("0::/"):
            raise AssertionError(f"process {pid} is not on the unified hierarchy alone: {line}")
        return f"/sys/fs/cgroup{line[3:]}"

    def read_files(self, directory: str, *names: str) -> dict[str, str]:
        """The first line of each file ``names`` of a guest directory."""
        script = "; ".join(f"echo {name}=$(cat {directory}/{name})" for name in names)
        output = self.vm.run(script).check()
        return dict(line.split("=", 1) for line in output.strip().splitlines())

    def allowed(self, pod: Mapping[str, Any], container: str) -> tuple[str, str]:
        """(CPUs, memory nodes) the container's process may use, as the guest's /proc says."""
        pid = self.pid(pod, container)
        status = self.vm.run(f"grep -E '^(Cpus|Mems)_allowed_list' /proc/{pid}/status").check()
        fields = dict(line.split(":\t") for line in status.strip().splitlines())
        return fields["Cpus_allowed_list"], fields["Mems_allowed_list"]

    def wait_allowed(
        self, namespace: str, name: str, container: str, want: tuple[str, str]
    ) -> None:
        """Until the container runs on ``want`` (CPUs, memory nodes)."""
        seen: tuple[str, str] = ("", "")

        def check() -> bool | None:
            nonlocal seen
            try:
                seen = self.allowed(get_pod(self.cp, namespace, name), container)
            except ContainerNotRunningError:  # the status names a container of before a boot
                return None
            return True if seen == want else None

        poll(check, 120, lambda: f"{namespace}/{name}/{container} on {want}, is on {seen}", 1.0)

    def wait_running_anew(
        self, namespace: str, name: str, container: str, old_id: str, timeout: float = 600
    ) -> dict[str, Any]:
        """The pod once ``container`` runs, ready, in another container than ``old_id`` (a
        restarted one: after a reboot the API server still shows the old one for a while)."""
        pod: dict[str, Any] = {}

        def anew() -> dict[str, Any] | None:
            nonlocal pod
            pod = get_pod(self.cp, namespace, name)
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            for status in statuses:
                if status["name"] != container or not status.get("ready"):
                    continue
                if status.get("containerID", "").rsplit("/", 1)[-1] not in ("", old_id):
                    return pod
            return None

        what = f"{namespace}/{name}/{container} running anew (not {old_id})"
        poll(anew, timeout, lambda: f"{what}: {pod.get('status')}", 2.0)
        return pod

    # -- nodedra --------------------------------------------------------------------------------

    def nodedra_pods(self) -> list[dict[str, Any]]:
        return nodedra_pods(self.kubectl, NODE_NAME)

    def nodedra_logs(self, lines: int = 40) -> str:
        """Each nodedra pod's status and log tail, and the kubelet's (for failure messages)."""
        logs = []
        for pod in self.nodedra_pods():
            name = pod["metadata"]["name"]
            done = self.kubectl("-n", NAMESPACE, "logs", name, f"--tail={lines}", check=False)
            logs.append(f"nodedra pod {name} {pod.get('status')}:\n{done.stdout or done.stderr}")
        return "\n".join(logs) + f"\nkubelet:\n{self.journal('kubelet', lines)}"

    def nodedra_get(self, path: str) -> tuple[int, str]:
        """(status, body) of nodedra's metrics port at ``path``, asked inside its pod (the
        pod network is the guest's own)."""
        (pod,) = self.nodedra_pods()
        script = (
            "import urllib.request as u, urllib.error as e\n"
            "try: a = u.urlopen('http://127.0.0.1:9464" + path + "')\n"
            "except e.HTTPError as err: a = err\n"
            "print(a.status); print(a.read().decode())"
        )
        done = self.kubectl(
            "-n", NAMESPACE, "exec", pod["metadata"]["name"], "--", "python3", "-c", script,
            timeout=120,
        )  # fmt: skip
        status, _, body = done.stdout.partition("\n")
        return int(status), body

    def nodedra_status(self) -> dict[str, Any]:
        """``nodedra status --json`` run in nodedra's pod, as an admin runs it: the CPU map
        of the instance's localhost-only ``/status``."""
        (pod,) = self.nodedra_pods()
        done = self.kubectl(
            "-n", NAMESPACE, "exec", pod["metadata"]["name"], "--", "nodedra", "status", "--json",
            timeout=120,
        )  # fmt: skip
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """One sample of nodedra's /metrics."""
        status, text = self.nodedra_get("/metrics")
        value = sample(text, name, labels)
        if status != 200 or value is None:
            raise AssertionError(f"no {name} on nodedra's /metrics ({status}):\n{text}")
        return value

    def nodedra_restarts(self) -> int:
        """How many times the kubelet started nodedra's container again."""
        (pod,) = self.nodedra_pods()
        count: int = pod["status"]["containerStatuses"][0]["restartCount"]
        return count

    def wait_nodedra_ready(self, restarts: int | None = None, timeout: float = 600) -> None:
        """One nodedra pod, Ready (registered, slices published, NRI connected), its container
        restarted ``restarts`` times (any number when None)."""
        seen: list[dict[str, Any]] = []

        def ready() -> bool | None:
            nonlocal seen
            seen = self.nodedra_pods()
            if len(seen) != 1:
                return None
            statuses = (seen[0].get("status") or {}).get("containerStatuses") or []
            if not statuses or not statuses[0]["ready"]:
                return None
            return True if restarts in (None, statuses[0]["restartCount"]) else None

        poll(
            ready,
            timeout,
            lambda: (
                f"one Ready nodedra pod restarted {restarts} times: "
                f"{[p.get('status') for p in seen]}\n{self.nodedra_logs()}"
            ),
            2.0,
        )

    def journal(self, unit: str, lines: int = 40) -> str:
        return self.vm.run(f"journalctl -u {unit} --no-pager -n {lines}", timeout=60).output

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        tails = {f"vm cluster {k}": v for k, v in self.cp.log_tails(lines).items()}
        if self._vm is not None:
            tails.update(self._vm.log_tails(lines))
            try:
                for unit in ("containerd", "kubelet", "kube-proxy"):
                    tails[f"guest {unit}"] = self.journal(unit, lines)
            except VMError as err:  # a guest that does not answer: say so, and stop asking
                tails["guest journal"] = str(err)
        return tails
