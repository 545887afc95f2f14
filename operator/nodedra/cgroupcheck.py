"""Where a container really runs, read from its cgroup: the cpuset the kernel applies.

``nodedra status`` runs in nodedra's pod (``kubectl exec``), which has no host PID namespace:
the containers' processes are not in its ``/proc``. Their cgroups are in the host's cgroup
filesystem, which the DaemonSet mounts read-only (``NODEDRA_CGROUP_ROOT``, default
``/sys/fs/cgroup``: right on the host itself). The runtime names each container's cgroup in
its NRI events (``linux.cgroups_path``), which ``/status`` passes on; this module finds that
cgroup under the root and reads the CPUs and memory nodes the kernel lets it use:
``cpuset.cpus.effective`` and ``cpuset.mems.effective`` on cgroup v2,
``cpuset.effective_cpus`` and ``cpuset.effective_mems`` in v1's cpuset hierarchy. Those are
what the container's processes get, whatever the runtime was asked.

A cgroup path comes in two forms: a path below the hierarchy's root (the cgroupfs driver:
``/kubepods/burstable/pod<uid>/<id>``), or systemd's ``slice:prefix:name``
(``kubepods-burstable-pod<uid>.slice:cri-containerd:<id>``), which systemd turns into
``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodedra.topology.cpulist import parse_cpu_list

ROOT_VARIABLE = "NODEDRA_CGROUP_ROOT"
"""Where the host's cgroup filesystem is (the DaemonSet mounts it at /host/sys/fs/cgroup)."""
DEFAULT_ROOT = "/sys/fs/cgroup"
MATCH, MISMATCH, NOT_CHECKED = "match", "mismatch", "not checked"

_FILES = {
    "v2": ("cpuset.cpus.effective", "cpuset.mems.effective"),
    "v1": ("cpuset.effective_cpus", "cpuset.effective_mems"),
}


class CgroupError(Exception):
    """A container's cgroup cannot be read; the message says which and why."""


@dataclass(frozen=True)
class Cpuset:
    """What the kernel applies to one cgroup."""

    path: Path
    """The cgroup's directory (under the root)."""
    cpus: str
    mems: str


def default_root(environ: Mapping[str, str] = os.environ) -> Path:
    """``$NODEDRA_CGROUP_ROOT``, else ``/sys/fs/cgroup``."""
    return Path(environ.get(ROOT_VARIABLE) or DEFAULT_ROOT)


def hierarchy(root: Path) -> tuple[str, Path]:
    """The cgroup version at ``root`` and the directory its cpusets are under.

    v1 (and hybrid hosts, whose cpuset controller is v1) has a ``cpuset`` hierarchy of its
    own; v2 has ``cgroup.controllers`` at the top.
    """
    if (root / "cpuset" / "cpuset.cpus").is_file():
        return "v1", root / "cpuset"
    if (root / "cgroup.controllers").is_file():
        return "v2", root
    raise CgroupError(
        f"{root} holds neither cgroup v2 (no cgroup.controllers) nor a cgroup v1 cpuset "
        f"hierarchy (no cpuset/cpuset.cpus): mount the host's /sys/fs/cgroup there and set "
        f"{ROOT_VARIABLE} to it"
    )


def relative_path(cgroups_path: str) -> str:
    """The directory of the cgroup ``cgroups_path`` names, relative to the hierarchy's root."""
    if not cgroups_path:
        raise CgroupError("the runtime did not say which cgroup the container is in")
    if ":" in cgroups_path:
        parts = cgroups_path.split(":")
        if len(parts) != 3 or not parts[0].endswith(".slice") or not parts[2]:
            raise CgroupError(
                f"cgroup {cgroups_path!r} is neither a path nor systemd's slice:prefix:name"
            )
        slice_, prefix, name = parts
        unit = name if name.endswith(".slice") or not prefix else f"{prefix}-{name}.scope"
        relative = f"{expand_slice(slice_)}/{unit}".lstrip("/")
    else:
        relative = cgroups_path.strip("/")
    if ".." in relative.split("/"):
        raise CgroupError(f"cgroup {cgroups_path!r} climbs out of the hierarchy")
    return relative


def expand_slice(slice_: str) -> str:
    """systemd's path of a slice: ``a-b-c.slice`` is ``a.slice/a-b.slice/a-b-c.slice``."""
    if slice_ == "-.slice":
        return ""
    name = slice_.removesuffix(".slice")
    if not name or "/" in name or name.startswith("-") or name.endswith("-") or "--" in name:
        raise CgroupError(f"{slice_!r} is not a systemd slice name")
    words = name.split("-")
    return "/".join("-".join(words[: i + 1]) + ".slice" for i in range(len(words)))


def read_cpuset(root: Path, cgroups_path: str) -> Cpuset:
    """The cpuset the kernel applies to the cgroup ``cgroups_path`` under ``root``."""
    version, base = hierarchy(root)
    directory = base / relative_path(cgroups_path)
    if not directory.is_dir():
        raise CgroupError(f"cgroup {cgroups_path!r} not found: no {directory}")
    values = []
    for name in _FILES[version]:
        try:
            values.append((directory / name).read_text().strip())
        except OSError as err:
            raise CgroupError(f"cannot read {directory / name}: {err.strerror}") from None
    return Cpuset(directory, values[0], values[1])


def verdict(container: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """Whether ``container`` (of ``/status``) runs where nodedra says, by its cgroup.

    ``match`` when the cgroup's effective CPUs are the container's (and its memory nodes,
    where nodedra sets them); CgroupError when the cgroup cannot be read.
    """
    cpuset = read_cpuset(root, container.get("cgroup") or "")
    try:
        cpus, mems = parse_cpu_list(cpuset.cpus), parse_cpu_list(cpuset.mems)
    except ValueError as err:
        raise CgroupError(f"{cpuset.path}: not a cpu list: {err}") from None
    ok = cpus == parse_cpu_list(container["cpus"]) and (
        not container["mems"] or mems == parse_cpu_list(container["mems"])
    )
    return {
        "source": "cgroup",
        "where": str(cpuset.path),
        "pid": None,
        "cpus": cpuset.cpus,
        "mems": cpuset.mems,
        "check": MATCH if ok else MISMATCH,
    }
