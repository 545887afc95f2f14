"""``nodedra cleanup``: remove every file nodedra wrote on a node, once nodedra is gone from it.

Uninstalling the DaemonSet stops nodedra but leaves its files on the host: the checkpoint and
its note in the state directory, the CDI specs of prepared claims, their device metadata, the
lock files and any socket a killed instance could not remove. This module finds exactly those
(by the names nodedra gives them, never by a pattern another vendor's file could match),
removes them and says which. It never removes anything while nodedra still runs on the node:
a running instance would go on writing into a state it no longer has on disk.

The host's work that ``quietCPUs`` narrowed (its record in the state directory) is given
back first, where the cleanup can write the host's files (``--irq-dir``, ``--workqueue-dir``);
where it cannot, the record is left and named: the sources stay narrowed until the next boot.

What stays untouched: running containers. Their CPUs are in their cgroups already, and a
runtime reads a CDI spec only when it creates a container; the metadata files are bind-mounted
into them, and a removed file stays readable through the mount.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from nodedra.dra.cdi import DEFAULT_CDI_DIR
from nodedra.dra.endpoint import KUBELET_PLUGINS_DIR, KUBELET_REGISTRY_DIR, SERIALIZE_LOCK
from nodedra.dra.names import CDI_CLASS, driver_name
from nodedra.lib.locks import held_elsewhere
from nodedra.policy import POLICIES
from nodedra.quiet import IRQBALANCE_DIR, RECORD, SYSTEM_BUS, host_work, read_boot_id
from nodedra.quiet.keeper import BOOT_ID, read_record
from nodedra.resmgr.checkpoint import FILE_NAME, LEGACY_NAME, Checkpoint, CheckpointError
from nodedra.resmgr.ledger import reservations_of
from nodedra.resmgr.nrirole import NRI_ROLE_LOCK
from nodedra.topology.cpulist import parse_cpu_list

OURS = (FILE_NAME, LEGACY_NAME, RECORD)
"""The state directory's files of nodedra's: the checkpoint, its note, the quiet CPUs' record."""
ONLINE = Path("/sys/devices/system/cpu/online")
"""The host's online CPUs (sysfs is the host's in a container too)."""
DEFAULT_STATE_DIR = Path("/var/lib/nodedra")
"""The state directory of the manifests and the chart (NODEDRA_STATE_DIR)."""

RUNTIME_FIRST = (
    "before nodedra is uninstalled, a container runtime that requires it must stop requiring "
    "it: on containerd, take 'nodedra' out of the NRI default validator's required_plugins "
    "(CRI-O: nri_validator_required_plugins) and restart the runtime; a node that requires "
    "nodedra and has none creates no container without the "
    "tolerate-missing-nri-plugins.noderesource.dev annotation"
)
"""What the admin must do first; the cleanup cannot see the runtime's configuration."""


class StillRunningError(RuntimeError):
    """nodedra still runs on the node: nothing was removed."""


@dataclass(frozen=True)
class NodePaths:
    """Where nodedra writes on a node: the defaults of the manifests and the chart."""

    registry_dir: Path = KUBELET_REGISTRY_DIR
    plugins_dir: Path = KUBELET_PLUGINS_DIR
    """The kubelet's plugins directory: each driver's data directory is in it."""
    cdi_dir: Path = Path(DEFAULT_CDI_DIR)
    state_dir: Path = DEFAULT_STATE_DIR
    drivers: tuple[str, ...] = tuple(driver_name(policy) for policy in POLICIES)
    irq_dir: Path = Path("/proc/irq")
    workqueue_dir: Path = Path("/sys/devices/virtual/workqueue")
    system_bus: Path = SYSTEM_BUS
    irqbalance_dir: Path = IRQBALANCE_DIR
    boot_id: Path = BOOT_ID

    def data_dirs(self) -> list[Path]:
        """Each driver's data directory: sockets, locks, device metadata (all nodedra's)."""
        return [self.plugins_dir / driver for driver in self.drivers]


@dataclass
class Report:
    """What a cleanup removed, and what it found in nodedra's places but left as not ours."""

    removed: list[Path] = field(default_factory=list)
    left: list[Path] = field(default_factory=list)
    not_given_back: list[str] = field(default_factory=list)
    """Sources of the host's work still narrowed, and why (their record is left)."""


def still_running(paths: NodePaths) -> str | None:
    """Why nodedra looks alive on this node (a socket answers, a lock is held), or None.

    nodedra removes its sockets when it stops, so a socket that is left and answers is a
    live instance; one that refuses is a killed instance's leftover. The locks are held by a
    live instance only (an instance that stands by holds no ``nri.lock``, but serves its DRA
    socket).
    """
    for path in _our_sockets(paths):
        if _answers(path):
            return f"{path} answers"
    for directory in paths.data_dirs():
        for name in (NRI_ROLE_LOCK, SERIALIZE_LOCK):
            lock = directory / name
            if lock.is_file() and held_elsewhere(lock):
                return f"{lock} is locked by a running process"
    return None


def prepared_claims(state_dir: Path) -> list[str]:
    """The claims the checkpoint still holds, as ``namespace/name``; CheckpointError if bad.

    Their containers run on, but the kubelet cannot unprepare them without nodedra: a pod of
    one that is deleted afterwards stays Terminating (`test_deploy.py` shows it), which the
    admin had better hear before than find later.
    """
    if not (state_dir / FILE_NAME).exists() and not (state_dir / LEGACY_NAME).exists():
        return []
    state = Checkpoint(state_dir / FILE_NAME).load()
    if state is None:
        return []
    reservations = reservations_of(state)
    return sorted(
        f"{reservations[uid].namespace}/{reservations[uid].name}"
        if uid in reservations
        else f"with UID {uid}"
        for uid in state.claims
    )


def ours(paths: NodePaths) -> tuple[list[Path], list[Path]]:
    """nodedra's files on this node, in the order to remove them; and what is left.

    Left are the foreign files found in the state directory, and then the directory too,
    which is removed only once empty; and the directory if it is a mount point (a volume
    of that very directory, or a bind mount of it on the host).
    """
    found: list[Path] = []
    found += _cdi_files(paths)
    for directory in paths.data_dirs():
        found += _tree(directory)
    found += [p for p in _our_sockets(paths) if p.parent == paths.registry_dir]
    state, foreign = _state_files(paths.state_dir)
    found += state
    return list(dict.fromkeys(found)), foreign  # a state dir inside a data dir: once


def cleanup(paths: NodePaths, on_removed: Callable[[Path], None] = lambda _: None) -> Report:
    """Remove nodedra's files from this node; StillRunningError if it still runs here.

    Idempotent: what is gone already is skipped, so a cleanup cut short is finished by the
    next. ``on_removed`` is called after each removal, so that what was removed is said even
    when a later removal fails (the OSError is raised, naming the path).
    """
    reason = still_running(paths)
    if reason is not None:
        raise StillRunningError(
            f"nodedra still runs on this node ({reason}); nothing was removed: delete its "
            "DaemonSet first (kubectl -n nodedra delete daemonset nodedra) and wait for its "
            "pod to be gone"
        )
    not_given_back = give_back_quiet(paths)
    found, foreign = ours(paths)
    report = Report(left=foreign, not_given_back=not_given_back)
    if not_given_back:
        record = paths.state_dir / RECORD
        found = [p for p in found if p not in (record, paths.state_dir)]
        report.left.append(record)
    for path in found:
        if _remove(path):
            report.removed.append(path)
            on_removed(path)
    return report


def give_back_quiet(paths: NodePaths) -> list[str]:
    """Give the host's work narrowed by ``quietCPUs`` its CPUs back; what could not be.

    A record of another boot names nothing narrowed: the boot gave the kernel its defaults.
    """
    record = paths.state_dir / RECORD
    if not record.exists():
        return []
    originals = read_record(record, read_boot_id(paths.boot_id))
    work = host_work(
        online_cpus(), paths.irq_dir, paths.workqueue_dir, paths.system_bus, paths.irqbalance_dir
    )
    try:
        refused = work.restore(originals)
    except (OSError, ValueError) as err:
        return [f"{paths.irq_dir}, {paths.workqueue_dir}: {err}"]
    finally:
        work.close()
    return [f"{work.describe(source)}: {why}" for source, why in refused.items()]


def online_cpus(online: Path = ONLINE) -> frozenset[int]:
    """The host's online CPUs, to which a slice given back is widened first (none if unreadable)."""
    try:
        return parse_cpu_list(online.read_text().strip())
    except (OSError, ValueError):
        return frozenset()


def _remove(path: Path) -> bool:
    """Remove a file or an (emptied) directory; whether it was there."""
    try:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    except FileNotFoundError:
        return False
    except OSError as err:
        raise OSError(err.errno, f"cannot remove {path}: {err.strerror}") from None
    return True


def _cdi_files(paths: NodePaths) -> list[Path]:
    """Our CDI specs (``<driver>-device_<uid>.yaml``) and their temporary files."""
    prefixes = [f"{driver}-{CDI_CLASS}_" for driver in paths.drivers]
    names = _names(paths.cdi_dir)
    return [
        paths.cdi_dir / name
        for name in names
        for prefix in prefixes
        if (name.startswith(prefix) and name.endswith(".yaml"))
        or (name.startswith("." + prefix) and name.endswith(".tmp"))
    ]


def _our_sockets(paths: NodePaths) -> list[Path]:
    """Our sockets in the registry and in our data directories.

    In the registry: ``<driver>-reg.sock``, ``<driver>-<pod uid>-reg.sock`` and the sockets
    a start leaves half made (``.nodedra-<hex>.sock``). A pod UID is hex digits and dashes,
    so another driver whose name starts with ours (``<driver>.example.com``) is not matched.
    """
    registration = re.compile(
        "|".join(rf"{re.escape(d)}(-[0-9a-fA-F-]+)?-reg\.sock" for d in paths.drivers)
    )
    half_made = re.compile(r"\.nodedra-[0-9a-f]+\.sock")
    found = [
        paths.registry_dir / name
        for name in _names(paths.registry_dir)
        if registration.fullmatch(name) or half_made.fullmatch(name)
    ]
    for directory in paths.data_dirs():
        found += [directory / name for name in _names(directory) if name.endswith(".sock")]
    return found


def _state_files(state_dir: Path) -> tuple[list[Path], list[Path]]:
    """The checkpoint, its note and their temporary files, then the directory itself.

    The directory goes only if nothing else is in it; the other files are returned apart,
    to be left and named.
    """
    names = _names(state_dir)
    if not names and not state_dir.is_dir():
        return [], []
    temporary = re.compile("|".join(rf"\.{re.escape(n)}\..+\.tmp" for n in OURS))
    mine = [n for n in names if n in OURS or temporary.fullmatch(n)]
    foreign = [state_dir / n for n in names if n not in mine]
    found = [state_dir / n for n in mine]
    if os.path.ismount(state_dir):  # cannot be removed: said as left, with why
        foreign.append(state_dir)
    elif not foreign:
        found.append(state_dir)
    return found, foreign


def _tree(directory: Path) -> list[Path]:
    """Everything under ``directory``, deepest first, then ``directory`` itself."""
    if not directory.is_dir():
        return []
    found: list[Path] = []
    for root, dirs, files in os.walk(directory, topdown=False):
        base = Path(root)
        found += [base / name for name in sorted(files)]
        found += [base / name for name in sorted(dirs)]
    found.append(directory)
    return found


def _names(directory: Path) -> list[str]:
    """The names in ``directory``, sorted; none if it does not exist."""
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def _answers(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(2.0)
        try:
            conn.connect(os.fspath(path))
        except OSError:
            return False
    return True


def command(paths: NodePaths, out: TextIO, err: TextIO) -> int:
    """``nodedra cleanup``'s output and exit status: what was removed, one path a line.

    The runtime step comes first, on every run: nothing on the node says whether the runtime
    still requires nodedra (its configuration is not mounted here), and forgetting it stops
    every new container on the node.
    """
    print(f"nodedra cleanup: {RUNTIME_FIRST}", file=err)
    try:
        if still_running(paths) is None:  # else the refusal below says why
            _warn_of_prepared_claims(paths.state_dir, err)
        report = cleanup(paths, lambda path: print(f"removed {path}", file=out, flush=True))
    except StillRunningError as error:
        print(f"nodedra cleanup: {error}", file=err)
        return 1
    except OSError as error:
        what = error.strerror if error.filename is None else f"{error.filename}: {error.strerror}"
        print(f"nodedra cleanup: {what}; run it again once that is fixed", file=err)
        return 1
    for why in report.not_given_back:
        print(f"not given back: {why}", file=out)
    if report.not_given_back:
        print(
            f"nodedra cleanup: the host's work quietCPUs kept off claimed CPUs is still kept "
            f"off them (until the next boot): run the cleanup with the host's {paths.irq_dir} "
            "and workqueue directory writable and its system bus "
            "(deploy/overlays/quiet-cpus-cleanup/)",
            file=err,
        )
    for path in report.left:
        if path.name == RECORD and report.not_given_back:
            print(f"left {path}: what the host's work had before, still narrowed", file=out)
        elif os.path.ismount(path):
            print(f"left {path}: a mount point here (remove it on the host)", file=out)
        else:
            print(f"left {path}: not a file of nodedra's", file=out)
    if report.removed:
        print(f"nodedra cleanup: removed {len(report.removed)} paths of nodedra's", file=out)
    else:
        print("nodedra cleanup: no file of nodedra's was left on this node", file=out)
    return 0


def _warn_of_prepared_claims(state_dir: Path, err: TextIO) -> None:
    """Name the claims still prepared on this node, and what that means for their pods."""
    try:
        claims = prepared_claims(state_dir)
    except (CheckpointError, OSError, ValueError) as error:
        print(f"nodedra cleanup: cannot tell which claims are still prepared: {error}", file=err)
        return
    for claim in claims:
        print(
            f"nodedra cleanup: claim {claim} is still prepared on this node: its containers "
            "keep running on its CPUs, but a pod of it deleted from now on stays Terminating "
            "(the kubelet cannot unprepare a claim without its driver)",
            file=err,
        )
