"""``nodedra gather``: one archive with what a bug report about a node needs.

Run in nodedra's pod, ``kubectl exec -n nodedra <pod> -- nodedra gather >
nodedra-gather.tar.gz`` collects, from that pod's own view: the version, the settings (its
``NODEDRA_*`` environment; none of them holds a secret, and the service account's token is
never read), the policy configuration file, the CPU map with each container's verdict,
``/readyz``, ``/metrics``, ``/healthz``, the topology and the devices each policy publishes,
a summary of the checkpoint, the CDI spec files, and the kubelet-facing and runtime-facing
sockets it can see. Each part is collected on its own: one that fails becomes an entry in
``errors.json`` (and its own ``.error`` file), and the others are still gathered. The pod's
log is not reachable from inside it; ``README.txt`` in the archive says how to add it.
"""

from __future__ import annotations

import io
import json
import os
import platform
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nodedra import __version__, cgroupcheck, cpumap, endpoints, served
from nodedra.settings import DEFAULT_CONFIG

Part = Callable[["Sources"], str | bytes]
"""One part of the archive: its contents, or an exception saying why there are none."""

VARIABLES = ("NODE_NAME", "POD_UID", "KUBECONFIG", "KUBERNETES_SERVICE_HOST")
"""Variables beside ``NODEDRA_*`` that say how the pod runs (none is a secret)."""


@dataclass(frozen=True)
class Sources:
    """Where each part is read from: the pod's environment and files, or a test's."""

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    sysfs: Path = Path("/sys")
    proc: Path = Path("/proc")
    timeout: float = 10.0

    def setting(self, variable: str, default: str) -> str:
        return self.environ.get(variable) or default

    @property
    def config_path(self) -> Path:
        return Path(self.setting("NODEDRA_CONFIG", DEFAULT_CONFIG))

    @property
    def cgroup_root(self) -> Path:
        return cgroupcheck.default_root(self.environ)


def _version(_: Sources) -> str:
    uname = platform.uname()
    return (
        f"nodedra {__version__}\npython {sys.version.split()[0]}\n"
        f"kernel {uname.system} {uname.release} {uname.version} {uname.machine}\n"
    )


def _settings(sources: Sources) -> str:
    shown = {
        name: value
        for name, value in sorted(sources.environ.items())
        if name.startswith("NODEDRA_") or name in VARIABLES
    }
    return json.dumps(shown, indent=2) + "\n"


def _config(sources: Sources) -> bytes:
    return sources.config_path.read_bytes()


def _endpoint(name: str) -> Part:
    def read(sources: Sources) -> bytes:
        answer = served.get_named(name, sources.timeout, sources.environ)
        if name != "readyz" and not answer.ok:  # 503 of /readyz is what it is for
            raise endpoints.EndpointError(f"{answer.url} answered {answer.code}")
        return answer.body

    return read


def _status(sources: Sources) -> str:
    address = served.address_of("status", sources.environ)
    cpu_map = cpumap.fetch(address, sources.timeout)
    return cpumap.render_json(cpumap.check(cpu_map, sources.cgroup_root, sources.proc))


def _topology(sources: Sources) -> str:
    from nodedra.inventory import inventory, render_json  # noqa: PLC0415 (loads the policies)
    from nodedra.policy import PolicyConfig, load_config  # noqa: PLC0415
    from nodedra.topology import read_topology  # noqa: PLC0415

    path = sources.config_path
    config = load_config(str(path)) if path.exists() else PolicyConfig()
    return render_json(inventory(read_topology(str(sources.sysfs)), config)) + "\n"


def _state_dir(sources: Sources) -> Path:
    if "NODEDRA_STATE_DIR" in sources.environ:
        return Path(sources.environ["NODEDRA_STATE_DIR"])
    from nodedra.dra.endpoint import default_plugin_data_dir  # noqa: PLC0415
    from nodedra.dra.names import driver_name  # noqa: PLC0415
    from nodedra.policy import PolicyConfig, load_config  # noqa: PLC0415

    path = sources.config_path
    config = load_config(str(path)) if path.exists() else PolicyConfig()
    return default_plugin_data_dir(driver_name(config.policy))


def _checkpoint(sources: Sources) -> str:
    from nodedra.resmgr.checkpoint import FILE_NAME, Checkpoint  # noqa: PLC0415

    path = _state_dir(sources) / FILE_NAME
    state = Checkpoint(path).load()  # reads only; CheckpointError says what is wrong
    if state is None:
        return json.dumps({"path": str(path), "state": None}, indent=2) + "\n"
    claims = {
        uid: {
            "reservation": state.reservations.get(uid),
            "record": record,
        }
        for uid, record in sorted(state.claims.items())
    }
    summary = {
        "path": str(path),
        "policy": state.policy,
        "driver": state.driver,
        "claims_held": len(state.claims),
        "claims": claims,
    }
    return json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n"


def _listing(directory: Path) -> list[dict[str, Any]]:
    entries = []
    for entry in sorted(directory.iterdir()):
        info = entry.lstat()
        kind = (
            "socket"
            if entry.is_socket()
            else "directory"
            if entry.is_dir()
            else "link"
            if entry.is_symlink()
            else "file"
        )
        entries.append(
            {"name": entry.name, "kind": kind, "size": info.st_size, "mtime": int(info.st_mtime)}
        )
    return entries


def _cdi(sources: Sources) -> str:
    from nodedra.dra.cdi import DEFAULT_CDI_DIR  # noqa: PLC0415

    directory = Path(sources.setting("NODEDRA_CDI_DIR", DEFAULT_CDI_DIR))
    return json.dumps({"directory": str(directory), "specs": _listing(directory)}, indent=2) + "\n"


def _node(sources: Sources) -> str:
    """What the pod can see of the kubelet, the runtime and the kernel."""
    from nodedra.dra.endpoint import KUBELET_PLUGINS_DIR, KUBELET_REGISTRY_DIR  # noqa: PLC0415
    from nodedra.nri import DEFAULT_SOCKET  # noqa: PLC0415

    facts: dict[str, Any] = {}
    for name, directory in (
        ("kubelet_plugin_registry", sources.setting("NODEDRA_REGISTRY_DIR", "")),
        ("kubelet_plugins", sources.setting("NODEDRA_PLUGIN_DIR", "")),
    ):
        default = KUBELET_REGISTRY_DIR if name.endswith("registry") else KUBELET_PLUGINS_DIR
        path = Path(directory) if directory else default
        try:
            facts[name] = {"directory": str(path), "entries": _listing(path)}
        except OSError as err:
            facts[name] = {"directory": str(path), "error": str(err)}
    nri = Path(sources.setting("NODEDRA_NRI_SOCKET", str(DEFAULT_SOCKET)))
    facts["nri_socket"] = {"path": str(nri), "present": nri.is_socket()}
    try:
        version, base = cgroupcheck.hierarchy(sources.cgroup_root)
        facts["cgroups"] = {"root": str(sources.cgroup_root), "version": version, "base": str(base)}
    except cgroupcheck.CgroupError as err:
        facts["cgroups"] = {"root": str(sources.cgroup_root), "error": str(err)}
    for name in ("cmdline", "loadavg", "uptime"):
        try:
            facts[f"proc_{name}"] = (sources.proc / name).read_text().strip()
        except OSError as err:
            facts[f"proc_{name}"] = f"error: {err}"
    return json.dumps(facts, indent=2) + "\n"


README = """\
nodedra gather: what nodedra's pod on one node could see, for a bug report.

Each part is one file; a part that could not be gathered is FILE.error instead, and
errors.json lists them all. Not in here, because the pod cannot read it: its own log.
Add it with
  kubectl logs -n nodedra POD > nodedra.log
  kubectl logs -n nodedra POD --previous > nodedra-previous.log   (after a restart)
"""

PARTS: dict[str, Part] = {
    "version.txt": _version,
    "settings.json": _settings,
    "config.yaml": _config,
    "status.json": _status,
    "readyz.json": _endpoint("readyz"),
    "metrics.txt": _endpoint("metrics"),
    "healthz.txt": _endpoint("healthz"),
    "topology.json": _topology,
    "checkpoint.json": _checkpoint,
    "cdi.json": _cdi,
    "node.json": _node,
}
"""The archive's files, each from its own reader, in this order."""


def collect(sources: Sources, parts: Mapping[str, Part] = PARTS) -> Iterator[tuple[str, bytes]]:
    """Each part's file name and contents; a part that fails gives ``NAME.error``."""
    errors: dict[str, str] = {}
    yield "README.txt", README.encode()
    for name, read in parts.items():
        try:
            body = read(sources)
        except Exception as err:  # any failure of one part is recorded; the rest go on
            errors[name] = f"{type(err).__name__}: {err}"
            yield f"{name}.error", (errors[name] + "\n").encode()
            continue
        yield name, body.encode() if isinstance(body, str) else body
    yield "errors.json", (json.dumps(errors, indent=2, sort_keys=True) + "\n").encode()


def archive(sources: Sources, parts: Mapping[str, Part] = PARTS) -> bytes:
    """The gathered parts as a gzipped tar, under one directory named for node and time."""
    now = time.time()
    node = sources.environ.get("NODE_NAME") or platform.node() or "node"
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    top = f"nodedra-gather-{node}-{stamp}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, body in collect(sources, parts):
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(body), int(now), 0o644
            tar.addfile(info, io.BytesIO(body))
    return buffer.getvalue()
