"""nodedra on a node of the test cluster, wired the way a cluster admin and a DaemonSet would.

Shared by the integration tests (tests/integration/test_operator.py) and the local demo
(`python -m tests.peers.local`). Nothing here fakes nodedra's side: it runs as
`python -m nodedra run`, a process of its own, with the credentials its DaemonSet pod would
have. What stands in for the rest of a node:

* the admin's part: the objects of manifests/ (Namespace, ServiceAccount, RBAC, the
  ValidatingAdmissionPolicy, DeviceClasses, ConfigMap) applied with server-side apply;
* the pod's identity: a Pod object in namespace nodedra bound to the node (spec.nodeName set,
  it never runs) and a ServiceAccount token bound to that pod through the TokenRequest API,
  so the token carries the node name and the admission policy and RBAC apply for real;
* the ConfigMap volume: a configuration file we write (and rewrite, for live reloads);
* the kubelet: `KubeletHarness`, whose registry directory nodedra registers in.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nodedra import __version__
from nodedra.inventory import inventory
from nodedra.policy import load_config
from nodedra.resmgr.checkpoint import FILE_NAME, Checkpoint
from nodedra.settings import FLAGS
from nodedra.topology import parse_cpu_list, read_topology
from tests.peers.cluster import (
    ensure_test_namespace,
    get_claim,
    pod_claim_name,
    pod_on,
    poll,
    pool_devices,
    resource_slices,
    wait_pod_scheduled,
)
from tests.peers.controlplane import APIError, ControlPlane, write_kubeconfig
from tests.peers.kubelet import KubeletHarness, RegisteredPlugin
from tests.peers.ports import LOOPBACK, free_port
from tests.peers.process import PeerProcess, PeerProcessError
from tests.peers.prometheus import sample

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
SAMPLES = MANIFESTS / "samples"

#: What a cluster admin applies before nodedra's DaemonSet can run (the DaemonSet itself is
#: what this module replaces with a process).
ADMIN_MANIFESTS = (
    "namespace.yaml",
    "serviceaccount.yaml",
    "rbac.yaml",
    "admission-policy.yaml",
    "deviceclasses.yaml",
    "configmap.yaml",
)
NAMESPACE = "nodedra"
SERVICE_ACCOUNT = "nodedra"
SERVICE_ACCOUNT_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
FIELD_MANAGER = "nodedra-tests"
TOPOLOGY_AWARE = "topology-aware.nri.io"
STATIC = "static.nri.io"

#: Environment variables that configure `nodedra run`; they are not inherited from whoever
#: runs the tests, so an exported NODEDRA_CONFIG cannot change what a test means.
SETTINGS_ENV = frozenset(flag.env for flag in FLAGS)


#: The kinds of manifests/ (and of the chart) that live in no namespace.
CLUSTER_SCOPED_KINDS = frozenset(
    {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DeviceClass",
    }
)


# -- requests with a pod's own credentials -------------------------------------------------


def kube_request(
    cp: ControlPlane, token: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    """One API request with a bearer token; (status, decoded answer)."""
    context = ssl.create_default_context(cafile=str(cp.ca.pair.cert))
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(cp.url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, context=context, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def slice_for(node: str) -> dict[str, Any]:
    """An empty ResourceSlice of the topology-aware driver for ``node``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-probe-"},
        "spec": {
            "driver": TOPOLOGY_AWARE,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def dry_run_create_slice(cp: ControlPlane, token: str, node: str) -> tuple[int, Any]:
    """Whether ``token`` may create a slice of ``node`` (admission runs, nothing is stored)."""
    return kube_request(
        cp, token, "POST", "/apis/resource.k8s.io/v1/resourceslices?dryRun=All", slice_for(node)
    )


# -- manifests ----------------------------------------------------------------------------


def load_manifests(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The objects of YAML files, in file order (empty documents skipped)."""
    objects: list[dict[str, Any]] = []
    for path in paths:
        objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return objects


def manifest_files(directory: Path) -> list[Path]:
    """The files a kustomization.yaml in ``directory`` lists, in its order."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return [directory / name for name in kustomization["resources"]]


class ResourcePaths:
    """REST paths of objects, from the API server's own discovery (no table to go stale)."""

    def __init__(self, cp: ControlPlane) -> None:
        self._cp = cp
        self._kinds: dict[str, dict[str, tuple[str, bool]]] = {}

    def _resources(self, api_version: str) -> dict[str, tuple[str, bool]]:
        if api_version not in self._kinds:
            prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            listing = self._cp.request("GET", prefix)
            self._kinds[api_version] = {
                r["kind"]: (f"{prefix}/{r['name']}", bool(r["namespaced"]))
                for r in listing["resources"]
                if "/" not in r["name"]
            }
        return self._kinds[api_version]

    def collection(self, obj: Mapping[str, Any]) -> str:
        """Where objects of ``obj``'s kind (in its namespace) live."""
        kinds = self._resources(obj["apiVersion"])
        if obj["kind"] not in kinds:
            raise ValueError(f"the API server serves no {obj['kind']} in {obj['apiVersion']}")
        path, namespaced = kinds[obj["kind"]]
        if not namespaced:
            return path
        namespace = obj["metadata"].get("namespace")
        if not namespace:
            raise ValueError(f"{obj['kind']} {obj['metadata'].get('name')} names no namespace")
        group_version, resource = path.rsplit("/", 1)
        return f"{group_version}/namespaces/{namespace}/{resource}"

    def of(self, obj: Mapping[str, Any]) -> str:
        """The path of ``obj`` itself."""
        return f"{self.collection(obj)}/{obj['metadata']['name']}"


def apply_objects(
    cp: ControlPlane, objects: Sequence[Mapping[str, Any]], field_manager: str = FIELD_MANAGER
) -> list[dict[str, Any]]:
    """Server-side apply each object as cluster admin (as `kubectl apply --server-side`).

    A new Namespace gets its ``default`` ServiceAccount at once: the controller-manager
    creates it a moment later, and a pod applied in between would be refused (as it can be
    with kubectl).
    """
    paths = ResourcePaths(cp)
    query = urllib.parse.urlencode({"fieldManager": field_manager, "force": "true"})
    applied = []
    for obj in objects:
        applied.append(
            cp.request(
                "PATCH",
                f"{paths.of(obj)}?{query}",
                obj,
                content_type="application/apply-patch+yaml",
            )
        )
        if obj["kind"] == "Namespace":
            ensure_test_namespace(cp, obj["metadata"]["name"])
    return applied


def install_nodedra(cp: ControlPlane) -> list[dict[str, Any]]:
    """What the admin applies from manifests/ before nodedra runs anywhere."""
    return apply_objects(cp, load_manifests(MANIFESTS / name for name in ADMIN_MANIFESTS))


# -- the pod's identity ---------------------------------------------------------------------


@dataclass(frozen=True)
class PodIdentity:
    """A nodedra pod that exists only on paper, and the credentials the kubelet would mount."""

    pod_name: str
    pod_uid: str
    node_name: str
    token: str
    kubeconfig: Path


def pod_identity(
    cp: ControlPlane,
    node_name: str,
    directory: Path,
    *,
    pod_name: str | None = None,
    expiration_seconds: int = 3600,
) -> PodIdentity:
    """A Pod of nodedra's ServiceAccount bound to ``node_name`` and a token bound to it.

    The token is what the kubelet projects into a DaemonSet pod: its claims name the pod and
    its node, so the API server adds the node name to the user's extra
    ``authentication.kubernetes.io/node-name``, which the admission policy checks. The pod
    is created already bound (spec.nodeName), so no scheduler is involved and no kubelet
    ever runs it; deleting it revokes the token.
    """
    name = pod_name or f"nodedra-{node_name}-{uuid.uuid4().hex[:5]}"
    pod = cp.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "nodedra"}},
            "spec": {
                "nodeName": node_name,
                "serviceAccountName": SERVICE_ACCOUNT,
                # The token comes from the TokenRequest below, not from a volume.
                "automountServiceAccountToken": False,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "nodedra", "image": f"nodedra:{__version__}"}],
            },
        },
    )
    uid = pod["metadata"]["uid"]
    answer = cp.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{SERVICE_ACCOUNT}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": expiration_seconds,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid},
            },
        },
    )
    token = answer["status"]["token"]
    directory.mkdir(parents=True, exist_ok=True)
    kubeconfig = write_kubeconfig(
        directory / f"{name}.kubeconfig", cp.url, cp.ca.pair.cert, SERVICE_ACCOUNT_USER, token=token
    )
    return PodIdentity(name, uid, node_name, token, kubeconfig)


def delete_pod(cp: ControlPlane, name: str, namespace: str = NAMESPACE) -> None:
    """Delete a pod at once (no kubelet will ever confirm a graceful deletion)."""
    with contextlib.suppress(APIError):
        cp.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
        )


def registrations(kubelet: KubeletHarness) -> list[RegisteredPlugin]:
    """The plugins the kubelet has registered now.

    (KubeletHarness.registered_plugins fails while there are none: the harness answers
    ``"plugins": null`` for Go's empty slice.)
    """
    answer = kubelet.call("plugins")
    return [RegisteredPlugin.from_json(p) for p in answer.get("plugins") or ()]


# -- the nodedra process --------------------------------------------------------------------


@dataclass(frozen=True)
class NodeDirs:
    """A node's directories that nodedra uses; shared by every instance on that node.

    All are short (Unix socket paths may have at most 107 bytes).
    """

    plugin: Path
    cdi: Path
    state: Path

    @classmethod
    def under(cls, root: Path) -> NodeDirs:
        dirs = cls(root / "plugin", root / "cdi", root / "state")
        for path in (dirs.plugin, dirs.cdi, dirs.state):
            path.mkdir(parents=True, exist_ok=True)
        return dirs

    @property
    def checkpoint(self) -> Path:
        return self.state / FILE_NAME

    def spec_path(self, driver: str, claim_uid: str) -> Path:
        """Where nodedra writes the CDI spec of a prepared claim."""
        return self.cdi / f"{driver}-device_{claim_uid}.yaml"


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """GET ``url``: (status, body), also for error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


class NodedraProcess:
    """One `python -m nodedra run` for a node, with its log in a file.

    It is started in a session of its own (stopping it reaches nothing else) with flags for
    everything that matters; ``env`` adds variables (NODEDRA_RESYNC_PERIOD, say). Pinning
    is off unless asked for: it needs a container runtime (``nri_socket``) to talk to.
    """

    def __init__(
        self,
        *,
        name: str,
        node_name: str | None,
        kubeconfig: Path,
        registry_dir: Path,
        dirs: NodeDirs,
        sysfs: Path,
        config: Path,
        log_path: Path,
        pod_uid: str | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        metrics_port: int | None = None,
        pinning: str = "off",
        nri_socket: Path | None = None,
    ) -> None:
        self.name = name
        self.node_name = node_name
        self.kubeconfig = kubeconfig
        self.registry_dir = registry_dir
        self.dirs = dirs
        self.sysfs = sysfs
        self.config = config
        self.log_path = log_path
        self.pod_uid = pod_uid
        self.extra_env = dict(env or {})
        self.extra_args = list(extra_args)
        self.metrics_port = metrics_port or free_port()
        self.pinning = pinning
        self.nri_socket = nri_socket
        self.health_port = free_port()
        self.status_port = free_port()
        self._process: PeerProcess | None = None

    @property
    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "nodedra", "run"]
        if self.node_name is not None:
            argv += ["--node-name", self.node_name]
        argv += [
            "--kubeconfig",
            str(self.kubeconfig),
            "--registry-dir",
            str(self.registry_dir),
            "--plugin-dir",
            str(self.dirs.plugin),
            "--cdi-dir",
            str(self.dirs.cdi),
            "--state-dir",
            str(self.dirs.state),
            "--sysfs",
            str(self.sysfs),
            "--config",
            str(self.config),
            "--metrics-address",
            f"{LOOPBACK}:{self.metrics_port}",
            "--health-address",
            f"{LOOPBACK}:{self.health_port}",
            "--status-address",
            f"{LOOPBACK}:{self.status_port}",
            "--log-format",
            "text",
            "--pinning",
            self.pinning,
        ]
        if self.nri_socket is not None:
            argv += ["--nri-socket", str(self.nri_socket)]
        if self.pod_uid is not None:
            argv += ["--pod-uid", self.pod_uid]
        return argv + self.extra_args

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        return env

    def preflight(self, *args: str) -> tuple[int, Any]:
        """``nodedra preflight --json`` with this instance's node, credentials, configuration
        and sysfs, and ``args``: its exit status and report."""
        argv = [sys.executable, "-m", "nodedra", "preflight", "--json"]
        argv += ["--node-name", str(self.node_name), "--kubeconfig", str(self.kubeconfig)]
        argv += ["--config", str(self.config), "--sysfs", str(self.sysfs), *args]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, env=self.environ(), check=False
        )
        assert done.stdout, done.stderr
        return done.returncode, json.loads(done.stdout)

    @property
    def process(self) -> PeerProcess:
        if self._process is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._process

    def start(self) -> NodedraProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._process = PeerProcess(self.name, self.argv, self.log_path, env=self.environ())
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self._process is not None and self._process.alive()

    @property
    def returncode(self) -> int | None:
        return self.process.popen.poll()

    @property
    def dra_socket(self) -> Path:
        suffix = f"-{self.pod_uid}" if self.pod_uid else ""
        return self.dirs.plugin / f"dra{suffix}.sock"

    def registration_socket(self, driver: str) -> Path:
        suffix = f"-{self.pod_uid}" if self.pod_uid else ""
        return self.registry_dir / f"{driver}{suffix}-reg.sock"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tails(self, lines: int = 60) -> dict[str, str]:
        return {f"{self.name} ({self.log_path})": self.process.tail(lines) if self._process else ""}

    # -- endpoints ---------------------------------------------------------------------------

    def healthz(self) -> tuple[int, str]:
        return http_get(f"http://{LOOPBACK}:{self.health_port}/healthz")

    def readyz(self) -> tuple[int, str]:
        return http_get(f"http://{LOOPBACK}:{self.metrics_port}/readyz")

    def metrics(self) -> str:
        status, body = http_get(f"http://{LOOPBACK}:{self.metrics_port}/metrics")
        if status != 200:
            raise AssertionError(f"{self.name}: /metrics answered {status}: {body}")
        return body

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The value of one sample of the Prometheus text on /metrics; None if absent."""
        return sample(self.metrics(), name, labels)

    # -- waiting -----------------------------------------------------------------------------

    def wait_for_log(self, text: str, timeout: float = 30.0) -> str:
        """Wait until the log has a line containing ``text``; returns that line."""

        def check() -> str | None:
            for line in self.log_text().splitlines():
                if text in line:
                    return line
            return None

        return poll(check, timeout, lambda: f"{self.name} to log {text!r}:\n{self.process.tail()}")

    def wait_ready(
        self, cp: ControlPlane, node_name: str, driver: str, timeout: float = 60.0
    ) -> None:
        """Wait until this instance says it is ready (/readyz: the kubelet registered it,
        claims are served, the slices are published, containers are pinned) and the API
        server has a complete pool of its slices. Fails at once, with the log, if the
        process exits."""
        self.process.wait_until(lambda: self.readyz()[0] == 200, timeout, "/readyz answering 200")
        self.process.wait_until(
            lambda: pool_devices(resource_slices(cp, node_name, driver)) is not None,
            timeout,
            "its ResourceSlices published",
        )

    def wait_serving(
        self,
        cp: ControlPlane,
        kubelet: KubeletHarness,
        driver: str,
        devices: int,
        timeout: float = 60.0,
    ) -> RegisteredPlugin:
        """Wait until the kubelet registered this instance and the slices are published.

        This instance's own word counts (/readyz: the kubelet told it that it registered
        it): the kubelet's list alone may still hold an earlier instance on the same socket
        path. Fails at once, with the log, if the process exits.
        """
        plugin: RegisteredPlugin | None = None

        def registered() -> bool:
            nonlocal plugin
            found = [
                p
                for p in registrations(kubelet)
                if p.driver == driver and p.endpoint == str(self.dra_socket)
            ]
            plugin = found[0] if found else None
            return plugin is not None

        def published() -> bool:
            found = pool_devices(resource_slices(cp, kubelet.node_name, driver))
            return found is not None and len(found) == devices

        def healthy() -> bool:
            return self.healthz()[0] == 200

        def ready() -> bool:
            return self.readyz()[0] == 200

        self.process.wait_until(ready, timeout, "/readyz answering 200")
        self.process.wait_until(registered, timeout, f"registered with the kubelet as {driver}")
        self.process.wait_until(published, timeout, f"{devices} devices published")
        self.process.wait_until(healthy, timeout, "/healthz answering 200")
        assert plugin is not None
        return plugin

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to end by itself; its exit status."""
        try:
            return self.process.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise PeerProcessError(
                f"{self.name} still runs after {timeout:.0f}s; log {self.log_path}:\n"
                f"{self.process.tail()}"
            ) from None

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM (as the kubelet stops a pod) and wait up to ``timeout`` for it to exit.

        What is still there then is stopped as any peer is (SIGTERM to its process group,
        SIGKILL 5 s later). Returns the exit status (negative: killed by that signal).
        """
        proc = self.process
        if proc.alive():
            os.kill(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=timeout)
        proc.stop(grace=5.0)  # SIGKILLs the group if it is still there; closes the log
        return proc.popen.returncode

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a power cut would: no clean-up at all."""
        proc = self.process
        if proc.alive():
            os.kill(proc.pid, signal.SIGKILL)
            proc.popen.wait(timeout=30)
        proc.stop(grace=0.0)

    def stop(self) -> None:
        """Make sure it is gone (for clean-ups); idempotent."""
        if self._process is not None:
            self.terminate()


def expected_devices(sysfs: Path, config: Path) -> dict[str, list[dict[str, Any]]]:
    """What each policy publishes for ``sysfs`` under ``config`` (as `nodedra topology`)."""
    data = inventory(read_topology(sysfs), load_config(config))
    devices: dict[str, list[dict[str, Any]]] = data["devices"]
    return devices


def write_config(path: Path, config: Mapping[str, Any] | str) -> Path:
    """Write a configuration file at once whole (as the kubelet swaps a ConfigMap's files)."""
    text = config if isinstance(config, str) else yaml.safe_dump(dict(config))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


# -- claims and pods --------------------------------------------------------------------------


def claim_template(
    name: str, device_class: str, capacity: Mapping[str, str] | None = None, count: int = 1
) -> dict[str, Any]:
    """A ResourceClaimTemplate for ``count`` devices of ``device_class``, each consuming
    ``capacity``."""
    exactly: dict[str, Any] = {
        "deviceClassName": device_class,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if capacity:
        exactly["capacity"] = {"requests": dict(capacity)}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "cpus", "exactly": exactly}]}}},
    }


def saved_grants(checkpoint: Path) -> dict[str, list[dict[str, Any]]]:
    """Claim UID -> its grants as the checkpoint at ``checkpoint`` holds them (device, cpus,
    mems, ...): what nodedra would find on a restart."""
    state = Checkpoint(checkpoint).load()
    assert state is not None, f"no checkpoint at {checkpoint}"
    return {uid: list(held["grants"]) for uid, held in state.claims.items()}


def granted(grants: Iterable[Mapping[str, Any]], field: str = "cpus") -> frozenset[int]:
    """The union of the grants' ``cpus`` (or ``mems``)."""
    return frozenset().union(*(parse_cpu_list(g[field]) for g in grants))


def claim_pod(name: str, node_name: str, template: str) -> dict[str, Any]:
    """A pod with one container that uses a claim from ``template``; only ``node_name`` fits."""
    container = {
        "name": "demo",
        "image": "busybox",
        "command": ["sh", "-c", "env | grep ^DRA_; sleep 3600"],
        "resources": {"claims": [{"name": "cpus"}]},
    }
    pod = pod_on(
        node_name, name, [container], [{"name": "cpus", "resourceClaimTemplateName": template}]
    )
    pod["spec"]["terminationGracePeriodSeconds"] = 5
    return pod


def env_of_spec(spec: Mapping[str, Any]) -> dict[str, str]:
    """The environment a CDI spec's devices add to a container, as a mapping."""
    env: dict[str, str] = {}
    for device in spec.get("devices") or []:
        for item in (device.get("containerEdits") or {}).get("env") or []:
            key, _, value = item.partition("=")
            env[key] = value
    return env


def wait_claim_status(
    cp: ControlPlane,
    namespace: str,
    name: str,
    driver: str,
    *,
    present: bool,
    timeout: float = 20.0,
) -> list[dict[str, Any]]:
    """Wait until the claim's status.devices has entries of ``driver`` (or has none)."""
    seen: list[dict[str, Any]] = []

    def check() -> list[dict[str, Any]] | None:
        nonlocal seen
        claim = cp.request(
            "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        )
        seen = [
            d for d in (claim.get("status") or {}).get("devices") or [] if d["driver"] == driver
        ]
        return seen if bool(seen) == present else None

    what = "entries" if present else "no entries"
    return poll(
        check,
        timeout,
        lambda: f"claim {namespace}/{name} to have {what} of {driver} in status.devices: {seen}",
    )


def start_claim_pod(
    cp: ControlPlane, namespace: str, node: str, pod: str, capacity: dict[str, str]
) -> dict[str, Any]:
    """A pod with a claim from a template of its own; returns its allocated claim."""
    cp.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
        claim_template(pod, TOPOLOGY_AWARE, capacity),
    )
    cp.request("POST", f"/api/v1/namespaces/{namespace}/pods", claim_pod(pod, node, pod))
    scheduled = wait_pod_scheduled(cp, namespace, pod)
    assert scheduled["spec"]["nodeName"] == node
    name = pod_claim_name(scheduled, "cpus")
    assert name is not None, scheduled.get("status")
    return get_claim(cp, namespace, name)


def prepared_cpus(nodedra: NodedraProcess, uid: str) -> frozenset[int]:
    spec = yaml.safe_load(nodedra.dirs.spec_path(TOPOLOGY_AWARE, uid).read_text())
    cpus: frozenset[int] = parse_cpu_list(
        env_of_spec(spec)[f"DRA_CPUSET_{uid.replace('-', '_')}_0"]
    )
    return cpus
