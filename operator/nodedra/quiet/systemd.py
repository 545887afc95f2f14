"""systemd's D-Bus API on the system bus, as much of it as keeping slices off CPUs needs.

Through jeepney (pure Python, maintained, no C library): list the units, read a unit's
``AllowedCPUs`` and set it at runtime with ``SetUnitProperties``, which is how
``systemctl set-property --runtime`` does it. systemd then writes the cgroup's cpuset itself
and keeps it across its own reloads; nodedra never writes cgroup files behind its back.

CPU sets travel as systemd's bitmask (``ay``): byte *i*, bit *j* is CPU 8 *i* + *j*; an empty
array means "no restriction" (the setting unset).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from jeepney import (
    AuthenticationError,
    DBusAddress,
    DBusErrorResponse,
    HeaderFields,
    Message,
    MessageType,
    Properties,
    new_method_call,
)
from jeepney.io.blocking import DBusConnection, open_dbus_connection

SYSTEM_BUS = Path("/run/dbus/system_bus_socket")
"""Where the system bus listens, on the host and (mounted) in nodedra's pod."""
SYSTEMD = DBusAddress(
    "/org/freedesktop/systemd1",
    bus_name="org.freedesktop.systemd1",
    interface="org.freedesktop.systemd1.Manager",
)
TIMEOUT = 10.0
"""Seconds for one call: systemd answers in milliseconds unless it is stuck."""
UNIT_INTERFACES = {
    "slice": "org.freedesktop.systemd1.Slice",
    "scope": "org.freedesktop.systemd1.Scope",
}
"""The D-Bus interface with ``AllowedCPUs``, by the unit's type."""


class SystemdError(Exception):
    """The system bus or systemd did not do what was asked (the message says what)."""


class SystemdReplyError(SystemdError):
    """systemd (or the bus) answered this one call with an error: the connection is fine."""


class NoSuchUnitError(SystemdReplyError):
    """systemd has no such unit (a transient scope gone since it was listed)."""


NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"


@dataclass(frozen=True)
class Unit:
    """A loaded unit, as ListUnits names it."""

    name: str
    path: str
    active: str


def to_bitmask(cpus: Iterable[int]) -> bytes:
    """``cpus`` as systemd's ``ay`` bitmask."""
    wanted = set(cpus)
    mask = bytearray((max(wanted) // 8 + 1) if wanted else 0)
    for cpu in wanted:
        mask[cpu // 8] |= 1 << (cpu % 8)
    return bytes(mask)


def from_bitmask(mask: bytes) -> frozenset[int]:
    """The CPUs of systemd's ``ay`` bitmask."""
    return frozenset(i * 8 + j for i, byte in enumerate(mask) for j in range(8) if byte >> j & 1)


class Systemd:
    """One connection to systemd over the system bus at ``socket``; a context manager."""

    def __init__(self, socket: Path = SYSTEM_BUS) -> None:
        try:
            self._conn: DBusConnection = open_dbus_connection(f"unix:path={socket}")
        except (OSError, AuthenticationError, DBusErrorResponse, TimeoutError) as err:
            raise SystemdError(f"cannot reach the system bus at {socket}: {err}") from None
        self._socket = socket

    def __enter__(self) -> Systemd:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._conn.close()

    def units(self) -> list[Unit]:
        """The units systemd has loaded."""
        (listed,) = self._call(new_method_call(SYSTEMD, "ListUnits"), "listing the units")
        return [Unit(name=str(u[0]), path=str(u[6]), active=str(u[3])) for u in listed]

    def parent(self, unit: Unit) -> str:
        """The slice ``unit`` (a slice or a scope) is in."""
        address = DBusAddress(unit.path, bus_name=SYSTEMD.bus_name, interface=_interface(unit))
        ((_, slice_),) = self._call(Properties(address).get("Slice"), f"reading {unit.name}")
        return str(slice_)

    def allowed_cpus(self, unit: Unit) -> frozenset[int]:
        """``AllowedCPUs`` of ``unit`` (a slice or a scope); empty if unset."""
        address = DBusAddress(unit.path, bus_name=SYSTEMD.bus_name, interface=_interface(unit))
        ((_, mask),) = self._call(
            Properties(address).get("AllowedCPUs"), f"reading {unit.name}'s AllowedCPUs"
        )
        return from_bitmask(bytes(mask))

    def set_allowed_cpus(self, name: str, cpus: frozenset[int]) -> None:
        """Set ``AllowedCPUs`` of unit ``name`` until the next boot (empty: unset it)."""
        self._call(
            new_method_call(
                SYSTEMD,
                "SetUnitProperties",
                "sba(sv)",
                (name, True, [("AllowedCPUs", ("ay", to_bitmask(cpus)))]),
            ),
            f"setting {name}'s AllowedCPUs",
        )

    def _call(self, message: Message, doing: str) -> tuple[Any, ...]:
        try:
            reply = self._conn.send_and_get_reply(message, timeout=TIMEOUT)
        except (OSError, TimeoutError) as err:
            raise SystemdError(f"{doing} over {self._socket}: {err}") from None
        if reply.header.message_type == MessageType.error:
            name = reply.header.fields.get(HeaderFields.error_name, "an error")
            text = reply.body[0] if reply.body else ""
            kind = NoSuchUnitError if name == NO_SUCH_UNIT else SystemdReplyError
            raise kind(f"{doing}: systemd answered {name}: {text}")
        return tuple(reply.body)


def _interface(unit: Unit) -> str:
    kind = unit.name.rsplit(".", 1)[-1]
    if kind not in UNIT_INTERFACES:
        raise SystemdError(f"{unit.name}: only slices and scopes have AllowedCPUs here")
    return UNIT_INTERFACES[kind]
