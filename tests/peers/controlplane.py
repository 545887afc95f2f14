"""A real Kubernetes control plane on loopback for integration tests.

etcd and kube-apiserver always; kube-scheduler and kube-controller-manager on
demand for end-to-end flows (claims from templates, allocation, binding). All
listen on 127.0.0.1 only, on free ports, with freshly generated certificates,
and run as the official binaries built by `tests.peers.build`.

The API server is configured as a DRA cluster would be: Node and RBAC
authorization, the resource.k8s.io API versions enabled, and the DRA feature
gates of the run set explicitly (tests.peers.profile says which).
Talking to it needs nothing but the standard library (`request`), so this
module does not depend on a Kubernetes client package.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.peers.build import PeerBinaries
from tests.peers.pki import CertificateAuthority, CertPair, service_account_key_pair
from tests.peers.ports import LOOPBACK, free_port
from tests.peers.process import PeerProcess, PeerProcessError
from tests.peers.profile import gates_for, runtime_config

#: Controllers the controller-manager runs: all defaults (which include the
#: resourceclaim controller when DRA is on) except the node lifecycle
#: controller. There is no real kubelet to renew node leases, so that
#: controller would mark test nodes unreachable and taint them.
CONTROLLERS = "*,-node-lifecycle-controller"


#: The service CIDR, and the `kubernetes` Service's address in it (its first address), which
#: pods reach the API server by (KUBERNETES_SERVICE_HOST) where kube-proxy runs.
SERVICE_CIDR = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"


def feature_gates_flag(gates: Mapping[str, bool]) -> str:
    """Render gates as the components' --feature-gates value."""
    return ",".join(f"{name}={'true' if on else 'false'}" for name, on in sorted(gates.items()))


class APIError(RuntimeError):
    """An API request failed; `status` is the HTTP status code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    user: str,
    *,
    client: CertPair | None = None,
    token: str | None = None,
) -> Path:
    """Write a kubeconfig (JSON is valid YAML) with embedded credentials."""
    credentials: dict[str, str] = {}
    if client is not None:
        credentials["client-certificate-data"] = base64.b64encode(client.cert.read_bytes()).decode()
        credentials["client-key-data"] = base64.b64encode(client.key.read_bytes()).decode()
    if token is not None:
        credentials["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "nodedra-test",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {"name": "nodedra-test", "context": {"cluster": "nodedra-test", "user": user}}
        ],
        "current-context": "nodedra-test",
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


class ControlPlane:
    """etcd + kube-apiserver (+ scheduler and controller-manager on demand).

    Use as a context manager or call start()/stop(). Each component logs to
    `<workdir>/<component>.log`.
    """

    def __init__(
        self,
        binaries: PeerBinaries,
        workdir: Path | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        verbosity: int = 2,
        apiserver_args: Sequence[str] = (),
        *,
        address: str = LOOPBACK,
    ) -> None:
        """``feature_gates``: every component's (default: the gates nodedra uses on);
        ``apiserver_args``: more flags of kube-apiserver; ``address``: where the API server
        listens, loopback by default. Another address (a real node's, in the test run's
        network namespace) makes it the endpoint of the `kubernetes` Service too, so that
        pods on a pod network reach it through kube-proxy, as in a real cluster."""
        self.binaries = binaries
        self.workdir = (
            workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="nodedra-cp-"))
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.feature_gates = dict(
            gates_for(binaries.kube_apiserver, "alpha") if feature_gates is None else feature_gates
        )
        self.verbosity = verbosity
        self.apiserver_args = tuple(apiserver_args)
        self.address = address
        self.processes: dict[str, PeerProcess] = {}
        self.pki_dir = self.workdir / "pki"
        self.ca = CertificateAuthority(self.pki_dir)
        self.sa_keys = service_account_key_pair(self.pki_dir)
        self.serving = self.ca.issue(
            "apiserver",
            "kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ip_addresses=tuple(dict.fromkeys((LOOPBACK, address, KUBERNETES_SERVICE_IP))),
            server=True,
        )
        self.admin = self.ca.issue("admin", "nodedra-test-admin", organizations=("system:masters",))
        # How the API server authenticates to kubelets (pod logs, exec): as a cluster admin,
        # so a kubelet's webhook authorization lets it in, as in a kubeadm cluster.
        self.kubelet_client = self.ca.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organizations=("system:masters",),
        )
        self.etcd_url = ""
        self.url = ""
        self.admin_kubeconfig = self.workdir / "admin.kubeconfig"
        self._ssl = ssl.create_default_context(cafile=str(self.ca.pair.cert))
        self._ssl.load_cert_chain(str(self.admin.cert), str(self.admin.key))

    # -- lifecycle -----------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> None:
        """Start etcd and kube-apiserver and wait until /readyz says ok."""
        try:
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
        except BaseException:
            self.stop()
            raise

    def start_workload_controllers(self, timeout: float = 120.0) -> None:
        """Start kube-scheduler and kube-controller-manager (idempotent)."""
        if "kube-controller-manager" not in self.processes:
            self._start_controller_manager(timeout)
        if "kube-scheduler" not in self.processes:
            self._start_scheduler(timeout)

    def stop(self) -> None:
        """Stop all components, newest first, so none outlives the test run."""
        for name in reversed(list(self.processes)):
            self.processes.pop(name).stop()

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver alone, as in an outage: etcd keeps the cluster's data and
        `restart_apiserver` brings the API back."""
        proc = self.processes.pop("kube-apiserver", None)
        if proc is not None:
            proc.stop()

    def restart_apiserver(self, timeout: float = 120.0) -> None:
        """Start kube-apiserver again after `stop_apiserver`, on the port it had, so that
        clients configured before the outage reach it again; wait until /readyz says ok."""
        if "kube-apiserver" in self.processes:
            raise RuntimeError("kube-apiserver is running")
        port = int(self.url.rsplit(":", 1)[1])
        proc = PeerProcess(
            "kube-apiserver", self._apiserver_argv(port), self.workdir / "kube-apiserver.log"
        )
        self.processes["kube-apiserver"] = proc
        try:
            proc.wait_until(self._apiserver_ready, timeout, "/readyz ok")
        except BaseException:
            self.processes.pop("kube-apiserver").stop()
            raise

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        """The last log lines of each component, for failure reports."""
        return {name: proc.tail(lines) for name, proc in self.processes.items()}

    def log_paths(self) -> dict[str, Path]:
        return {name: proc.log_path for name, proc in self.processes.items()}

    # -- components ----------------------------------------------------

    def _spawn(self, name: str, argv: list[str], ready: Any, timeout: float, what: str) -> None:
        """Start a component on fresh ports, retrying if a port was taken
        between choosing it and binding it."""
        for attempt in range(3):
            proc = PeerProcess(
                name,
                argv if attempt == 0 else self._argv_with_new_ports(name),
                self.workdir / f"{name}.log",
            )
            self.processes[name] = proc
            try:
                proc.wait_until(ready, timeout, what)
                return
            except PeerProcessError as err:
                proc.stop()
                del self.processes[name]
                if "address already in use" not in str(err) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _argv_with_new_ports(self, name: str) -> list[str]:
        builders = {
            "etcd": self._etcd_argv,
            "kube-apiserver": self._apiserver_argv,
            "kube-scheduler": self._scheduler_argv,
            "kube-controller-manager": self._controller_manager_argv,
        }
        return builders[name]()

    def _etcd_argv(self) -> list[str]:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://{LOOPBACK}:{client}"
        peer_url = f"http://{LOOPBACK}:{peer}"
        return [
            str(self.binaries.etcd),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--initial-cluster-state=new",
            # Test data is thrown away: skip fsync, it dominates latency on
            # slow disks.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]

    def _start_etcd(self, timeout: float) -> None:
        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                body: dict[str, Any] = json.load(resp)
            return body.get("health") == "true"

        self._spawn("etcd", self._etcd_argv(), healthy, timeout, "etcd /health")

    def _apiserver_argv(self, port: int | None = None) -> list[str]:
        port = port or free_port(self.address)
        self.url = f"https://{self.address}:{port}"
        # The endpoint reconciler refuses loopback addresses: on loopback, nothing reaches
        # the API server through the `kubernetes` Service.
        reconciler = ["--endpoint-reconciler-type=none"] if self.address == LOOPBACK else []
        return [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            *reconciler,
            f"--secure-port={port}",
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.ca.pair.cert}",
            f"--service-account-key-file={self.sa_keys.cert}",
            f"--service-account-signing-key-file={self.sa_keys.key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            # Service IPs are allocated from it; traffic goes there only where kube-proxy
            # runs (a real node with a pod network).
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--kubelet-client-certificate={self.kubelet_client.cert}",
            f"--kubelet-client-key={self.kubelet_client.key}",
            # Kubelets serve with certificates of this CA (tests.peers.node issues them).
            f"--kubelet-certificate-authority={self.ca.pair.cert}",
            # A real node's kubelet (tests.peers.node) is reached at its address: the
            # hostname it reports resolves nowhere.
            "--kubelet-preferred-address-types=InternalIP",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--runtime-config={runtime_config(self.binaries.kube_apiserver, self.feature_gates)}",
            f"--feature-gates={feature_gates_flag(self.feature_gates)}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            "--allow-privileged=true",
            f"--v={self.verbosity}",
            *self.apiserver_args,
        ]

    def _start_apiserver(self, timeout: float) -> None:
        self._spawn(
            "kube-apiserver", self._apiserver_argv(), self._apiserver_ready, timeout, "/readyz ok"
        )
        write_kubeconfig(
            self.admin_kubeconfig, self.url, self.ca.pair.cert, "admin", client=self.admin
        )

    def _apiserver_ready(self) -> bool:
        try:
            body = self._raw("GET", "/readyz")
        except (APIError, urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
            return False
        return body.strip() == b"ok"

    def _component_kubeconfig(self, component: str, user: str) -> Path:
        pair = self.ca.issue(component, user)
        return write_kubeconfig(
            self.workdir / f"{component}.kubeconfig", self.url, self.ca.pair.cert, user, client=pair
        )

    def _healthz(self, port: int) -> bool:
        # The components serve with a self-signed certificate of their
        # own; /healthz is always allowed without authentication.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(
                f"https://{LOOPBACK}:{port}/healthz", timeout=2, context=context
            ) as resp:
                return bool(resp.read().strip() == b"ok")
        except urllib.error.HTTPError:
            return False

    def _controller_manager_argv(self) -> list[str]:
        # The identity the bootstrap RBAC policy grants the controller-manager.
        kubeconfig = self._component_kubeconfig(
            "kube-controller-manager", "system:kube-controller-manager"
        )
        self._kcm_port = free_port()
        return [
            str(self.binaries.kube_controller_manager),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self._kcm_port}",
            f"--cert-dir={self.workdir / 'kube-controller-manager-certs'}",
            "--leader-elect=false",
            f"--controllers={CONTROLLERS}",
            # Each controller acts with its own ServiceAccount, as in a real
            # cluster, so RBAC for the resourceclaim controller is exercised.
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.sa_keys.key}",
            f"--root-ca-file={self.ca.pair.cert}",
            f"--feature-gates={feature_gates_flag(self.feature_gates)}",
            f"--v={self.verbosity}",
        ]

    def _start_controller_manager(self, timeout: float) -> None:
        argv = self._controller_manager_argv()
        self._spawn(
            "kube-controller-manager",
            argv,
            lambda: self._healthz(self._kcm_port),
            timeout,
            "/healthz ok",
        )

    def _scheduler_argv(self) -> list[str]:
        kubeconfig = self._component_kubeconfig("kube-scheduler", "system:kube-scheduler")
        self._scheduler_port = free_port()
        return [
            str(self.binaries.kube_scheduler),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self._scheduler_port}",
            f"--cert-dir={self.workdir / 'kube-scheduler-certs'}",
            "--leader-elect=false",
            f"--feature-gates={feature_gates_flag(self.feature_gates)}",
            f"--v={self.verbosity}",
        ]

    def _start_scheduler(self, timeout: float) -> None:
        argv = self._scheduler_argv()
        self._spawn(
            "kube-scheduler",
            argv,
            lambda: self._healthz(self._scheduler_port),
            timeout,
            "/healthz ok",
        )

    # -- credentials ---------------------------------------------------

    def node_kubeconfig(self, node_name: str) -> Path:
        """Credentials of the kubelet of `node_name` (user system:node:<name>
        in group system:nodes), which the Node authorizer and the
        NodeRestriction admission plugin limit as for a real kubelet."""
        pair = self.ca.issue(
            f"node-{node_name}", f"system:node:{node_name}", organizations=("system:nodes",)
        )
        return write_kubeconfig(
            self.workdir / f"node-{node_name}.kubeconfig",
            self.url,
            self.ca.pair.cert,
            f"system:node:{node_name}",
            client=pair,
        )

    def service_account_kubeconfig(
        self, namespace: str, name: str, expiration_seconds: int = 3600
    ) -> Path:
        """A kubeconfig acting as ServiceAccount namespace/name, with a token
        from the TokenRequest API (created if missing, as is the account)."""
        self.ensure_namespace(namespace)
        self.create_if_absent(
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        )
        token_request = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )
        token = token_request["status"]["token"]
        return write_kubeconfig(
            self.workdir / f"sa-{namespace}-{name}.kubeconfig",
            self.url,
            self.ca.pair.cert,
            f"system:serviceaccount:{namespace}:{name}",
            token=token,
        )

    # -- minimal admin API access --------------------------------------

    def _raw(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=30) as resp:
                result: bytes = resp.read()
                return result
        except urllib.error.HTTPError as err:
            raise APIError(err.code, err.read().decode(errors="replace")) from None

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        """One API request as cluster admin; returns the decoded JSON."""
        raw = self._raw(method, path, body, content_type)
        return json.loads(raw) if raw else None

    def get_text(self, path: str) -> str:
        """GET a non-JSON endpoint (e.g. /metrics) as cluster admin."""
        return self._raw("GET", path).decode()

    def create_if_absent(self, collection: str, obj: Mapping[str, Any]) -> None:
        try:
            self.request("POST", collection, obj)
        except APIError as err:
            if err.status != 409:
                raise

    def delete_if_present(self, path: str, body: Any = None) -> bool:
        """DELETE ``path``; whether it was there (a 404 means someone deleted it first)."""
        try:
            self.request("DELETE", path, body)
        except APIError as err:
            if err.status != 404:
                raise
            return False
        return True

    def ensure_namespace(self, namespace: str) -> None:
        self.create_if_absent(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )

    def wait_for(self, path: str, timeout: float = 30.0) -> Any:
        """GET path until it exists; returns the object."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.request("GET", path)
            except APIError as err:
                if err.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)
