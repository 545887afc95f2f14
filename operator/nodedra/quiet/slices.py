"""The host's processes, as systemd's top-level slices and scopes.

Every process systemd starts is in a unit under the root slice: ``system.slice`` (the
services, the kubelet's and the container runtime's too), ``user.slice`` (logins),
``machine.slice`` (VMs), ``init.scope`` (PID 1), and the pods' ``kubepods.slice``. Each
top-level unit but the pods' is a source whose CPUs are its ``AllowedCPUs``, set at runtime
through systemd (:mod:`nodedra.quiet.systemd`); the cgroup's cpuset then moves every process
in it, and every process started there later, off the claimed CPUs.

What the admin set is kept: a unit's own ``AllowedCPUs`` is its original and is only
narrowed; a service's ``CPUAffinity`` is left as it is (the kernel runs the service on what
it and the slice's cpuset share). Only the unified hierarchy (cgroup v2) has the cpuset
systemd sets; on cgroup v1, and where there is no systemd on a system bus, the kind says why
it cannot be steered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from .systemd import (
    SYSTEM_BUS,
    NoSuchUnitError,
    Systemd,
    SystemdError,
    SystemdReplyError,
    Unit,
)
from .work import QuietKinds, Steered, Written, restore_each, steer_each

PREFIX = "unit/"
"""Sources of this kind are named ``unit/<name>``."""
ROOT_SLICE = "-.slice"
PODS = ("kubepods",)
"""Top-level units of these names (the kubelet's systemd cgroup driver's slices) are the
pods': nodedra's pinning keeps them where their claims say, so they are never narrowed."""
UNIFIED = Path("/sys/fs/cgroup/cgroup.controllers")
"""Present where cgroups are the unified hierarchy (in a container too: its own view)."""


def unit_source(name: str) -> str:
    """The source of unit ``name``."""
    return PREFIX + name


def is_host_unit(unit: Unit) -> bool:
    """Whether ``unit`` is a running slice or scope of the host's (not the pods')."""
    kind = unit.name.rsplit(".", 1)[-1]
    return (
        unit.active == "active"
        and kind in ("slice", "scope")
        and unit.name != ROOT_SLICE
        and not unit.name.startswith(PODS)
    )


class HostProcesses:
    """The top-level units of systemd at ``bus``, on a node of CPUs ``online``."""

    def __init__(
        self,
        online: frozenset[int],
        bus: Path = SYSTEM_BUS,
        *,
        unified: Path = UNIFIED,
        connect: Callable[[Path], Systemd] = Systemd,
    ) -> None:
        self._online = online
        self._bus_path = bus
        self._unified = unified
        self._connect = connect
        self._bus: Systemd | None = None
        self._why = ""
        """Why the units could not be listed at the last try, if so."""
        self._units: dict[str, Unit] = {}
        self._parents: dict[str, str] = {}
        """Each scope's slice, once read (a loaded unit stays in its slice)."""

    def owns(self, source: str) -> bool:
        return source.startswith(PREFIX)

    def sources(self, kinds: QuietKinds) -> list[str]:
        """The top-level units but the pods' (none if off, or if they cannot be listed)."""
        if not kinds.host_processes:
            return []
        if not self._unified.exists():
            self._why = (
                "the node's cgroups are v1: systemd sets AllowedCPUs only on cgroup v2 "
                "(systemd.unified_cgroup_hierarchy=1)"
            )
            return []
        try:
            units = self._systemd().units()
            found = [u for u in units if self._is_top_level(u)]
        except SystemdError as err:
            self._why = str(err)
            self.close()
            return []
        self._why = ""
        self._units = {u.name: u for u in found}
        listed = {u.name for u in units}
        self._parents = {n: p for n, p in self._parents.items() if n in listed}
        return sorted(unit_source(u.name) for u in found)

    def _is_top_level(self, unit: Unit) -> bool:
        """A host unit right under the root slice (a slice's name says where it is)."""
        if not is_host_unit(unit):
            return False
        if unit.name.endswith(".slice"):
            return "-" not in unit.name.removesuffix(".slice")
        if unit.name not in self._parents:
            try:
                self._parents[unit.name] = self._systemd().parent(unit)
            except SystemdReplyError:
                return False  # gone since listed: the kubelet's mounts run in such scopes
        return self._parents[unit.name] == ROOT_SLICE

    def unavailable(self, kinds: QuietKinds) -> dict[str, str]:
        return {"hostProcesses": self._why} if kinds.host_processes and self._why else {}

    def original(self, source: str) -> frozenset[int] | None:
        """The unit's ``AllowedCPUs`` (empty: unset); None if it is gone or unreadable."""
        unit = self._units.get(source.removeprefix(PREFIX))
        if unit is None:
            return None
        try:
            return self._systemd().allowed_cpus(unit)
        except SystemdError as err:
            if not isinstance(err, SystemdReplyError):
                self.close()  # the next call opens another connection
            return None  # recorded at the next pass, if it is still there

    def reach(self, source: str) -> frozenset[int] | None:
        allowed = self.original(source)
        return None if allowed is None else allowed or self._online

    def steer(self, originals: Mapping[str, frozenset[int]], allowed: frozenset[int]) -> Steered:
        """Narrow each unit's CPUs (its own ``AllowedCPUs``, or all) to those ``allowed``."""
        return steer_each(originals, allowed, self._write, unrestricted=self._online)

    def restore(self, originals: Mapping[str, frozenset[int]]) -> dict[str, str]:
        return restore_each(originals, self._write)

    def describe(self, source: str) -> str:
        return f"{source.removeprefix(PREFIX)} (host processes)"

    def _write(self, source: str, cpus: frozenset[int]) -> Written:
        """Set the unit's ``AllowedCPUs`` to ``cpus`` unless it has them already.

        Unsetting it (``cpus`` empty) first sets every CPU: systemd stops writing the cgroup's
        cpuset once the setting is gone, and would leave the narrowed one in the kernel (the
        unit's processes kept off the CPUs given back). A unit no longer loaded is gone; one
        systemd fails on is refused with its answer, and the others go on (over a new
        connection if the bus failed).
        """
        name = source.removeprefix(PREFIX)
        unit = self._units.get(name)
        current: frozenset[int] | None = None
        try:
            systemd = self._systemd()
            current = None if unit is None else systemd.allowed_cpus(unit)
            if current != cpus:
                if not cpus and self._online:
                    systemd.set_allowed_cpus(name, self._online)
                systemd.set_allowed_cpus(name, cpus)
        except NoSuchUnitError:
            return None, None  # gone: nothing runs there, nothing to give back
        except SystemdError as err:
            if not isinstance(err, SystemdReplyError):
                self.close()  # the next call opens another connection
            return (current or self._online), str(err)  # unread, it may run anywhere
        return cpus or self._online, None

    def _systemd(self) -> Systemd:
        if self._bus is None:
            self._bus = self._connect(self._bus_path)
        return self._bus

    def close(self) -> None:
        """Close the connection, if open (the next call opens another)."""
        if self._bus is not None:
            self._bus.__exit__(None, None, None)
            self._bus = None
