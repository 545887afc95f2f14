"""The benchmarks' cluster and processes: the real peers, nodedra and the Go driver.

Everything runs on loopback in one short temporary directory (Unix socket paths must stay
under 108 bytes), each process in its own session with its log in a file, and everything
is stopped when the benchmark ends, whatever happened. The drivers talk to the API server
as cluster admin, both of them, so authorization costs them the same; the kubelet
harnesses use their node's credentials as a kubelet does.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client as k8s

from nodedra.settings import FLAGS
from tests.fixtures.sysfs import generate
from tests.peers import cluster
from tests.peers.build import PeerBinaries
from tests.peers.cluster import create_ready_node, pool_devices
from tests.peers.controlplane import ControlPlane, feature_gates_flag
from tests.peers.kubelet import KubeletHarness
from tests.peers.ports import LOOPBACK, free_port
from tests.peers.process import PeerProcess
from tests.peers.prometheus import sample

ROOT = Path(__file__).resolve().parents[1]
RESOURCE_API = "/apis/resource.k8s.io/v1"
TOPOLOGY_AWARE = "topology-aware.nri.io"
GO_DRIVER = "go.bench.nodedra.test"
DURABLE_GO_DRIVER = "durable.bench.nodedra.test"
METADATA_GO_DRIVER = "metadata.bench.nodedra.test"
"""The Go driver with a durable record of each claim (``--state-dir``)."""

#: The machine nodedra's topology-aware policy runs on in the benchmarks: two sockets,
#: two NUMA nodes each, 20 cores of 2 threads per node, 160 CPUs. The fixture the tests use
#: (two-socket-smt2-numa4) has 56 CPUs, too few for 64 claims of one CPU each.
BENCH_SHAPE = generate.Shape(
    name="bench-two-socket-smt2-numa4-160",
    cpus=generate.smt_cpus(packages=2, nodes_per_package=2, cores_per_node=20, threads=2),
    nodes=tuple(
        generate.Node(
            node,
            192 * generate.GIB_KB,
            generate.distances_by_package(node, 4, 2),
            {generate.HUGE_2M_KB: 0, generate.HUGE_1G_KB: 0},
        )
        for node in range(4)
    ),
)

T = TypeVar("T")


def write_sysfs(directory: Path) -> Path:
    """Write the benchmark machine's sysfs tree under ``directory``; its root."""
    generate.write(BENCH_SHAPE, directory)
    return directory / BENCH_SHAPE.name


def poll(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.02) -> T:
    """Call ``check`` until it returns something, as the tests' poll does, naming ``what``."""
    return cluster.poll(check, timeout, lambda: f"waiting for {what}", interval)


class Admin:
    """Cluster-admin API calls on the official client (pooled connections, thread-safe)."""

    def __init__(self, cp: ControlPlane) -> None:
        configuration = k8s.Configuration(
            host=cp.url,
            ssl_ca_cert=str(cp.ca.pair.cert),
            cert_file=str(cp.admin.cert),
            key_file=str(cp.admin.key),
        )
        configuration.connection_pool_maxsize = 8
        self.client = k8s.ApiClient(configuration)

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()  # type: ignore[no-untyped-call]

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        **query: str,
    ) -> Any:
        """One request; the decoded answer. RuntimeError with the server's message."""
        params = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query.items()),
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=dict(body) if body is not None else None,
            auth_settings=["BearerToken"],
        )
        response = self.client.call_api(*params, _request_timeout=60)
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise RuntimeError(f"{method} {path}: HTTP {response.status}: {data[:500]!r}")
        return json.loads(data) if data else None

    def slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        """The ResourceSlices of ``driver`` on ``node``."""
        selector = f"spec.nodeName={node},spec.driver={driver}"
        answer = self.call("GET", f"{RESOURCE_API}/resourceslices", fieldSelector=selector)
        return list(answer.get("items") or [])

    def wipe_slices(self, selector: str) -> None:
        """Delete the ResourceSlices ``selector`` picks, as the kubelet does (DeleteCollection)."""
        query = urllib.parse.urlencode({"fieldSelector": selector})
        self.call("DELETE", f"{RESOURCE_API}/resourceslices?{query}")

    def ensure_namespace(self, name: str) -> None:
        """Create namespace ``name`` unless it exists."""
        with contextlib.suppress(RuntimeError):
            self.call(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            )


def complete_pool(slices: Sequence[Mapping[str, Any]], devices: int) -> list[str] | None:
    """The device names of the pool's newest generation once it is whole, else None."""
    found = pool_devices([dict(s) for s in slices])
    return [d["name"] for d in found] if found is not None and len(found) == devices else None


@dataclass
class Spawned:
    """A process the benchmark started, with the name it reports under."""

    name: str
    process: PeerProcess
    metrics_url: str | None = None
    """``nodedra run``'s /metrics."""
    status_url: str | None = None
    """``nodedra run``'s /status (the CPU map)."""

    @property
    def pid(self) -> int:
        """Its process id (for /proc)."""
        return self.process.pid

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period."""
        self.process.stop()

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """One sample of its /metrics: the series ``name`` with exactly ``labels``."""
        assert self.metrics_url is not None, f"{self.name} serves no metrics"
        with urllib.request.urlopen(self.metrics_url, timeout=10) as answer:
            value = sample(answer.read().decode(), name, labels)
        if value is None:
            raise KeyError(f"{self.name}: no {name} {labels or ''} on {self.metrics_url}")
        return value


class BenchCluster:
    """The control plane, nodes with kubelet harnesses, and the drivers under test."""

    def __init__(self, binaries: PeerBinaries, workdir: Path) -> None:
        self.binaries = binaries
        self.workdir = workdir
        self.cp = ControlPlane(binaries, workdir / "cp")
        self._stack = contextlib.ExitStack()
        self.admin: Admin | None = None

    def __enter__(self) -> BenchCluster:
        self._stack.callback(self.cp.stop)  # also stops what a failed start left running
        try:
            self.cp.start()
            self.admin = Admin(self.cp)
        except BaseException:
            self._stack.close()
            raise
        self._stack.callback(self.admin.close)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    @property
    def api(self) -> Admin:
        """Cluster-admin API access."""
        if self.admin is None:
            raise RuntimeError("the cluster is not started")
        return self.admin

    def node(self, name: str) -> None:
        """A Ready Node object, as a kubelet registers it."""
        create_ready_node(self.cp, name)

    def kubelet(self, node: str) -> KubeletHarness:
        """A kubelet harness for ``node`` (created here), after its start-up slice wipe."""
        self.node(node)
        harness = KubeletHarness(
            self.binaries.kubelet_harness,
            self.cp.node_kubeconfig(node),
            node,
            self.workdir / f"k-{node}",
            feature_gates=feature_gates_flag(self.cp.feature_gates),
            verbosity=2,
        )
        harness.start()
        self._stack.callback(harness.stop)
        harness.wait_slice_wipe("")
        return harness

    def on_exit(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` when the cluster stops (if it was not called before: idempotent)."""
        self._stack.callback(stop)

    def spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Spawned:
        """Start a process that is stopped with the cluster if not before."""
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        spawned = Spawned(name, PeerProcess(name, argv, log, env=env))
        self._stack.callback(spawned.stop)
        return spawned

    def go_driver(
        self,
        node: str,
        registry: Path,
        *,
        driver: str = GO_DRIVER,
        devices: int = 4,
        name: str | None = None,
        durable: bool = False,
        metadata: bool = False,
    ) -> Spawned:
        """The Go reference driver (official kubeletplugin helper) on ``node``.

        Its client's rate limiter is off (client-go's default is 5 requests/s, burst 10),
        as nodedra's client has none: a 64-claim prepare would otherwise measure the
        limiter. Devices go into slices of at most 128, the API's limit. ``durable``: it
        also writes, fsyncs and renames a record per prepared claim (and fsyncs the
        directory) before the CDI spec, as drivers that keep a checkpoint do. ``metadata``:
        it writes device metadata for each prepared claim's requests through the helper,
        as nodedra always does.
        """
        name = name or f"go-{node}-{driver.split('.', maxsplit=1)[0]}"
        directory = self.workdir / name
        argv = [
            str(self.binaries.go_driver),
            f"--kubeconfig={self.cp.admin_kubeconfig}",
            f"--node-name={node}",
            f"--driver-name={driver}",
            f"--registry-dir={registry}",
            f"--plugin-dir={directory / 'plugin'}",
            f"--cdi-dir={directory / 'cdi'}",
            f"--devices={devices}",
            "--devices-per-slice=128",
            "--kube-api-qps=-1",
            f"--device-metadata={str(metadata).lower()}",
            "--v=2",
        ]
        if durable:
            argv.append(f"--state-dir={directory / 'state'}")
        return self.spawn(name, argv)

    def nodedra_manager(self, node: str, registry: Path, sysfs: Path) -> Spawned:
        """nodedra's ResourceManager (topology-aware) alone, in a Python process of its own.

        ``python -m bench.manager_proc``: the plugin, the policy and the checkpoint exactly
        as ``nodedra run`` builds them, without kopf, the claim watch or metrics.
        """
        directory = self.workdir / f"m-{node}"
        argv = [
            sys.executable,
            "-m",
            "bench.manager_proc",
            f"--node-name={node}",
            f"--kubeconfig={self.cp.admin_kubeconfig}",
            f"--registry-dir={registry}",
            f"--workdir={directory}",
            f"--sysfs={sysfs}",
        ]
        return self.spawn(f"nodedra-manager-{node}", argv, env=python_env())

    def dependency_floor(self) -> Spawned:
        """``python -m bench.floor_proc``: nodedra's imports and two idle gRPC servers."""
        argv = [sys.executable, "-m", "bench.floor_proc", f"--workdir={self.workdir / 'floor'}"]
        return self.spawn("dependency-floor", argv, env=python_env())

    def nodedra_run(
        self,
        node: str,
        registry: Path,
        sysfs: Path,
        *,
        name: str,
        watch_claims: bool = True,
        nri_socket: Path | None = None,
    ) -> Spawned:
        """``python -m nodedra run`` for ``node``: the operator as its DaemonSet runs it.

        Pinning is off unless ``nri_socket`` names a runtime's NRI socket (then required).
        """
        directory = self.workdir / name
        for sub in ("plugin", "cdi", "state"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        config = directory / "config.yaml"
        # With pinning, containers without claims need a CPU no claim can take.
        config.write_text(
            "policy: topology-aware\n" + ('reservedCPUs: "0"\n' if nri_socket else "")
        )
        metrics = f"{LOOPBACK}:{free_port()}"
        status = f"{LOOPBACK}:{free_port()}"
        argv = [
            sys.executable,
            "-m",
            "nodedra",
            "run",
            f"--node-name={node}",
            f"--kubeconfig={self.cp.admin_kubeconfig}",
            f"--registry-dir={registry}",
            f"--plugin-dir={directory / 'plugin'}",
            f"--cdi-dir={directory / 'cdi'}",
            f"--state-dir={directory / 'state'}",
            f"--sysfs={sysfs}",
            f"--config={config}",
            f"--metrics-address={metrics}",
            f"--health-address={LOOPBACK}:{free_port()}",
            f"--status-address={status}",
            # As the DaemonSet runs it: sockets named after its pod, the instances' lock
            # (a short UID: the benchmark's directories are longer than /var/lib/kubelet).
            f"--pod-uid={uuid.uuid4().hex[:8]}",
            *(
                [f"--nri-socket={nri_socket}", "--pinning=required"]
                if nri_socket
                else ["--pinning=off"]
            ),
        ]
        env = python_env()
        env["NODEDRA_WATCH_CLAIMS"] = "true" if watch_claims else "false"
        spawned = self.spawn(name, argv, env=env)
        spawned.metrics_url = f"http://{metrics}/metrics"
        spawned.status_url = f"http://{status}/status"
        return spawned


def python_env() -> dict[str, str]:
    """The environment of the Python processes: no inherited NODEDRA_* settings.

    An exported NODEDRA_CONFIG or the like must not change what a benchmark measures;
    the repository root is on the path so ``bench`` and ``tests`` import.
    """
    ours = {flag.env for flag in FLAGS}
    env = {k: v for k, v in os.environ.items() if k not in ours}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env
