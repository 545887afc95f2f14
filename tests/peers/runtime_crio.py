"""CRI-O as a real node's runtime: with conmon, the peers' runc, overlay storage, CDI and NRI.

CRI-O (built from its Go module, with ``pinns`` from its C sources, tests.peers.build) runs
with every path in the node's working directory and none of the machine's ``/etc``
(``--config-dir`` empty, the registries and storage configuration given by environment). It
has no way to import an image archive, so ``crio-import`` (tests/peers/crio) copies each into
its store, in the node's mount namespace (the store's overlay driver mounts there).

What differs on this machine: the node's mount namespace hides the huge page sizes (see
`CRIO.hidden`); and this sandbox lacks CAP_SYS_RESOURCE, so runc cannot lower a process's
``oom_score_adj`` (containerd has ``restrict_oom_score_adj`` for that, CRI-O has not):
``drop_infra_ctr`` (CRI-O's default) starts no pause process, which CRI-O gives -998, for
pods that share no PID namespace, and the tests' pods are BestEffort or Burstable (a
Guaranteed pod's containers get -997).
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
from pathlib import Path
from typing import Any

from tests.peers.pods import PAUSE_IMAGE
from tests.peers.runtime import NodeRuntime, NodeRuntimeError
from tests.peers.runtime_containerd import toml_value

#: Where conmon comes from (Debian's package, installed with the crio peer).
CONMON = "/usr/bin/conmon"

#: Image names without a registry are looked up at docker.io, as on most nodes.
REGISTRIES_CONF = 'unqualified-search-registries = ["docker.io"]\n'

#: The node's images are written by the tests themselves: no signature to check.
SIGNATURE_POLICY = {"default": [{"type": "insecureAcceptAnything"}]}


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (CRI-O serves its inspection API on its CRI socket)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self._path))
        self.sock = sock


class CRIO(NodeRuntime):
    """CRI-O of CRIO_VERSION, conmon and the peers' runc."""

    kind = "cri-o"
    # This machine's kernel has the hugetlb controller (/proc/cgroups lists it) but no
    # hierarchy of it is mounted. The kubelet gives every container a limit of 0 for each
    # huge page size it finds here; CRI-O passes them on wherever the kernel has the
    # controller, and runc then fails every container (containerd drops them where no
    # hierarchy is mounted). A node without huge page sizes asks for no such limits.
    hidden = ("/sys/kernel/mm/hugepages",)

    @property
    def directory(self) -> Path:
        return self.setting.workdir / "crio"

    @property
    def socket(self) -> Path:
        return self.directory / "crio.sock"

    @property
    def config_path(self) -> Path:
        return self.directory / "crio.conf"

    @property
    def storage_root(self) -> Path:
        return self.directory / "storage"

    @property
    def storage_runroot(self) -> Path:
        return self.directory / "storage-run"

    def prepare(self) -> None:
        if shutil.which(CONMON) is None:
            raise NodeRuntimeError(
                f"CRI-O needs conmon at {CONMON} (Debian's package conmon; the peers' build "
                "installs it with the crio peer)"
            )
        for directory in ("conf.d", "hooks.d", "policies", "auth", "exits", "attach", "ns"):
            (self.directory / directory).mkdir(parents=True, exist_ok=True)
        (self.directory / "registries.conf").write_text(REGISTRIES_CONF)
        (self.directory / "policy.json").write_text(json.dumps(SIGNATURE_POLICY))
        # CRI-O's defaults before its own configuration: instead of the machine's
        # /etc/containers/storage.conf, the store crio.conf names too.
        (self.directory / "storage.conf").write_text(
            "[storage]\n"
            'driver = "overlay"\n'
            f"graphroot = {toml_value(self.storage_root)}\n"
            f"runroot = {toml_value(self.storage_runroot)}\n"
        )
        self.config_path.write_text(self._config())

    def _env(self) -> dict[str, str]:
        return {
            **self.setting.env,
            "CONTAINERS_REGISTRIES_CONF": str(self.directory / "registries.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.directory / "storage.conf"),
        }

    def _argv(self) -> list[str]:
        return [
            str(self.setting.binaries["crio"]),
            "--config",
            str(self.config_path),
            "--config-dir",
            str(self.directory / "conf.d"),
        ]

    def _config(self) -> str:
        """CRI-O's configuration: every path in the working directory, runc with cgroupfs
        under conmon, overlay storage, CDI from cdi_dir and NRI on nri_socket."""
        s = self.setting
        d = self.directory
        v = toml_value
        validator = ""
        if s.required_plugin:
            validator = f"""
[crio.nri.default_validator]
nri_enable_default_validator = true
nri_validator_required_plugins = {v([s.required_plugin])}
nri_validator_tolerate_missing_plugins_annotation = {v(s.tolerate_annotation)}
"""
        return f"""\
[crio]
root = {v(self.storage_root)}
runroot = {v(self.storage_runroot)}
storage_driver = "overlay"
log_dir = {v(s.workdir / "log" / "crio-pods")}
version_file = {v(d / "version")}
version_file_persist = {v(d / "version-persist")}
clean_shutdown_file = {v(d / "clean.shutdown")}

[crio.api]
listen = {v(self.socket)}
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
log_level = {v(s.log_level)}
pinns_path = {v(s.binaries["pinns"])}
namespaces_dir = {v(d / "ns")}
container_exits_dir = {v(d / "exits")}
container_attach_socket_dir = {v(d / "attach")}
cdi_spec_dirs = {v([str(s.cdi_dir)])}
hooks_dir = {v([str(d / "hooks.d")])}
drop_infra_ctr = true
disable_hostport_mapping = true
irqbalance_config_file = ""
irqbalance_config_restore_file = "disable"
decryption_keys_path = {v(d / "keys")}

[crio.runtime.runtimes.runc]
runtime_path = {v(s.bin_dir / "runc")}
runtime_root = {v(s.runc_root)}
runtime_type = "oci"
monitor_path = {v(CONMON)}
monitor_cgroup = "pod"

[crio.image]
pause_image = {v(PAUSE_IMAGE)}
signature_policy = {v(d / "policy.json")}
signature_policy_dir = {v(d / "policies")}
namespaced_auth_dir = {v(d / "auth")}

[crio.network]
network_dir = {v(s.cni_dir / "net.d")}
plugin_dirs = {v([str(s.cni_dir / "bin")])}

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = true
nri_listen = {v(s.nri_socket)}
nri_plugin_dir = {v(s.workdir / "nri" / "plugins")}
nri_plugin_config_dir = {v(s.workdir / "nri" / "conf.d")}
nri_plugin_registration_timeout = {v(s.nri_registration_timeout)}
nri_plugin_request_timeout = {v(s.nri_request_timeout)}
{validator}"""

    def inspect(self, path: str, timeout: float = 10.0) -> Any:
        """GET ``path`` of CRI-O's inspection API (``/info``, ``/containers/<id>``)."""
        connection = _UnixHTTPConnection(self.socket, timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise NodeRuntimeError(f"CRI-O answered {path} with {response.status}: {body!r}")
        return json.loads(body)

    def _serving(self) -> bool:
        try:
            self.inspect("/info", timeout=2)
        except (OSError, NodeRuntimeError, ValueError):
            return False
        return True

    def _import(self, *args: str, timeout: float = 600.0) -> str:
        argv = [
            str(self.setting.binaries["crio-import"]),
            "--root",
            str(self.storage_root),
            "--runroot",
            str(self.storage_runroot),
            *args,
        ]
        return self.setting.namespace.run(argv, timeout=timeout).stdout

    def import_image(self, archive: Path, name: str, timeout: float = 600.0) -> None:
        self._import(str(archive), name, timeout=timeout)

    def images(self) -> list[str]:
        return self._import("--list").split()

    def container_pid(self, container_id: str) -> int:
        try:
            info = self.inspect(f"/containers/{container_id}")
        except NodeRuntimeError as err:
            raise LookupError(f"CRI-O knows no container {container_id}: {err}") from None
        pid = int(info.get("pid") or 0)
        if pid <= 0:
            raise LookupError(f"CRI-O's container {container_id} runs no process: {info}")
        return pid
