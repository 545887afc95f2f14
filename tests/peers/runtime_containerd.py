"""containerd as a real node's runtime: its CRI plugin with runc, overlayfs, CDI and NRI."""

from __future__ import annotations

import json
from pathlib import Path

from tests.peers.pods import PAUSE_IMAGE
from tests.peers.runtime import NodeRuntime


def toml_value(value: object) -> str:
    """A TOML value for a string, bool, int, duration or list of strings (ASCII only)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


class Containerd(NodeRuntime):
    """containerd of CONTAINERD_VERSIONS, its shim and the peers' runc."""

    kind = "containerd"

    @property
    def directory(self) -> Path:
        return self.setting.workdir / "containerd"

    @property
    def socket(self) -> Path:
        return self.directory / "containerd.sock"

    @property
    def config_path(self) -> Path:
        return self.directory / "config.toml"

    def binary(self, command: str = "containerd") -> Path:
        return self.setting.binaries.containerd(self.version, command)

    def prepare(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        # containerd looks up its shim by its usual name.
        link = self.setting.bin_dir / "containerd-shim-runc-v2"
        link.unlink(missing_ok=True)
        link.symlink_to(self.binary("containerd-shim-runc-v2"))
        self.config_path.write_text(self._config())

    def _argv(self) -> list[str]:
        return [str(self.binary()), "--config", str(self.config_path)]

    def _config(self) -> str:
        """containerd's configuration: every path in the working directory, CRI with runc
        (cgroupfs, a root of its own), overlayfs, the pause image pinned, CDI from cdi_dir and
        NRI on nri_socket."""
        s = self.setting
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        v = toml_value
        return f"""\
version = 3
root = {v(self.directory / "root")}
state = {v(self.directory / "state")}

[grpc]
  address = {v(self.socket)}

[ttrpc]
  address = {v(str(self.socket) + ".ttrpc")}

[debug]
  address = {v(self.directory / "debug.sock")}
  level = {v(s.log_level)}

[metrics]
  address = ''

[plugins.'io.containerd.internal.v1.opt']
  path = {v(self.directory / "opt")}

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'

[{runtime}]
  # Without CAP_SYS_RESOURCE (this machine's sandbox) runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  # Both would write network sysctls.
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  cdi_spec_dirs = {v([str(s.cdi_dir)])}

[{runtime}.containerd]
  default_runtime_name = 'runc'

[{runtime}.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
  runtime_path = {v(s.bin_dir / "containerd-shim-runc-v2")}

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = {v(s.bin_dir / "runc")}
  Root = {v(s.runc_root)}
  SystemdCgroup = false

[{runtime}.cni]
  bin_dirs = {v([str(s.cni_dir / "bin")])}
  conf_dir = {v(s.cni_dir / "net.d")}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = {v(PAUSE_IMAGE)}

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = {v(s.nri_socket)}
  plugin_path = {v(s.workdir / "nri" / "plugins")}
  plugin_config_path = {v(s.workdir / "nri" / "conf.d")}
  plugin_registration_timeout = {v(s.nri_registration_timeout)}
  plugin_request_timeout = {v(s.nri_request_timeout)}
{self._validator() if s.required_plugin else ""}"""

    def _validator(self) -> str:
        """NRI's default validator requiring the required plugin (by its name: the validator
        also accepts ``<index>-<name>``, but the name holds whatever index it runs with)."""
        v = toml_value
        return f"""
[plugins.'io.containerd.nri.v1.nri'.default_validator]
  enable = true
  required_plugins = {v([self.setting.required_plugin])}
  tolerate_missing_plugins_annotation = {v(self.setting.tolerate_annotation)}
"""

    def ctr(self, *args: str, namespace: str = "k8s.io", timeout: float = 60.0) -> str:
        """Run ``ctr`` against this containerd (in the node's mount namespace); its output."""
        argv = [str(self.binary("ctr")), "--address", str(self.socket), "--namespace", namespace]
        return self.setting.namespace.run([*argv, *args], timeout=timeout).stdout

    def _serving(self) -> bool:
        result = self.setting.namespace.run(
            [str(self.binary("ctr")), "--address", str(self.socket), "version"],
            timeout=10,
            check=False,
        )
        return result.returncode == 0 and "Server:" in result.stdout

    def import_image(self, archive: Path, name: str, timeout: float = 600.0) -> None:
        self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive), timeout=timeout)

    def images(self) -> list[str]:
        return self.ctr("images", "list", "--quiet").split()

    def tasks(self) -> dict[str, int]:
        """The running containers: container ID -> PID on the machine (from ``ctr``)."""
        found = {}
        for line in self.ctr("tasks", "list").splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 3 and fields[1].isdigit():
                found[fields[0]] = int(fields[1])
        return found

    def container_pid(self, container_id: str) -> int:
        tasks = self.tasks()
        if container_id not in tasks:
            raise LookupError(f"containerd runs no task {container_id}; tasks: {tasks}")
        return tasks[container_id]
