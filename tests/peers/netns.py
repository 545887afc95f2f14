"""A private network namespace for a whole test run, so that no test traffic touches the VM's.

A real kubelet refuses a loopback node address, and the API server reaches the kubelet (for
pod logs) at the address the node reports. Giving the node the machine's own interface address
would put test traffic on the machine's network. Instead, once the peers are built (building
needs the network), the test process moves itself into a network namespace of its own, in
which only ``lo`` exists: up, with 127.0.0.1 as everywhere and the node address
(:data:`NODE_ADDRESS`) added to it. Every peer started afterwards (control plane, kubelet,
containerd, containers of hostNetwork pods, nodedra) inherits that namespace, so they all reach
each other on 127.0.0.1 and the node address, and nothing of it is seen outside. The namespace
goes away with the last process in it.

Namespaces belong to threads: ``unshare(CLONE_NEWNET)`` moves only the calling thread, and new
threads and processes inherit from their creator. So the process must still be
single-threaded when it enters (this is checked): otherwise an older thread would open its
sockets in the machine's namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

CLONE_NEWNET = 0x40000000

#: The address of test nodes, on ``lo`` in the private namespace (an address of TEST-NET-like
#: private space that no machine here uses).
NODE_ADDRESS = "10.250.0.1"


class NetworkNamespaceError(RuntimeError):
    """The process could not enter a private network namespace; the message says why."""


_entered: str | None = None


def _current() -> str:
    return os.readlink("/proc/self/ns/net")


def in_private_network() -> bool:
    """Whether this process entered its private network namespace (and is still in it)."""
    return _entered is not None and _entered == _current()


def _threads() -> list[str]:
    names = []
    for task in sorted(Path("/proc/self/task").iterdir()):
        try:
            names.append(f"{task.name} ({(task / 'comm').read_text().strip()})")
        except OSError:
            names.append(task.name)
    return names


def _ip(*args: str) -> str:
    ip = shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.access(p, os.X_OK)), None
    )
    if ip is None:
        raise NetworkNamespaceError(
            "the `ip` command (iproute2) is needed to set up the private network namespace; "
            "install it (Debian: apt-get install iproute2)"
        )
    result = subprocess.run([ip, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetworkNamespaceError(
            f"`ip {' '.join(args)}` failed in the private network namespace "
            f"(exit {result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout


def enter_private_network(addresses: Sequence[str] = (NODE_ADDRESS,)) -> str:
    """Move this process into a new network namespace with ``lo`` up and ``addresses`` on it.

    Idempotent: a second call in the same process only checks that it is still there. Returns
    the namespace's name as /proc shows it (``net:[inode]``). On failure the process stays in
    the namespace it was in, and NetworkNamespaceError says why.
    """
    global _entered  # noqa: PLW0603 - one process, one namespace: module state is the truth
    if _entered is not None:
        if _entered != _current():
            raise NetworkNamespaceError(
                f"this process entered {_entered} but is now in {_current()}"
            )
        return _entered
    threads = _threads()
    if len(threads) != 1:
        raise NetworkNamespaceError(
            "cannot move a multi-threaded process into a private network namespace (only the "
            f"calling thread would move); threads: {', '.join(threads)}. Enter it before "
            "starting threads."
        )
    libc = ctypes.CDLL(None, use_errno=True)
    original = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            hint = (
                " (it needs CAP_SYS_ADMIN: run the tests as root)"
                if code in (errno.EPERM, errno.EACCES)
                else ""
            )
            raise NetworkNamespaceError(f"unshare(CLONE_NEWNET) failed: {os.strerror(code)}{hint}")
        try:
            _ip("link", "set", "lo", "up")
            for address in addresses:
                _ip("addr", "add", f"{address}/32", "dev", "lo")
        except BaseException:
            # Back to where we came from: a namespace without a working lo helps nobody.
            if libc.setns(original, CLONE_NEWNET) != 0:
                code = ctypes.get_errno()
                raise NetworkNamespaceError(
                    f"setting up the private network namespace failed, and so did returning to "
                    f"the original one: {os.strerror(code)}"
                ) from None
            raise
    finally:
        with contextlib.suppress(OSError):
            os.close(original)
    _entered = _current()
    return _entered


def add_loopback_address(address: str) -> None:
    """Put ``address`` on the private namespace's ``lo`` too (idempotent): a VM node's
    address, which QEMU forwards to the guest's kubelet so that the API server reaches it.
    Connections to it leave from 127.0.0.1 (the local route's preferred source), not from
    the address itself: QEMU's user network would hand the guest a connection from the
    guest's own address, which the guest drops; from 127.0.0.1 it comes from the gateway."""
    if _entered is None or _entered != _current():
        raise NetworkNamespaceError("add_loopback_address: not in the private network namespace")
    if f" {address}/32 " not in _ip("-o", "addr", "show", "dev", "lo"):
        _ip("addr", "add", f"{address}/32", "dev", "lo")
    _ip(
        "route", "replace", "local", address, "dev", "lo", "table", "local",
        "proto", "kernel", "scope", "host", "src", "127.0.0.1",
    )  # fmt: skip
