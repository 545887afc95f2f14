"""A private cgroup root for one test node, in every cgroup hierarchy, and its removal.

The node's kubelet gets ``cgroupRoot: /<name>`` and puts every pod (and runc every container)
below it, so the node's containers never mix with the machine's own cgroups, and at the end
everything the node made is found, and killed and removed, by walking that one subtree.

This machine uses cgroup v1 (a hierarchy per controller, plus ``name=systemd`` and an empty
unified tree in which runc also creates directories). The root must exist in each v1
hierarchy before the kubelet starts, and in the cpuset hierarchy it needs ``cpuset.cpus`` and
``cpuset.mems`` (a cpuset without them takes no task: ENOSPC) and ``cgroup.clone_children``
(so that the cgroups the kubelet and runc create below inherit them).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: its controllers (v1) and where it is mounted."""

    mount: Path
    controllers: frozenset[str]
    version: int

    @property
    def key(self) -> str:
        return ",".join(sorted(self.controllers)) if self.version == 1 else "unified"


def hierarchies(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Hierarchy]:
    """The cgroup hierarchies mounted in this mount namespace (each once, at its first mount
    with the hierarchy's root)."""
    found: dict[str, Hierarchy] = {}
    for line in mountinfo.read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3 or fields[3] != "/":
            continue
        fstype, options = tail[0], tail[2].split(",")
        if fstype == "cgroup":
            known = {"rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec"}
            controllers = frozenset(o for o in options if o not in known and "=" not in o) | {
                o for o in options if o.startswith("name=")
            }
            hierarchy = Hierarchy(Path(fields[4]), frozenset(controllers), 1)
        elif fstype == "cgroup2":
            hierarchy = Hierarchy(Path(fields[4]), frozenset(), 2)
        else:
            continue
        found.setdefault(hierarchy.key, hierarchy)
    return list(found.values())


def cgroup_path(pid: int, controller: str = "cpuset") -> str:
    """The cgroup of process ``pid`` in ``controller``'s v1 hierarchy (or the unified one's
    path, for ``controller=""``), as the machine sees it."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if controller == "" and number == "0" and controllers == "":
            return path
        if controller and controller in controllers.split(","):
            return path
    raise LookupError(f"process {pid} is in no {controller or 'unified'} cgroup")


def hierarchy_of(controller: str) -> Hierarchy:
    """The mounted v1 hierarchy of ``controller``."""
    for hierarchy in hierarchies():
        if controller in hierarchy.controllers:
            return hierarchy
    raise LookupError(f"no cgroup v1 hierarchy with the {controller} controller is mounted")


class CgroupRoot:
    """``/<name>`` in every cgroup hierarchy of the machine."""

    def __init__(self, name: str) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
            raise ValueError(f"not a plain cgroup name: {name!r}")
        self.name = name
        self.path = "/" + name
        """What the kubelet's cgroupRoot is set to."""

    def directories(self) -> list[Path]:
        """The root's directory in each hierarchy, present or not."""
        return [h.mount / self.name for h in hierarchies()]

    def create(self) -> None:
        """Create the root in every v1 hierarchy, ready for the kubelet."""
        try:
            for hierarchy in hierarchies():
                if hierarchy.version != 1:
                    continue  # runc makes what it needs in the unified tree
                directory = hierarchy.mount / self.name
                directory.mkdir(exist_ok=True)
                if "cpuset" in hierarchy.controllers:
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        (directory / name).write_text((hierarchy.mount / name).read_text())
                    (directory / "cgroup.clone_children").write_text("1")
        except BaseException:
            self.remove(timeout=5)
            raise

    def _walk(self) -> Iterator[Path]:
        """Every cgroup below (and including) the root in every hierarchy, deepest first."""
        for top in self.directories():
            if not top.is_dir():
                continue
            for dirpath, _dirnames, _files in os.walk(top, topdown=False):
                yield Path(dirpath)

    def pids(self) -> set[int]:
        """Every process in the root's subtree, in any hierarchy."""
        found: set[int] = set()
        for directory in self._walk():
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return found

    def kill_all(self, timeout: float = 30.0) -> set[int]:
        """SIGKILL every process in the subtree until none is left (thawing frozen cgroups
        first, or the kill would wait for a thaw); returns the processes that would not die."""
        deadline = time.monotonic() + timeout
        while True:
            for directory in self._walk():
                state = directory / "freezer.state"
                if state.exists():
                    with contextlib.suppress(OSError):
                        state.write_text("THAWED")
            pids = self.pids()
            if not pids or time.monotonic() > deadline:
                return pids
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def remove(self, timeout: float = 30.0) -> list[Path]:
        """Remove every cgroup of the subtree, deepest first, retrying while the kernel still
        counts exiting processes; returns the directories that remain."""
        deadline = time.monotonic() + timeout
        while True:
            left: list[Path] = []
            for directory in self._walk():
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as err:
                    if err.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                        raise
                    left.append(directory)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)


def node_cgroup_root() -> CgroupRoot:
    """A fresh cgroup root for a test node, named after this test process."""
    return CgroupRoot(f"nodedra-node-{os.getpid()}-{secrets.token_hex(4)}")


#: How the nodes' cgroup roots are named (`node_cgroup_root`): the test process's PID tells
#: a stale one.
_NODE_ROOT = re.compile(r"nodedra-node-(\d+)-[0-9a-f]{8}")


def remove_stale_cgroup_roots() -> list[str]:
    """Remove the cgroup roots of nodes whose test process is gone (killed before it could
    clean up), if no process is left in them; returns their names. Roots that still hold
    processes are left alone: they are not ours to kill."""
    names = {
        d.name
        for h in hierarchies()
        if h.mount.is_dir()
        for d in h.mount.iterdir()
        if d.is_dir() and _NODE_ROOT.fullmatch(d.name)
    }
    removed = []
    for name in sorted(names):
        match = _NODE_ROOT.fullmatch(name)
        assert match is not None
        try:
            os.kill(int(match.group(1)), 0)
            continue  # its test process still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        root = CgroupRoot(name)
        if not root.pids() and not root.remove(timeout=1):
            removed.append(name)
    return removed
