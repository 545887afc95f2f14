"""Python side of the Go reference DRA driver (tests/peers/cmd/go-driver).

The Go driver is built on the official kubelet plugin helper, so it is a
known-good DRA kubelet plugin: tests use it to check the harness and the
control plane without nodedra, and benchmarks compare nodedra against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tests.peers.process import PeerProcess

DEFAULT_DRIVER_NAME = "go.nodedra.test"


@dataclass(frozen=True)
class NUMAPlacement:
    """Where the driver's devices lie: device i in NUMA node ``nodes[i % len(nodes)]`` of the
    machine of ``sysfs``, its ``resource.kubernetes.io/numaNode`` in ``form`` (scalar, list)
    as the official helper makes it."""

    nodes: tuple[int, ...]
    sysfs: Path
    form: str = "scalar"


class GoDriver:
    """One Go driver process for node `node_name`.

    `registry_dir` must be the kubelet's plugin registration directory
    (KubeletHarness.registry_dir); the DRA socket lives in `workdir/plugin`,
    CDI specs go to `cdi_dir`.
    """

    def __init__(
        self,
        binary: Path,
        kubeconfig: Path,
        node_name: str,
        registry_dir: Path,
        workdir: Path,
        *,
        driver_name: str = DEFAULT_DRIVER_NAME,
        devices: int = 4,
        cdi_dir: Path | None = None,
        services: tuple[str, ...] = ("v1", "v1beta1"),
        verbosity: int = 4,
        numa: NUMAPlacement | None = None,
    ) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.node_name = node_name
        self.registry_dir = registry_dir
        self.workdir = workdir
        self.driver_name = driver_name
        self.devices = devices
        self.plugin_dir = workdir / "plugin"
        self.cdi_dir = cdi_dir if cdi_dir is not None else workdir / "cdi"
        self.log_path = workdir / "go-driver.log"
        #: DRA node service versions the driver serves and advertises.
        self.services = services
        self.verbosity = verbosity
        self.numa = numa
        self._process: PeerProcess | None = None

    @property
    def endpoint(self) -> Path:
        """The DRA service socket the driver tells the kubelet about."""
        return self.plugin_dir / "dra.sock"

    def spec_path(self, claim_uid: str) -> Path:
        """Where the driver writes the CDI spec of a prepared claim."""
        return self.cdi_dir / f"{self.driver_name}-device_{claim_uid}.yaml"

    def __enter__(self) -> GoDriver:
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
        """Start the driver; it registers with the kubelet by itself (wait
        for that with KubeletHarness.wait_registered)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--node-name={self.node_name}",
            f"--driver-name={self.driver_name}",
            f"--registry-dir={self.registry_dir}",
            f"--plugin-dir={self.plugin_dir}",
            f"--cdi-dir={self.cdi_dir}",
            f"--devices={self.devices}",
            f"--node-v1={'true' if 'v1' in self.services else 'false'}",
            f"--node-v1beta1={'true' if 'v1beta1' in self.services else 'false'}",
            f"--v={self.verbosity}",
        ]
        if self.numa is not None:
            argv += [
                f"--numa-nodes={','.join(map(str, self.numa.nodes))}",
                f"--numa-form={self.numa.form}",
                f"--sysfs={self.numa.sysfs}",
            ]
        self._process = PeerProcess("go-driver", argv, self.log_path)

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def alive(self) -> bool:
        return self._process is not None and self._process.alive()

    def log_tail(self, lines: int = 40) -> str:
        return self._process.tail(lines) if self._process is not None else ""
