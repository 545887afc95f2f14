"""A cluster for deploying nodedra the way an admin does: the DaemonSet pod on a real node.

`DeploymentCluster` is a control plane of its own (the DaemonSet, the admission policy and the
cluster roles are cluster-wide, so they stay out of the shared one) whose API server listens on
the node's address and is the endpoint of the ``kubernetes`` Service, the workload controllers,
and one real node with a pod network and kube-proxy (tests.peers.podnet) and its directories at
the usual host paths (so the DaemonSet's hostPath volumes apply unchanged). The node has the
images an admin's nodes would pull: nodedra's (tests.peers.image) and the samples' busybox
(tests.peers.busybox). The admin's tools are the real ones: `Kubectl` and `Helm` run the
binaries built from the Go module proxy, with an admin kubeconfig.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.peers.build import PeerBinaries
from tests.peers.cluster import poll
from tests.peers.controlplane import ControlPlane
from tests.peers.netns import NODE_ADDRESS
from tests.peers.node import RealNode

#: The objects of manifests/ that the DaemonSet's pods are.
NAMESPACE = "nodedra"
DAEMONSET = "nodedra"
POD_SELECTOR = "app.kubernetes.io/name=nodedra"


class ToolError(RuntimeError):
    """kubectl or helm failed; the message holds the command and what it printed."""


class _Tool:
    """A command-line client of the cluster (kubectl, helm) with the admin's kubeconfig."""

    name = ""

    def __init__(
        self,
        binary: Path,
        kubeconfig: Path,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.cwd = cwd
        self.env = {**os.environ, **(env or {})}

    def __call__(
        self, *args: str, input: str | None = None, timeout: float = 180.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.argv(*args),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.cwd,
            env=self.env,
            check=False,
        )
        if check and done.returncode != 0:
            raise ToolError(
                f"`{self.name} {' '.join(args)}` failed (exit {done.returncode}):\n"
                f"{done.stderr.strip() or done.stdout.strip()}"
            )
        return done

    def argv(self, *args: str) -> list[str]:
        """The command line of ``args`` (for a process the caller runs itself)."""
        return [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]


class Kubectl(_Tool):
    name = "kubectl"


class Helm(_Tool):
    name = "helm"


def nodedra_pods(kubectl: Kubectl, node_name: str) -> list[dict[str, Any]]:
    """The DaemonSet's pods on ``node_name``, oldest first."""
    done = kubectl(
        "-n", NAMESPACE, "get", "pods", "-l", POD_SELECTOR,
        f"--field-selector=spec.nodeName={node_name}", "-o", "json",
    )  # fmt: skip
    pods: list[dict[str, Any]] = json.loads(done.stdout)["items"] if done.stdout else []
    return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])


def rollout_status(kubectl: Kubectl, timeout: float = 180.0) -> str:
    """``kubectl rollout status`` of the DaemonSet: returns once every node runs a ready pod
    of its current template (what an admin waits on)."""
    done = kubectl(
        "-n", NAMESPACE, "rollout", "status", f"daemonset/{DAEMONSET}",
        f"--timeout={int(timeout)}s", timeout=timeout + 30,
    )  # fmt: skip
    return done.stdout


def pod_token(node: RealNode, pod: Mapping[str, Any]) -> str:
    """The ServiceAccount token the kubelet projected into a pod of ``node``: the pod's own
    credentials, read where the kubelet mounted them (in the node's mount namespace)."""
    uid = pod["metadata"]["uid"]
    # The volume is a tmpfs the kubelet mounted below its root directory as it knows it.
    volumes = Path(node.kubelet_root_dir, "pods", uid, "volumes", "kubernetes.io~projected")
    listed = node.namespace.run(["ls", str(volumes)]).stdout.split()
    access = [v for v in listed if v.startswith("kube-api-access-")]
    if len(access) != 1:
        raise LookupError(f"pod {uid}: no single kube-api-access volume in {listed}")
    return node.namespace.run(["cat", str(volumes / access[0] / "token")]).stdout.strip()


class DeploymentCluster:
    """The control plane, workload controllers and one real node (see the module)."""

    def __init__(
        self,
        binaries: PeerBinaries,
        workdir: Path,
        feature_gates: Mapping[str, bool],
        images: Sequence[Path],
        *,
        node_name: str = "deploy-node",
        kubelet_root: str = "/var/lib/kubelet",
        repo: Path,
    ) -> None:
        self.binaries = binaries
        self.workdir = workdir
        self.images = list(images)
        self.cp = ControlPlane(binaries, workdir / "cp", feature_gates, address=NODE_ADDRESS)
        self.node = RealNode(
            binaries,
            self.cp,
            node_name,
            workdir / "node",
            pod_network=True,
            host_layout=True,
            kubelet_root=kubelet_root,
            # The DRA plugin manager logs registrations and slice wipes at V(3).
            kubelet_verbosity=3,
        )
        self.kubectl = Kubectl(binaries.kubectl, self.cp.admin_kubeconfig, cwd=repo)
        # helm keeps its cache, configuration and data in the test's directory.
        helm_home = workdir / "helm"
        self.helm = Helm(
            binaries.helm,
            self.cp.admin_kubeconfig,
            cwd=repo,
            env={
                f"HELM_{kind}_HOME": str(helm_home / kind.lower())
                for kind in ("CACHE", "CONFIG", "DATA")
            },
        )

    def __enter__(self) -> DeploymentCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self.cp.start()
            self.cp.start_workload_controllers()
            self.node.start()
            for archive in self.images:
                self.node.import_image(archive)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        try:
            self.node.stop()
        finally:
            self.cp.stop()

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        tails = {f"deployment {k}": v for k, v in self.cp.log_tails(lines).items()}
        tails.update(self.node.log_tails(lines))
        for pod in self.nodedra_pods():
            name = pod["metadata"]["name"]
            done = self.kubectl(
                "-n", NAMESPACE, "logs", name, f"--tail={lines}", "--all-containers", check=False
            )
            tails[f"nodedra pod {name}"] = done.stdout or done.stderr
        return tails

    # -- nodedra's pods -------------------------------------------------------------------------

    def nodedra_pods(self, node_name: str | None = None) -> list[dict[str, Any]]:
        """nodedra's pods on ``node_name`` (default: the real node), oldest first."""
        return nodedra_pods(self.kubectl, node_name or self.node.node_name)

    def rollout_status(self, timeout: float = 180.0) -> str:
        return rollout_status(self.kubectl, timeout)

    def wait_single_ready_pod(self, timeout: float = 180.0) -> dict[str, Any]:
        """The one nodedra pod once it is the only one and Ready (after a rollout the old
        pod may still be terminating)."""
        seen: list[dict[str, Any]] = []

        def check() -> dict[str, Any] | None:
            nonlocal seen
            seen = self.nodedra_pods()
            if len(seen) != 1:
                return None
            conditions = (seen[0].get("status") or {}).get("conditions") or []
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            return seen[0] if ready else None

        return poll(
            check,
            timeout,
            lambda: (
                "one Ready nodedra pod; pods: "
                + "; ".join(
                    f"{p['metadata']['name']} {(p.get('status') or {}).get('phase')} "
                    f"{(p.get('status') or {}).get('conditions')}"
                    for p in seen
                )
            ),
            0.5,
        )

    def pod_token(self, pod: Mapping[str, Any]) -> str:
        return pod_token(self.node, pod)
