"""nodedra deployed as an admin deploys it: ``kubectl apply -k manifests/`` on a real node.

One cluster for the module (tests.peers.deployment): a control plane of its own, a real node
with a pod network and kube-proxy, nodedra's image (built without Docker, tests.peers.image)
and the samples' busybox imported into the node's containerd as if pulled. The manifests are
applied unchanged: the image they name is the one the node has. The tests run in order, each
going on from where the one before left the cluster: the DaemonSet runs, the samples run
pinned, the pod's credentials are what the manifests promise, a rolling update loses nothing,
the Helm chart deploys the same, with a node pool's configuration, and uninstalling
leaves nothing of nodedra's on the node.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import stat
import subprocess
import tarfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra import __version__, gather
from nodedra.lib.quantity import parse_quantity
from nodedra.topology import parse_cpu_list
from tests.pages import DOCS, code_blocks, section
from tests.peers.build import PeerBinaries
from tests.peers.cluster import get_pod, poll, resource_slices
from tests.peers.deployment import NAMESPACE, POD_SELECTOR, DeploymentCluster
from tests.peers.image import DEFAULT_NAME as IMAGE
from tests.peers.nodedra_node import (
    MANIFESTS,
    ROOT,
    SAMPLES,
    TOPOLOGY_AWARE,
    dry_run_create_slice,
    kube_request,
)
from tests.peers.pods import online_cpus, proc_status, wait_pod_running

pytestmark = pytest.mark.timeout(900)

DEMO_NAMESPACE = "nodedra-demo"
DEMO_POD = "numa-cpus"
DEMO_CONTAINER = "demo"


@pytest.fixture(scope="module")
def deployed(
    node_binaries: PeerBinaries,
    dra_gates: dict[str, bool],
    nodedra_image: Any,
    busybox_image: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DeploymentCluster]:
    """The cluster, with `kubectl apply -k manifests/` done and the rollout finished."""
    cluster = DeploymentCluster(
        node_binaries,
        tmp_path_factory.mktemp("deploy"),
        dra_gates,
        [nodedra_image.archive, busybox_image],
        repo=ROOT,
    )
    with cluster:
        cluster.kubectl("apply", "-k", str(MANIFESTS))
        cluster.rollout_status()
        yield cluster


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _slice_uids(cluster: DeploymentCluster) -> dict[str, str]:
    return {
        s["metadata"]["name"]: s["metadata"]["uid"]
        for s in resource_slices(cluster.cp, cluster.node.node_name, TOPOLOGY_AWARE)
    }


def _demo_cpus(cluster: DeploymentCluster) -> tuple[str, frozenset[int]]:
    """The CPUs the sample was given (its DRA_CPUSET_ variable, which its device metadata
    file names too) and the ones its process may run on (/proc of the machine)."""
    log = cluster.kubectl("-n", DEMO_NAMESPACE, "logs", DEMO_POD).stdout
    given = [line.split("=", 1)[1] for line in log.splitlines() if line.startswith("DRA_CPUSET_")]
    assert len(given) == 1, f"the sample printed no single DRA_CPUSET_ variable:\n{log}"
    assert "{" in log, f"the sample printed no device metadata:\n{log}"
    metadata, _ = json.JSONDecoder().raw_decode(log, log.index("{"))
    (device,) = metadata["requests"][0]["devices"]
    assert device["attributes"]["cpus"] == {"string": given[0]}, log
    pid = cluster.node.pod_pid(DEMO_NAMESPACE, DEMO_POD, DEMO_CONTAINER)
    allowed = parse_cpu_list(proc_status(pid)["Cpus_allowed_list"])
    return given[0], allowed


# -- the DaemonSet ------------------------------------------------------------------------------


def test_daemonset_pod_serves_the_node(deployed: DeploymentCluster) -> None:
    """The pod of the manifests runs with their service account, volumes and probes: Ready
    means registered with the kubelet, slices published and NRI connected (its /readyz)."""
    (pod,) = deployed.nodedra_pods()
    assert _ready(pod), pod.get("status")
    assert pod["spec"]["nodeName"] == deployed.node.node_name
    assert pod["spec"]["serviceAccountName"] == "nodedra"
    assert not pod["spec"].get("hostNetwork"), "the manifests' pod is on the pod network"
    (container,) = pod["status"]["containerStatuses"]
    assert container["image"] == IMAGE
    assert container["restartCount"] == 0
    slices = resource_slices(deployed.cp, deployed.node.node_name, TOPOLOGY_AWARE)
    assert slices, "no ResourceSlice of the node"
    owners = {ref["name"] for s in slices for ref in s["metadata"].get("ownerReferences", [])}
    assert owners == {deployed.node.node_name}
    log = deployed.node.log_paths()["kubelet"].read_text()
    assert re.search(r'"Registered DRA plugin" .*driverName="topology-aware\.nri\.io"', log), (
        "the kubelet never registered nodedra"
    )
    # The kubelet reaches the probes on the pod's own address, and so does a scraper: NRI
    # connected through the hostPath socket, the devices of the slices published.
    address = pod["status"]["podIP"]
    assert address.startswith("10.244.0.")
    with urllib.request.urlopen(f"http://{address}:9464/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert re.search(r"^nodedra_nri_connected(\{.*\})? 1\.0$", metrics, re.MULTILINE), metrics
    devices = sum(len(s["spec"].get("devices") or []) for s in slices)
    published = re.search(r"^nodedra_devices_published(?:\{.*\})? (\S+)$", metrics, re.MULTILINE)
    assert published is not None, metrics
    assert float(published.group(1)) == devices
    # The kubelet's CPU manager state file, mounted alone and read-only, is read in the pod.
    assert re.search(
        r'^nodedra_preflight_checks\{check="kubelet-cpu-manager",status="ok"\} 1\.0$',
        metrics,
        re.MULTILINE,
    ), metrics
    # `nodedra preflight` in the pod, as `kubectl exec` runs it: every check, none failing.
    (status,) = pod["status"]["containerStatuses"]
    report = json.loads(
        deployed.node.ctr(
            "task",
            "exec",
            "--exec-id",
            "preflight",
            status["containerID"].split("://", 1)[1],
            "nodedra",
            "preflight",
            "--json",
        )
    )
    verdicts = {c["name"]: c["status"] for c in report["checks"]}
    assert report["failed"] is False, report
    assert verdicts["kubelet-cpu-manager"] == "ok", report
    assert verdicts["container-runtime"] == "ok", report
    # The CPU map names pods and claims: not served to the pod network, on either port.
    with urllib.request.urlopen(f"http://{address}:9464/status", timeout=10) as resp:
        assert not resp.read().startswith(b"{"), "the metrics port serves no map"
    with pytest.raises(urllib.error.URLError, match="Connection refused"):
        urllib.request.urlopen(f"http://{address}:9465/status", timeout=10)


def test_samples_run_pinned(deployed: DeploymentCluster) -> None:
    """`kubectl apply -k manifests/samples/`: the topology-aware sample runs on the CPU it
    claimed and prints it; the static one waits (no node runs that policy); every other
    container, nodedra's own included, keeps off the claimed CPU."""
    deployed.kubectl("apply", "-k", str(SAMPLES))
    wait_pod_running(deployed.cp, DEMO_NAMESPACE, DEMO_POD, timeout=180)
    given, allowed = _demo_cpus(deployed)
    assert parse_cpu_list(given) == allowed, (given, allowed)
    assert 0 not in allowed, "the sample got reserved CPU 0"
    static = deployed.kubectl("-n", DEMO_NAMESPACE, "get", "pod", "static-cpus", "-o", "json")
    assert json.loads(static.stdout)["status"]["phase"] == "Pending"
    (pod,) = deployed.nodedra_pods()
    nodedra_pid = deployed.node.pod_pid(NAMESPACE, pod["metadata"]["name"], "nodedra")
    shared = parse_cpu_list(proc_status(nodedra_pid)["Cpus_allowed_list"])
    assert shared == parse_cpu_list(online_cpus()) - allowed


# -- operations from kubectl alone --------------------------------------------------------------


def _exec(cluster: DeploymentCluster, *command: str) -> subprocess.CompletedProcess[bytes]:
    """`kubectl -n nodedra exec ds/nodedra -- COMMAND`, as docs/operations.md has it: bytes."""
    return subprocess.run(
        cluster.kubectl.argv("-n", NAMESPACE, "exec", "ds/nodedra", "--", *command),
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_kubectl_exec_shows_verdicts_from_the_cgroups_readiness_and_metrics(
    deployed: DeploymentCluster,
) -> None:
    """In the pod, which sees no other pod's processes, `nodedra status` judges the sample's
    container by its cgroup (the host's, mounted read-only); `nodedra get` reads /readyz and
    /metrics, and the API server's pod proxy does too."""
    given, _ = _demo_cpus(deployed)
    done = _exec(deployed, "nodedra", "status", "--json")
    assert done.returncode == 0, done.stderr.decode()
    cpu_map = json.loads(done.stdout)
    (demo,) = [
        c
        for c in cpu_map["containers"]
        if (c["pod"]["namespace"], c["pod"]["name"], c["name"])
        == (DEMO_NAMESPACE, DEMO_POD, DEMO_CONTAINER)
    ]
    assert demo["kernel"]["source"] == "cgroup", demo
    assert demo["kernel"]["where"].startswith("/host/sys/fs/cgroup/"), demo
    assert parse_cpu_list(demo["kernel"]["cpus"]) == parse_cpu_list(given), demo
    assert demo["kernel"]["check"] == "match", demo
    unchecked = [c for c in cpu_map["containers"] if c["kernel"]["check"] != "match"]
    assert not unchecked, unchecked
    text = _exec(deployed, "nodedra", "status").stdout.decode()
    assert f"{DEMO_NAMESPACE}/{DEMO_POD} {DEMO_CONTAINER}  CPUs {given}  ok: its cgroup" in text

    ready = _exec(deployed, "nodedra", "get", "readyz")
    assert ready.returncode == 0, ready.stderr.decode()
    assert json.loads(ready.stdout)["ready"] is True
    metrics = _exec(deployed, "nodedra", "get", "metrics")
    assert metrics.returncode == 0, metrics.stderr.decode()
    assert re.search(rb"^nodedra_nri_connected(\{.*\})? 1\.0$", metrics.stdout, re.MULTILINE)

    (pod,) = deployed.nodedra_pods()
    proxy = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}:9464/proxy"
    raw = deployed.kubectl("get", "--raw", f"{proxy}/readyz").stdout
    assert json.loads(raw)["ready"] is True
    raw = deployed.kubectl("get", "--raw", f"{proxy}/metrics").stdout
    assert re.search(r"^nodedra_devices_published(\{.*\})? ", raw, re.MULTILINE), raw[:2000]


def test_nodedra_gather_writes_the_bug_report_archive(deployed: DeploymentCluster) -> None:
    """`kubectl exec ... -- nodedra gather > nodedra-gather.tar.gz`: every part gathered."""
    done = _exec(deployed, "nodedra", "gather")
    assert done.returncode == 0, done.stderr.decode()
    with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r:gz") as tar:
        files = {}
        for member in tar.getmembers():
            extracted = tar.extractfile(member)
            assert extracted is not None, member.name
            files[member.name.split("/", 1)[1]] = extracted.read()
    assert json.loads(files["errors.json"]) == {}
    assert set(files) == {"README.txt", "errors.json", *gather.PARTS}
    (demo,) = [
        c for c in json.loads(files["status.json"])["containers"] if c["pod"]["name"] == DEMO_POD
    ]
    assert demo["kernel"]["check"] == "match"
    assert json.loads(files["readyz.json"])["ready"] is True
    claims = json.loads(files["checkpoint.json"])
    assert claims["claims_held"] == 1, claims
    (reservation,) = [c["reservation"] for c in claims["claims"].values()]
    assert reservation["namespace"] == DEMO_NAMESPACE, reservation
    specs = json.loads(files["cdi.json"])["specs"]
    assert any(spec["name"].startswith(TOPOLOGY_AWARE) for spec in specs), specs
    node = json.loads(files["node.json"])
    assert node["nri_socket"]["present"] is True
    assert node["cgroups"]["version"] in ("v1", "v2"), node["cgroups"]


# -- what the pod may do ------------------------------------------------------------------------


def test_pod_token_names_its_node_and_the_policy_holds_it_there(
    deployed: DeploymentCluster,
) -> None:
    """The kubelet's token for the pod carries the node; with it nodedra may write its own
    node's slices and no other's, and nothing beyond its ClusterRole."""
    (pod,) = deployed.nodedra_pods()
    token = deployed.pod_token(pod)
    node = deployed.node.node_name
    status, review = kube_request(
        deployed.cp,
        token,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert status == 201, review
    user = review["status"]["userInfo"]
    assert user["username"] == "system:serviceaccount:nodedra:nodedra"
    assert user["extra"]["authentication.kubernetes.io/node-name"] == [node]
    assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]

    status, answer = dry_run_create_slice(deployed.cp, token, node)
    assert status == 201, answer
    other = "other-node"
    deployed.cp.request(
        "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": other}}
    )
    try:
        status, answer = dry_run_create_slice(deployed.cp, token, other)
    finally:
        # The DaemonSet gave the other Node a pod too (that never runs): gone with it.
        deployed.cp.delete_if_present(f"/api/v1/nodes/{other}")
        deployed.kubectl(
            "-n",
            NAMESPACE,
            "delete",
            "pods",
            f"--field-selector=spec.nodeName={other}",
            "--force",
            "--grace-period=0",
        )
        poll(
            lambda: not deployed.nodedra_pods(other) or None,
            60,
            lambda: f"no nodedra pod left on {other}",
        )
    assert status == 403, answer
    assert (
        f'nodedra on node "{node}" may only create ResourceSlices of its own node'
        in (answer["message"])
    )

    denied = [
        ("GET", "/api/v1/namespaces/nodedra/secrets", None),
        ("GET", "/api/v1/namespaces/nodedra/configmaps/nodedra-config", None),
        ("POST", "/api/v1/namespaces/nodedra/pods", {"apiVersion": "v1", "kind": "Pod"}),
        ("DELETE", f"/api/v1/nodes/{node}", None),
        ("GET", "/apis/apps/v1/namespaces/nodedra/daemonsets/nodedra", None),
        ("GET", "/api/v1/pods", None),
    ]
    for method, path, body in denied:
        status, answer = kube_request(deployed.cp, token, method, path, body)
        assert status == 403, (method, path, status, answer)


def test_sockets_and_checkpoint_are_root_only(deployed: DeploymentCluster) -> None:
    """What nodedra leaves on the host, seen from the host: its sockets and its state belong
    to root and are closed to everyone else."""
    sockets = [
        p
        for directory in (deployed.node.registry_dir, deployed.node.plugins_dir / TOPOLOGY_AWARE)
        for p in directory.iterdir()
        if p.is_socket()
    ]
    assert len(sockets) >= 2, sockets  # registration and DRA service
    state = sorted(deployed.node.nodedra_state_dir.rglob("*"))
    files = [p for p in state if p.is_file()]
    assert files, "nodedra saved no state in /var/lib/nodedra"
    for path in [*sockets, *files]:
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (0, 0), path
        assert stat.S_IMODE(info.st_mode) & 0o077 == 0, (path, oct(info.st_mode))
    for directory in [
        deployed.node.plugins_dir / TOPOLOGY_AWARE,
        *(p for p in state if p.is_dir()),
    ]:
        assert stat.S_IMODE(directory.stat().st_mode) & 0o007 == 0, directory


# -- a rolling update ---------------------------------------------------------------------------


class _PodWatch:
    """`kubectl get pods --watch` of nodedra's pods: every state each pod was seen in."""

    def __init__(self, cluster: DeploymentCluster) -> None:
        self.seen: dict[str, list[dict[str, Any]]] = {}
        self.process = subprocess.Popen(
            cluster.kubectl.argv(
                "-n",
                NAMESPACE,
                "get",
                "pods",
                "-l",
                POD_SELECTOR,
                "--watch",
                "--output-watch-events",
                "-o",
                "json",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        decoder = json.JSONDecoder()
        buffer = ""
        for chunk in iter(
            lambda: self.process.stdout.readline() if self.process.stdout else "", ""
        ):
            buffer += chunk
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except json.JSONDecodeError:
                    break
                buffer = buffer.lstrip()[end:]
                pod = event["object"]
                self.seen.setdefault(pod["metadata"]["uid"], []).append(pod)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self._reader.join(timeout=10)

    def exit_codes(self, uid: str) -> set[int]:
        codes = set()
        for pod in self.seen.get(uid, []):
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                terminated = (status.get("state") or {}).get("terminated")
                if terminated:
                    codes.add(int(terminated["exitCode"]))
        return codes


class _SliceWatch(threading.Thread):
    """Lists the node's slices every 0.2 s; records every moment there were none."""

    def __init__(self, cluster: DeploymentCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.empty = 0
        self.uids: set[str] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            uids = set(_slice_uids(self.cluster).values())
            self.uids |= uids
            if not uids:
                self.empty += 1


def _kubelet_log_since(cluster: DeploymentCluster, offset: int) -> str:
    with open(cluster.node.log_paths()["kubelet"], errors="replace") as log:
        log.seek(offset)
        return log.read()


def test_rolling_update_loses_nothing(deployed: DeploymentCluster, tmp_path: Path) -> None:
    """A new image tag, applied through an overlay: the DaemonSet surges, the new pod takes
    over, the old one exits 0; the driver stays registered, the slices stay, the sample keeps
    its claim and its CPU, and a claim made after the update is pinned too."""
    (old,) = deployed.nodedra_pods()
    before_slices = _slice_uids(deployed)
    given, allowed = _demo_cpus(deployed)
    log_offset = deployed.node.log_paths()["kubelet"].stat().st_size

    deployed.node.ctr("images", "tag", IMAGE, f"{IMAGE}-update")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        # kustomize takes another kustomization only by a relative path, as overlays do.
        f"resources:\n  - {os.path.relpath(MANIFESTS, overlay)}\n"
        f"images:\n  - name: nodedra\n    newTag: {__version__}-update\n"
    )
    pods = _PodWatch(deployed)
    slices = _SliceWatch(deployed)
    slices.start()
    try:
        deployed.kubectl("apply", "-k", str(overlay))
        deployed.rollout_status(timeout=300)
        new = deployed.wait_single_ready_pod()
        poll(
            lambda: pods.exit_codes(old["metadata"]["uid"]) or None,
            60,
            lambda: "the old pod's exit",
        )
    finally:
        slices.done.set()
        slices.join()
        pods.stop()

    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["spec"]["containers"][0]["image"] == f"nodedra:{__version__}-update"
    assert pods.exit_codes(old["metadata"]["uid"]) == {0}
    assert slices.empty == 0, "the node had no slices for a while"
    assert slices.uids == set(before_slices.values()), "slices were deleted and made again"
    kubelet = _kubelet_log_since(deployed, log_offset)
    assert "Deleted ResourceSlices" not in kubelet
    unregistered = re.findall(
        r'"Unregistered DRA plugin" .*driverName="topology-aware\.nri\.io" .*numPlugins=(\d+)',
        kubelet,
    )
    assert unregistered, "the old pod's plugin was never unregistered"
    assert all(int(n) >= 1 for n in unregistered), unregistered
    assert _demo_cpus(deployed) == (given, allowed)

    # The new pod prepares and pins as the old one did.
    deployed.kubectl("-n", DEMO_NAMESPACE, "delete", "pod", DEMO_POD, "--wait=true")
    deployed.kubectl("apply", "-k", str(SAMPLES))
    wait_pod_running(deployed.cp, DEMO_NAMESPACE, DEMO_POD, timeout=180)
    given_after, allowed_after = _demo_cpus(deployed)
    assert parse_cpu_list(given_after) == allowed_after
    assert 0 not in allowed_after


# -- the Helm chart -----------------------------------------------------------------------------


def test_helm_chart_takes_over_from_the_manifests(deployed: DeploymentCluster) -> None:
    """`kubectl delete -k manifests/`, then `helm install` of charts/nodedra: the chart's
    nodedra serves the node, and the claim prepared before keeps its CPU (the state on the
    host outlives both)."""
    given, allowed = _demo_cpus(deployed)
    deployed.kubectl("delete", "-k", str(MANIFESTS), "--wait=true", timeout=300)
    poll(lambda: not deployed.nodedra_pods() or None, 120, lambda: "nodedra's pods gone")
    # As charts/nodedra/README.md says: the namespace first, with the Pod Security level
    # hostPath volumes need, then the release in it.
    deployed.kubectl("create", "namespace", NAMESPACE)
    deployed.kubectl(
        "label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged"
    )
    deployed.helm(
        "install",
        "nodedra",
        str(ROOT / "charts" / "nodedra"),
        "--namespace",
        NAMESPACE,
        "--set",
        "namespace.create=false",
        "--set-string",
        "podAnnotations.example\\.com/team=platform",
        "--wait",
        "--timeout=5m",
        timeout=360,
    )
    deployed.rollout_status()
    pod = deployed.wait_single_ready_pod()
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "nodedra"
    assert pod["metadata"]["annotations"]["example.com/team"] == "platform"
    assert resource_slices(deployed.cp, deployed.node.node_name, TOPOLOGY_AWARE)
    assert _demo_cpus(deployed) == (given, allowed)
    listed = json.loads(deployed.helm("list", "--namespace", NAMESPACE, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in listed] == [("nodedra", "deployed")]


#: The node pool the release puts the node in, and the memory its configuration keeps out of
#: claims beside the default's (none).
POOL = "demo"
POOL_LABEL = ("nodedra.example.com/pool", "demo")
POOL_RESERVED_MEMORY = 64 * 1024 * 1024


def _memory_capacities(cluster: DeploymentCluster) -> dict[str, int]:
    """The node's topology-aware devices: name -> the memory they offer, in bytes."""
    return {
        device["name"]: int(parse_quantity(device["capacity"]["memory"]["value"]))
        for s in resource_slices(cluster.cp, cluster.node.node_name, TOPOLOGY_AWARE)
        for device in s["spec"].get("devices") or []
    }


def _desired_pods(cluster: DeploymentCluster, daemonset: str) -> int:
    done = cluster.kubectl("-n", NAMESPACE, "get", "daemonset", daemonset, "-o", "json")
    desired: int = json.loads(done.stdout)["status"]["desiredNumberScheduled"]
    return desired


def test_a_node_pool_takes_its_node_over(deployed: DeploymentCluster) -> None:
    """The node labelled, then `helm upgrade` with a node pool of that label: the pool's
    DaemonSet, not the default one, serves the node with the pool's configuration (its memory
    reserve shows in the published devices), and the claim keeps its CPU."""
    given, allowed = _demo_cpus(deployed)
    (old,) = deployed.nodedra_pods()
    memory_before = _memory_capacities(deployed)
    assert memory_before, "no topology-aware device before the pool"
    key, value = POOL_LABEL
    deployed.kubectl("label", "node", deployed.node.node_name, f"{key}={value}")
    pools = [
        {
            "name": POOL,
            "nodeSelector": {key: value},
            "options": {"reservedMemory": str(POOL_RESERVED_MEMORY)},
        }
    ]
    deployed.helm(
        "upgrade",
        "nodedra",
        str(ROOT / "charts" / "nodedra"),
        "--namespace",
        NAMESPACE,
        "--reuse-values",
        "--set-json",
        f"nodePools={json.dumps(pools)}",
        "--wait",
        "--timeout=5m",
        timeout=360,
    )
    pod = deployed.wait_single_ready_pod()
    assert pod["metadata"]["uid"] != old["metadata"]["uid"]
    assert [(o["kind"], o["name"]) for o in pod["metadata"]["ownerReferences"]] == [
        ("DaemonSet", f"nodedra-{POOL}")
    ]
    assert pod["metadata"]["labels"]["nodedra.nri.io/node-pool"] == POOL
    (config,) = [v for v in pod["spec"]["volumes"] if v["name"] == "config"]
    assert config["configMap"]["name"] == f"nodedra-config-{POOL}"
    # The DaemonSet controller agrees: the default DaemonSet leaves the pool's node alone.
    assert (_desired_pods(deployed, "nodedra"), _desired_pods(deployed, f"nodedra-{POOL}")) == (
        0,
        1,
    )
    memory_after = _memory_capacities(deployed)
    assert memory_after == {
        name: capacity - POOL_RESERVED_MEMORY for name, capacity in memory_before.items()
    }, "the pool's nodedra does not keep the pool's reservedMemory out of its devices"
    assert _demo_cpus(deployed) == (given, allowed)


# -- uninstalling -------------------------------------------------------------------------------

CLEANUP = MANIFESTS / "cleanup"
DRIVERS = (TOPOLOGY_AWARE, "static.nri.io")
FOREIGN_SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "example.com/device",
    "devices": [{"name": "gpu0", "containerEdits": {"env": ["EXAMPLE=1"]}}],
}


def _nodedras_files(cluster: DeploymentCluster) -> list[Path]:
    """What of nodedra's is on the node: its CDI specs, data directories (sockets, locks,
    device metadata), registration sockets, and whatever is in its state directory."""
    node = cluster.node
    found = [
        p
        for directory in (node.cdi_dir, node.registry_dir, node.plugins_dir)
        for p in directory.iterdir()
        if p.name.lstrip(".").startswith(DRIVERS) or p.name.startswith(".nodedra-")
    ]
    return sorted([*found, *node.nodedra_state_dir.iterdir()])


def test_uninstall_leaves_nothing_behind(deployed: DeploymentCluster) -> None:
    """docs/deploying.md, "Uninstalling", on the Helm release: the DaemonSet deleted, the
    cleanup DaemonSet applied, waited for and deleted, `helm uninstall`. No file of
    nodedra's is left on the node (another vendor's CDI spec is), the kubelet drops the
    slices, the claimed container runs on as before, and a new pod runs on every CPU."""
    given, allowed = _demo_cpus(deployed)
    demo_pid = deployed.node.pod_pid(DEMO_NAMESPACE, DEMO_POD, DEMO_CONTAINER)
    foreign = deployed.node.cdi_dir / "example.com-device.json"
    foreign.write_text(json.dumps(FOREIGN_SPEC))
    before = _nodedras_files(deployed)
    specs = [p for p in before if p.parent == deployed.node.cdi_dir]
    assert len(specs) == 1, f"expected the sample claim's CDI spec: {before}"
    assert deployed.node.plugins_dir / TOPOLOGY_AWARE in before, before
    assert any(p.parent == deployed.node.nodedra_state_dir for p in before), before

    # Too early, while nodedra runs: the cleanup refuses, removes nothing, and says why.
    deployed.kubectl("apply", "-k", str(CLEANUP))
    refusal = poll(
        lambda: _cleanup_log(deployed) if "nothing was removed" in _cleanup_log(deployed) else None,
        120,
        lambda: f"the cleanup to refuse: {_cleanup_log(deployed)}",
    )
    assert "nodedra cleanup: nodedra still runs on this node (" in refusal, refusal
    assert "delete its DaemonSet first" in refusal, refusal
    assert _nodedras_files(deployed) == before
    # Its pod too, not only the DaemonSet: a pod left behind would clean up on its own once
    # nodedra is gone, before the page's commands run.
    deployed.kubectl("delete", "-k", str(CLEANUP), "--cascade=foreground", "--wait=true")

    # The page's commands, as an admin copies them: step 3, then the Helm flavour of step 4.
    commands = _uninstall_commands()
    assert [argv[0] for argv in commands] == ["kubectl"] * 5 + ["helm"], commands
    log = ""
    for argv in commands:
        tool = deployed.kubectl if argv[0] == "kubectl" else deployed.helm
        done = tool(*argv[1:], timeout=360)
        if argv[1:3] == ["-n", NAMESPACE] and argv[3] == "delete":
            assert not deployed.nodedra_pods(), "nodedra's pod outlived its DaemonSet's delete"
        if "logs" in argv:
            log = done.stdout + done.stderr

    # Inside the cleanup's pod the CDI directory is at its host path.
    assert f"removed /var/run/cdi/{specs[0].name}\n" in log, log
    assert "removed /var/lib/kubelet/plugins/topology-aware.nri.io\n" in log, log
    assert "removed /host/var/lib/nodedra/checkpoint.slots\n" in log, log
    assert re.search(
        rf"claim {DEMO_NAMESPACE}/{DEMO_POD}-cpus-\w+ is still prepared on this node", log
    ), log
    assert _nodedras_files(deployed) == [], log
    # The test node's /var/lib/nodedra is a bind mount of its working directory, which the
    # cleanup empties but cannot remove; on a real node it is a directory, and goes.
    assert "left /host/var/lib/nodedra: a mount point here" in log, log
    assert json.loads(foreign.read_text()) == FOREIGN_SPEC
    listed = json.loads(deployed.helm("list", "--namespace", NAMESPACE, "-o", "json").stdout)
    assert listed == []
    poll(
        lambda: not resource_slices(deployed.cp, deployed.node.node_name, TOPOLOGY_AWARE) or None,
        120,
        lambda: "the kubelet to delete nodedra's ResourceSlices",
    )

    # The claimed container never stopped and keeps its CPU.
    assert deployed.node.pod_pid(DEMO_NAMESPACE, DEMO_POD, DEMO_CONTAINER) == demo_pid
    assert _demo_cpus(deployed) == (given, allowed)

    # A pod without a claim starts, on every CPU.
    deployed.kubectl("apply", "-f", "-", input=json.dumps(_plain_pod("after-uninstall")))
    wait_pod_running(deployed.cp, DEMO_NAMESPACE, "after-uninstall", timeout=120)
    pid = deployed.node.pod_pid(DEMO_NAMESPACE, "after-uninstall", "main")
    assert parse_cpu_list(proc_status(pid)["Cpus_allowed_list"]) == parse_cpu_list(online_cpus())


def _uninstall_commands() -> list[list[str]]:
    """The commands of docs/deploying.md's "Uninstalling", in order, each split as sh does."""
    blocks = code_blocks(section(DOCS / "deploying.md", "Uninstalling"), "sh")
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.strip()]


def _cleanup_log(cluster: DeploymentCluster) -> str:
    """What the cleanup's init container printed, stdout and stderr ('' before it ran)."""
    done = cluster.kubectl(
        "-n", NAMESPACE, "logs", "daemonset/nodedra-cleanup", "-c", "cleanup", check=False
    )  # fmt: skip
    return done.stdout if done.returncode == 0 else ""


def _plain_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": DEMO_NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {"name": "main", "image": "busybox:1.35.0", "command": ["sleep", "3600"]}
            ],
        },
    }


def test_a_claimed_pod_deleted_after_uninstall_stays_terminating(
    deployed: DeploymentCluster,
) -> None:
    """What the cleanup warned of: with nodedra gone, the kubelet stops the sample's container
    but cannot unprepare its claim, so the pod is never removed; the kubelet says why."""
    offset = deployed.node.log_paths()["kubelet"].stat().st_size
    deployed.kubectl("-n", DEMO_NAMESPACE, "delete", "pod", DEMO_POD, "--wait=false")
    refusal = (
        f'"unprepare dynamic resources: DRA driver {TOPOLOGY_AWARE} is not registered" '
        f'pod="{DEMO_NAMESPACE}/{DEMO_POD}"'
    )
    poll(
        lambda: refusal in _kubelet_log_since(deployed, offset) or None,
        120,
        lambda: f"the kubelet to fail the unprepare: {_kubelet_log_since(deployed, offset)}",
    )
    pod = get_pod(deployed.cp, DEMO_NAMESPACE, DEMO_POD)
    assert pod["metadata"].get("deletionTimestamp"), pod["metadata"]
