"""The container runtime of a real node (tests.peers.node): what every runtime does for it.

A node runs one runtime, containerd (`tests.peers.runtime_containerd`) or CRI-O
(`tests.peers.runtime_crio`), chosen by name: ``containerd-v2.4.2``, ``cri-o-v1.36.3`` (one of
`NODE_RUNTIMES`). Both run in the node's mount namespace with every path in its working
directory, serve the kubelet's CRI on a socket there, run containers with the peers' runc
under the node's cgroup root (cgroupfs), read CDI specs from the node's CDI directory and
serve NRI on its NRI socket.
"""

from __future__ import annotations

import abc
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.peers.build import PeerBinaries
from tests.peers.mountns import MountNamespace
from tests.peers.peer_groups import CONTAINERD_VERSIONS, CRIO_VERSION
from tests.peers.process import PeerProcess, PeerProcessError

#: Every runtime a real node can run, by name: the first is the default.
NODE_RUNTIMES: tuple[str, ...] = (
    *(f"containerd-{v}" for v in CONTAINERD_VERSIONS),
    f"cri-o-{CRIO_VERSION}",
)


class NodeRuntimeError(RuntimeError):
    """The runtime failed to start or to do what was asked; the message says what."""


@dataclass(frozen=True)
class RuntimeSetting:
    """What a node tells its runtime: where things are and how NRI behaves."""

    binaries: PeerBinaries
    workdir: Path
    bin_dir: Path
    """Where the node links the programs its daemons look up by name (runc, ...)."""
    runc_root: Path
    cni_dir: Path
    """With ``bin`` (plugins) and ``net.d`` (configuration) below it."""
    cdi_dir: Path
    nri_socket: Path
    nri_registration_timeout: str
    nri_request_timeout: str
    log_level: str
    required_plugin: str | None
    """An NRI plugin without which the runtime refuses to create containers (NRI's default
    validator), unless the pod carries `tolerate_annotation`."""
    tolerate_annotation: str
    namespace: MountNamespace
    env: Mapping[str, str]


class NodeRuntime(abc.ABC):
    """One runtime of a node: configure, start, stop, import images, find containers."""

    kind: str
    """``containerd`` or ``cri-o``: what the kubelet reports as the runtime's name, before
    ``://``."""
    hidden: tuple[str, ...] = ()
    """Directories of the machine the node's mount namespace shows empty, for this runtime."""

    def __init__(self, setting: RuntimeSetting, version: str) -> None:
        self.setting = setting
        self.version = version
        self.process: PeerProcess | None = None

    @property
    def name(self) -> str:
        """The runtime's name as NODE_RUNTIMES spells it."""
        return f"{self.kind}-{self.version}"

    @property
    @abc.abstractmethod
    def socket(self) -> Path:
        """The CRI socket the kubelet talks to."""

    @property
    def log_path(self) -> Path:
        return self.setting.workdir / f"{self.kind}.log"

    @abc.abstractmethod
    def prepare(self) -> None:
        """Write the configuration and make the directories (before the mount namespace)."""

    @abc.abstractmethod
    def _argv(self) -> list[str]:
        """The daemon's command line."""

    @abc.abstractmethod
    def _serving(self) -> bool:
        """Whether the daemon answers on its socket."""

    def _env(self) -> dict[str, str]:
        """The daemon's environment: the node's."""
        return dict(self.setting.env)

    def start(self, timeout: float = 60.0) -> None:
        """Start the daemon in the node's mount namespace; return once it serves CRI and
        NRI (plugins, nodedra among them, may connect from then on)."""
        if self.process is not None:
            raise NodeRuntimeError(f"{self.kind} is running")
        self.process = PeerProcess(
            f"{self.kind} {self.version}",
            self.setting.namespace.enter(self._argv()),
            self.log_path,
            env=self._env(),
        )
        try:
            self.process.wait_until(self._serving, timeout, "its API serves")
            self.process.wait_until(self.setting.nri_socket.is_socket, timeout, "NRI socket")
        except PeerProcessError as err:
            self.stop()
            raise NodeRuntimeError(str(err)) from None

    def stop(self) -> None:
        """Stop the daemon alone; containers go on running (with their shims or conmons)."""
        if self.process is not None:
            self.process.stop()
            self.process = None

    def restart(self, timeout: float = 60.0) -> None:
        self.stop()
        self.start(timeout)

    @abc.abstractmethod
    def import_image(self, archive: Path, name: str, timeout: float = 600.0) -> None:
        """Put an OCI image archive into the runtime's store as ``name``, as a pull would."""

    @abc.abstractmethod
    def images(self) -> list[str]:
        """The names of the images in the runtime's store."""

    @abc.abstractmethod
    def container_pid(self, container_id: str) -> int:
        """The PID on the machine of a running container's first process."""

    def kill_container(self, container_id: str) -> None:
        """Kill a container's process (SIGKILL), as if it had crashed."""
        os.kill(self.container_pid(container_id), signal.SIGKILL)
