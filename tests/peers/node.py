"""A real Kubernetes node on this machine: the kubelet, a container runtime and runc.

`RealNode` registers a Node with the test control plane and runs its pods for real: the
kubelet (built from the same k8s.io/kubernetes module as the control plane:
tests.peers.node_kubelet), a runtime (containerd or CRI-O, built from the Go module proxy, one
of `NODE_RUNTIMES`: tests.peers.runtime) and runc. What keeps it from changing the machine:

* **Files and kernel settings**: every path of the node lives under one working directory,
  and the runtime and the kubelet run in a mount namespace of their own
  (`tests.peers.mountns`) that catches what they write elsewhere (``/run``, ``/var/lib``,
  ``/var/log``) and the six sysctls the kubelet would set; the mounts of pods stay in it.
* **cgroups**: pods go below a cgroup root of the node's own in every hierarchy (`CgroupRoot`),
  which `stop` empties (SIGKILL) and removes.
* **Network**: pods use the host network, and the host is the test run's private network
  namespace (`tests.peers.netns`), where the node's address lives on ``lo``. The CNI
  configuration is a loopback-only list: enough for the runtime to report its network ready
  (so the node becomes Ready); no CNI plugin ever runs. With ``pod_network``, pods get a
  network of their own and kube-proxy runs (`tests.peers.podnet`), still in that namespace.
* **Host paths**: with ``host_layout``, the node's mount namespace shows its directories at
  the paths a real node has them (``/var/lib/kubelet``, ``/var/run/cdi``, ``/var/run/nri``,
  ``/var/lib/nodedra``), so that a DaemonSet's hostPath volumes written for a real node
  work unchanged; they are bind mounts of the working directory's, which tests read.

Other processes (nodedra, tests) work with the node through what it exposes: the kubelet's
plugin registry and plugin directories, the CDI directory the runtime reads, the NRI socket it
serves, its CRI socket, and the pods' logs through the API server.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from nodedra.nri.plugin import PLUGIN_NAME
from tests.peers.build import PeerBinaries
from tests.peers.cgroups import node_cgroup_root, remove_stale_cgroup_roots
from tests.peers.controlplane import ControlPlane
from tests.peers.mountns import PRIVATE_DIRS, MountNamespace
from tests.peers.netns import NODE_ADDRESS
from tests.peers.node_kubelet import KubeletError, NodeKubelet
from tests.peers.oci import archive_image, write_image_archive
from tests.peers.podnet import KubeProxy, install_cni
from tests.peers.pods import (
    WORKLOAD_CONTAINER,
    container_id,
    node_image_specs,
    pod_log,
)
from tests.peers.process import tail
from tests.peers.runtime import NODE_RUNTIMES, NodeRuntime, NodeRuntimeError, RuntimeSetting
from tests.peers.runtime_containerd import Containerd
from tests.peers.runtime_crio import CRIO

#: The only CNI configuration of the node: a runtime with a valid network list reports its
#: network ready; hostNetwork pods never call a plugin, so none is installed.
CNI_CONFLIST: Mapping[str, Any] = {
    "cniVersion": "1.0.0",
    "name": "nodedra-loopback",
    "plugins": [{"type": "loopback"}],
}

TOLERATE_MISSING_PLUGINS_ANNOTATION = "tolerate-missing-nri-plugins.noderesource.dev"
"""The annotation key a node started with ``require_nodedra`` lets a pod (or, with
``/container.<name>``, one container) be created without nodedra: NRI's default validator
takes whatever key the runtime's configuration names; this one is NRI's documented example, and
nodedra's own DaemonSet carries it (manifests/daemonset.yaml)."""


class NodeError(RuntimeError):
    """The node failed to start, or left something behind; the message says what."""


class RealNode:
    """One Kubernetes node of the test cluster, with the kubelet, a runtime and runc.

    ``start()`` prepares the cgroups and the mount namespace, starts the runtime (``runtime``,
    one of NODE_RUNTIMES), imports the pause and workload images, starts the kubelet and
    waits until the Node is Ready and schedulable; ``stop()`` kills every pod container and
    daemon of the node, removes its cgroups, drops its mounts and deletes the Node object, and
    raises NodeError if anything was left behind. The runtime and the kubelet can each be
    stopped and started again while pods run (``restart_runtime``, ``restart_kubelet``).

    ``workdir`` must be short (Unix socket paths live below it) and must not be below
    PRIVATE_DIRS. ``cdi_dir`` is where the runtime reads CDI specs (nodedra writes them there),
    ``nri_socket`` where it serves NRI; both default to paths in ``workdir``.
    ``kubelet_config`` is merged over the node's KubeletConfiguration (top-level keys).
    ``require_nodedra`` turns on NRI's default validator in the runtime with nodedra as a
    required plugin (docs/pinning.md, "Holding containers while nodedra is down"): while
    nodedra is not connected, the runtime refuses to create a container unless its pod carries
    TOLERATE_MISSING_PLUGINS_ANNOTATION.
    """

    def __init__(
        self,
        binaries: PeerBinaries,
        cp: ControlPlane,
        node_name: str,
        workdir: Path | None = None,
        *,
        runtime: str = NODE_RUNTIMES[0],
        node_ip: str = NODE_ADDRESS,
        cdi_dir: Path | None = None,
        nri_socket: Path | None = None,
        nri_registration_timeout: str = "5s",
        nri_request_timeout: str = "2s",
        feature_gates: Mapping[str, bool] | None = None,
        kubelet_config: Mapping[str, Any] | None = None,
        kubelet_verbosity: int = 2,
        runtime_log_level: str = "info",
        pod_network: bool = False,
        host_layout: bool = False,
        kubelet_root: str = "/var/lib/kubelet",
        require_nodedra: bool = False,
    ) -> None:
        if runtime not in NODE_RUNTIMES:
            raise ValueError(f"no runtime {runtime} is built; choose from {NODE_RUNTIMES}")
        self.binaries = binaries
        self.cp = cp
        self.node_name = node_name
        self.workdir = (
            workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="nodedra-node-"))
        ).resolve()
        self.node_ip = node_ip
        self.cdi_dir = (cdi_dir or self.workdir / "cdi").resolve()
        self.nri_socket = (nri_socket or self.workdir / "nri" / "nri.sock").resolve()
        self.nri_registration_timeout = nri_registration_timeout
        self.nri_request_timeout = nri_request_timeout
        self.feature_gates = dict(cp.feature_gates if feature_gates is None else feature_gates)
        self.pod_network = pod_network
        self.host_layout = host_layout
        self.kubelet_root = kubelet_root
        """With ``host_layout``: the kubelet's --root-dir in its namespace (k0s: another)."""
        self.require_nodedra = require_nodedra
        for path in (self.workdir, self.cdi_dir, self.nri_socket):
            for private in PRIVATE_DIRS:
                if path.is_relative_to(private):
                    raise ValueError(
                        f"{path} is below {private}, which the node's mount namespace hides "
                        "from processes outside it; choose a path elsewhere"
                    )
        self.cgroups = node_cgroup_root()
        self.namespace = MountNamespace(self.workdir)

        self.bin_dir = self.workdir / "bin"
        self.runc_root = self.workdir / "runc"
        self.cni_dir = self.workdir / "cni"
        self.images_dir = self.workdir / "images"
        self.root_dir = self.workdir / "kubelet"
        """The kubelet's root directory (a real node's /var/lib/kubelet), as the machine sees
        it; the kubelet itself knows it as `kubelet_root_dir`."""
        self.cert_dir = self.root_dir / "pki"
        self.pod_logs_dir = self.workdir / "log" / "pods"
        self.nodedra_state_dir = self.workdir / "nodedra-state"
        """With ``host_layout``: the node's /var/lib/nodedra (the DaemonSet's state volume)."""

        setting = RuntimeSetting(
            binaries=binaries,
            workdir=self.workdir,
            bin_dir=self.bin_dir,
            runc_root=self.runc_root,
            cni_dir=self.cni_dir,
            cdi_dir=self.cdi_dir,
            nri_socket=self.nri_socket,
            nri_registration_timeout=nri_registration_timeout,
            nri_request_timeout=nri_request_timeout,
            log_level=runtime_log_level,
            required_plugin=PLUGIN_NAME if require_nodedra else None,
            tolerate_annotation=TOLERATE_MISSING_PLUGINS_ANNOTATION,
            namespace=self.namespace,
            env=self._daemon_env(),
        )
        kind, version = runtime.rsplit("-", 1)
        self.runtime: NodeRuntime = (CRIO if kind == "cri-o" else Containerd)(setting, version)
        self.kubelet = NodeKubelet(
            binaries,
            cp,
            node_name,
            node_ip,
            self.workdir,
            root_dir=self.kubelet_root_dir,
            cert_dir=self.cert_dir,
            pod_logs_dir=self.pod_logs_dir,
            namespace=self.namespace,
            env=self._daemon_env,
            feature_gates=self.feature_gates,
            config_overrides=kubelet_config or {},
            verbosity=kubelet_verbosity,
        )
        self.kube_proxy: KubeProxy | None = None
        self.images: dict[str, str] = {}
        """Images imported into the node: name -> manifest digest."""
        self._started = False

    # -- what the node exposes --------------------------------------------------------------

    @property
    def registry_dir(self) -> Path:
        """Where DRA drivers (nodedra) register with the kubelet: its plugins_registry."""
        return self.root_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        """The kubelet's plugins directory, below which drivers put their DRA sockets."""
        return self.root_dir / "plugins"

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's PodResources API."""
        return self.root_dir / "pod-resources" / "kubelet.sock"

    @property
    def kubelet_root_dir(self) -> str:
        """The kubelet's --root-dir: with ``host_layout`` `kubelet_root` (/var/lib/kubelet) in
        its namespace, as on a real node (the paths of plugin sockets below it then fit a
        socket address, and the mounts of pod volumes are only seen there)."""
        return self.kubelet_root if self.host_layout else str(self.root_dir)

    def host_paths(self) -> dict[str, Path]:
        """With ``host_layout``: what the node's usual paths show -> the working directory's
        directory they are (empty without it)."""
        if not self.host_layout:
            return {}
        return {
            self.kubelet_root: self.root_dir,
            # /var/run is a link to /run; the namespace's /run is a tmpfs of its own.
            "/run/cdi": self.cdi_dir,
            "/run/nri": self.nri_socket.parent,
            "/var/lib/nodedra": self.nodedra_state_dir,
        }

    def log_paths(self) -> dict[str, Path]:
        return {
            self.runtime.kind: self.runtime.log_path,
            "kubelet": self.kubelet.log_path,
            "mount-namespace": self.namespace.log_path,
            "kube-proxy": self.workdir / "kube-proxy.log",
        }

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        """The last log lines of the runtime and the kubelet (for failure reports)."""
        return {
            f"{name} of node {self.node_name} ({path})": tail(path, lines)
            for name, path in self.log_paths().items()
            if path.exists()
        }

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> RealNode:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = 180.0) -> None:
        """Bring the whole node up; on any failure, tear down what was started and raise."""
        if self._started:
            raise NodeError(f"node {self.node_name} is already started")
        self._started = True
        try:
            self._prepare()
            self.start_runtime(timeout)
            self.import_images()
            self.start_kubelet(timeout)
            self.wait_ready(timeout)
            if self.pod_network:
                self.kube_proxy = KubeProxy(
                    self.binaries,
                    self.cp,
                    self.node_name,
                    self.workdir,
                    env=self._daemon_env(),
                    argv_prefix=self.namespace.enter([]),
                )
                self.kube_proxy.start(timeout)
        except BaseException as err:
            try:
                self.stop()
            except NodeError as cleanup:
                raise cleanup from err
            raise

    def _prepare(self) -> None:
        for directory in (
            self.bin_dir,
            self.runc_root,
            self.cni_dir / "net.d",
            self.cni_dir / "bin",
            self.images_dir,
            self.cdi_dir,
            self.nri_socket.parent,
            self.workdir / "nri" / "plugins",
            self.workdir / "nri" / "conf.d",
            self.registry_dir,
            self.plugins_dir,
            self.cert_dir,
            self.pod_logs_dir,
            *self.host_paths().values(),
        ):
            directory.mkdir(parents=True, exist_ok=True)
        # The runtimes look up runc by its usual name.
        link = self.bin_dir / "runc"
        link.unlink(missing_ok=True)
        link.symlink_to(self.binaries.runc)
        if self.pod_network:
            install_cni(self.binaries, self.cni_dir / "bin", self.cni_dir / "net.d")
        else:
            # CRI-O takes a network list only where its plugins are installed.
            loopback = self.cni_dir / "bin" / "loopback"
            loopback.unlink(missing_ok=True)
            loopback.symlink_to(self.binaries["loopback"])
            (self.cni_dir / "net.d" / "10-loopback.conflist").write_text(json.dumps(CNI_CONFLIST))
        self.runtime.prepare()
        self.kubelet.write_files(self.runtime.socket, self.cgroups.path)
        for stale in remove_stale_cgroup_roots():
            print(f"[node] removed the empty cgroup root of a test run that is gone: {stale}")
        self.cgroups.create()
        self.namespace.start()
        for hidden in self.runtime.hidden:
            self.namespace.run(["mount", "-t", "tmpfs", "-o", "ro", "nodedra-hidden", hidden])
        for shown, directory in self.host_paths().items():
            self.namespace.run(["mkdir", "-p", shown])
            self.namespace.run(["mount", "--bind", str(directory), shown])

    def stop(self, delete_node: bool = True) -> None:
        """Stop everything of the node and check that nothing is left; idempotent.

        Order matters: the kubelet first (it would restart what is killed next), then every
        process in the node's cgroups (the pods' containers), then the runtime, then whatever
        still lives in the mount namespace (the shims or conmons), and the namespace itself.
        """
        problems: list[str] = []
        if self.kube_proxy is not None:
            self.kube_proxy.stop()
            self.kube_proxy = None
        self.stop_kubelet()
        stubborn = self.cgroups.kill_all()
        if stubborn:
            problems.append(f"processes in the node's cgroups would not die: {sorted(stubborn)}")
        self.runtime.stop()
        left = self.namespace.stop()
        if left:
            problems.append(f"processes left in the node's mount namespace: {left}")
        cgroups = self.cgroups.remove()
        if cgroups:
            problems.append(f"cgroups that could not be removed: {[str(c) for c in cgroups]}")
        mounts = self.host_mounts()
        if mounts:
            problems.append(f"mounts below {self.workdir} visible on the machine: {mounts}")
        if delete_node and self._started:
            try:
                self.cp.delete_if_present(f"/api/v1/nodes/{self.node_name}")
            except (OSError, RuntimeError) as err:
                problems.append(f"deleting Node {self.node_name} failed: {err}")
        self._started = False
        if problems:
            raise NodeError(f"node {self.node_name} left things behind: " + "; ".join(problems))

    def host_mounts(self) -> list[str]:
        """Mount points below the working directory that the machine (this process) sees:
        there should be none, the node's mounts stay in its namespace."""
        points = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if Path(point).is_relative_to(self.workdir):
                points.append(point)
        return points

    # -- the runtime ------------------------------------------------------------------------------

    def _daemon_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.bin_dir}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return env

    def ctr(self, *args: str, namespace: str = "k8s.io", timeout: float = 60.0) -> str:
        """Run ``ctr`` against the node's containerd (in its mount namespace); its output."""
        if not isinstance(self.runtime, Containerd):
            raise NodeError(f"node {self.node_name} runs {self.runtime.name}, not containerd")
        return self.runtime.ctr(*args, namespace=namespace, timeout=timeout)

    def start_runtime(self, timeout: float = 60.0) -> None:
        """Start the runtime in the node's mount namespace and wait until it serves."""
        try:
            self.runtime.start(timeout)
        except NodeRuntimeError as err:
            raise NodeError(str(err)) from None

    def stop_runtime(self) -> None:
        """Stop the runtime alone; containers go on running."""
        self.runtime.stop()

    def restart_runtime(self, timeout: float = 60.0) -> None:
        self.stop_runtime()
        self.start_runtime(timeout)

    def import_images(self) -> None:
        """Import the pause and workload images (OCI archives written from the peer build)."""
        for spec in node_image_specs(self.binaries):
            archive = self.images_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name) + ".tar")
            digest = write_image_archive(spec, archive)
            self.runtime.import_image(archive, spec.name)
            self.images[spec.name] = digest
        listed = self.runtime.images()
        missing = [name for name in self.images if name not in listed]
        if missing:
            raise NodeError(
                f"{self.runtime.kind} does not list the imported images {missing}: {listed}"
            )

    def import_image(self, archive: Path, timeout: float = 600.0) -> str:
        """Import an OCI image archive (tests.peers.oci's, such as nodedra's image of
        tests.peers.image, or buildah's of tests.peers.dockerfile_image) into the node's
        runtime, as if the node had pulled it; returns the image's name, as ``ctr images
        import`` names it (`tests.peers.oci.archive_image`)."""
        try:
            name, digest = archive_image(archive)
        except (OSError, tarfile.TarError, KeyError, IndexError, ValueError) as err:
            raise NodeError(
                f"{archive} is not an OCI image archive with a named image: {err}"
            ) from err
        self.runtime.import_image(archive, name, timeout=timeout)
        listed = self.runtime.images()
        if name not in listed:
            raise NodeError(
                f"{self.runtime.kind} does not list {name} after importing {archive}: {listed}"
            )
        self.images[name] = digest
        return name

    def container_pid(self, container_id: str) -> int:
        """The PID on the machine of a container's first process."""
        return self.runtime.container_pid(container_id)

    def pod_log(self, namespace: str, name: str, container: str | None = None) -> str:
        """A container's log, read as any client would: through the API server."""
        return pod_log(self.cp, namespace, name, container)

    def pod_pid(self, namespace: str, name: str, container: str = WORKLOAD_CONTAINER) -> int:
        """The PID on the machine of a running container of pod ``namespace/name``."""
        pod = self.cp.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return self.container_pid(container_id(pod, container))

    # -- the kubelet ------------------------------------------------------------------------------

    def start_kubelet(self, timeout: float = 120.0) -> None:
        """Start the kubelet in the node's mount namespace and wait for its /healthz."""
        try:
            self.kubelet.start(timeout)
        except KubeletError as err:
            raise NodeError(str(err)) from None

    def stop_kubelet(self) -> None:
        """Stop the kubelet alone; pods go on running."""
        self.kubelet.stop()

    def restart_kubelet(self, timeout: float = 120.0) -> None:
        """Stop the kubelet and start it again; return once it serves again and knows every
        running pod of the node (a kubelet that just started answers for a pod, e.g. for its
        log, only once it has synced it)."""
        self.stop_kubelet()
        self.start_kubelet(timeout)
        self.wait_pods_synced(timeout)

    def kubelet_pods(self) -> list[dict[str, Any]]:
        """The pods the kubelet knows (`NodeKubelet.pods`)."""
        return self.kubelet.pods()

    def wait_pods_synced(self, timeout: float = 120.0) -> None:
        """Wait until the kubelet knows every pod the API server has bound to the node and
        not finished."""
        self.kubelet.wait_pods_synced(timeout)

    def node(self) -> dict[str, Any]:
        """The Node object."""
        return self.kubelet.node()

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until the kubelet reports the Node Ready, then lift the not-ready taint as the
        node-lifecycle controller would; returns the Node."""
        try:
            return self.kubelet.wait_ready(timeout)
        except KubeletError as err:
            raise NodeError(str(err)) from None
