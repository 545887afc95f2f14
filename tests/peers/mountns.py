"""The mount namespace of a real test node (tests.peers.node): what keeps its files off the
machine.

containerd and the kubelet write a few paths whatever their configuration says
(``/run/containerd/s``, ``/var/log/containers``, ``/var/lib/kubelet/pki``...), and the kubelet
writes six kernel settings at start when they differ from what it wants. So both run in a
mount namespace of their own, in which tmpfs covers ``/run`` and ``/var/lib``, ``/var/log`` is
the node's working directory's ``log/``, and each of those sysctls is a bind-mounted file that
already holds the wanted value: the machine's settings stay as they are. Mounts made for pods
(overlay root filesystems, tmpfs volumes) stay in the namespace too, and the kernel drops them
all when its last process is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.peers.process import PeerProcess, tail

#: What the kubelet sets at start unless it finds these values (kubelet
#: ``pkg/kubelet/cm/container_manager_linux.go setupKernelTunables``); under /proc/sys.
KUBELET_SYSCTLS: Mapping[str, str] = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}

#: Directories the node's mount namespace covers with its own. Nothing shared with processes
#: outside it (sockets, CDI specs, the working directory) may live below them.
PRIVATE_DIRS: tuple[str, ...] = ("/run", "/var/lib", "/var/log")


class MountNamespaceError(RuntimeError):
    """The namespace could not be set up, or a command in it failed; the message says why."""


def _mnt_ns(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/mnt")


class MountNamespace:
    """A mount namespace for the node's daemons, held open by a sleeping process.

    containerd and the kubelet must share one (the kubelet mounts pod volumes that runc, started
    by containerd, bind into containers), and either may be restarted while the other runs, so
    neither can own it: a process that only sleeps does, and the daemons enter it with
    ``nsenter``. It is set up as the module says: private propagation, tmpfs over
    ``/run`` and ``/var/lib``, ``/var/log`` from the working directory, and the sysctl files the
    kubelet would write replaced by files of our own.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.log_path = workdir / "mount-namespace.log"
        self._holder: PeerProcess | None = None
        self.ns = ""
        """The namespace's name as /proc shows it, ``mnt:[inode]``, once started."""

    def start(self, sysctls: Mapping[str, str] = KUBELET_SYSCTLS) -> None:
        for tool in ("unshare", "nsenter", "mount", "sleep"):
            if shutil.which(tool) is None:
                raise MountNamespaceError(
                    f"`{tool}` (util-linux/coreutils) is needed to run a real node"
                )
        own = _mnt_ns("self")
        self._holder = PeerProcess(
            "mount-namespace",
            ["unshare", "--mount", "--propagation", "private", "--", "sleep", "infinity"],
            self.log_path,
        )
        pid = self._holder.pid

        def entered() -> bool:
            return _mnt_ns(pid) != own

        self._holder.wait_until(entered, 10, "a mount namespace of its own")
        self.ns = _mnt_ns(pid)
        log = self.workdir / "log"
        log.mkdir(exist_ok=True)
        self.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "nodedra-run", "/run"])
        self.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "nodedra-var-lib", "/var/lib"])
        self.run(["mount", "--bind", str(log), "/var/log"])
        fakes = self.workdir / "sysctl"
        fakes.mkdir(exist_ok=True)
        for name, value in sysctls.items():
            fake = fakes / name.replace("/", ".")
            fake.write_text(value + "\n")
            self.run(["mount", "--bind", str(fake), f"/proc/sys/{name}"])

    @property
    def pid(self) -> int:
        if self._holder is None:
            raise MountNamespaceError("the node's mount namespace is not set up")
        return self._holder.pid

    def enter(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (nsenter execs it: same PID)."""
        return ["nsenter", f"--mount=/proc/{self.pid}/ns/mnt", "--", *argv]

    def run(
        self, argv: Sequence[str], timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace; with ``check``, fail with its output."""
        result = subprocess.run(
            self.enter(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise MountNamespaceError(
                f"`{' '.join(argv)}` in the node's mount namespace failed (exit "
                f"{result.returncode}): {(result.stderr or result.stdout).strip()}"
            )
        return result

    def processes(self) -> list[int]:
        """Every process of the machine in this namespace (the holder included)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == self.ns:
                    found.append(int(entry.name))
        return found

    def stop(self, timeout: float = 30.0) -> list[int]:
        """Kill every process left in the namespace, its holder last, so that the kernel
        drops the namespace and every mount in it; returns processes that would not go."""
        if not self.ns:
            return []
        deadline = time.monotonic() + timeout
        holder = self._holder.pid if self._holder is not None else None
        while True:
            others = [p for p in self.processes() if p != holder]
            if not others or time.monotonic() > deadline:
                break
            for pid in others:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        if self._holder is not None:
            self._holder.stop(grace=5)
            self._holder = None
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.processes()

    def tail(self, lines: int = 40) -> str:
        return tail(self.log_path, lines)
