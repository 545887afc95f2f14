"""What CDI accepts in a spec: container edits checked field by field, and the minimum version.

A container runtime's CDI library loads specs strictly and would refuse a bad file only when
a container that needs it is created, far from the cause; the store checks every device's
edits here first. The rules follow cncf-tags/container-device-interface at v1.1.0:
``SPEC.md``, ``specs-go/config.go`` (the fields), ``specs-go/version.go`` (minimum versions),
``pkg/cdi/container-edits.go`` and ``pkg/cdi/device.go`` (validation).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn


class InvalidEditError(Exception):
    """A problem in one device's edits, with where it is (``containerEdits.mounts[0]...``)."""


def checked_edits(edits: object) -> dict[str, Any]:
    """A device's container edits as CDI would take them, copied verbatim; else InvalidEditError.

    The copy is plain data (dict, list, str, int, bool), so what is written is what was
    checked. Edits that do nothing are refused, as CDI refuses such a device.
    """
    checked: dict[str, Any] = _CONTAINER_EDITS(edits, "containerEdits")
    if _is_empty(checked):
        _fail("containerEdits", "empty: CDI refuses a device that edits nothing")
    return checked


# --- Validation of container edits -------------------------------------------------------
#
# Each check takes a value and where it is ("containerEdits.mounts[0].type"), raises
# InvalidEditError if the value is not what CDI accepts there, and otherwise returns a plain
# copy (dict, list, str, int, bool) that json.dumps can write. Copying keeps the edits
# verbatim (same keys in the same order, same values) while making sure that what is written is
# what was checked.

_Check = Callable[[object, str], Any]


def _fail(where: str, problem: str) -> NoReturn:
    raise InvalidEditError(f"{where}: {problem}")


def type_name(value: object) -> str:
    """What JSON type ``value`` is, for messages ("null" for None)."""
    return "null" if value is None else type(value).__name__


def _text(rule: Callable[[str], bool] | None = None, problem: str = "") -> _Check:
    """A string, which ``rule`` (if any) must accept; ``problem`` says what a refusal means."""

    def check(value: object, where: str) -> str:
        if not isinstance(value, str):
            _fail(where, f"must be a string, not {type_name(value)}")
        text = str.__str__(value)  # a plain str even for str subclasses such as enums
        if rule is not None and not rule(text):
            _fail(where, f"{text!r} {problem}")
        return text

    return check


def _integer(low: int, high: int, what: str) -> _Check:
    """An integer in ``[low, high]``: the range of the Go type the field is decoded into."""

    def check(value: object, where: str) -> int:
        # bool is an int in Python but a JSON boolean to Go, which refuses it for a number.
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(where, f"must be {what}, not {type_name(value)}")
        if not low <= value <= high:
            _fail(where, f"{value} is out of range: must be {what}")
        return int(value)

    return check


def _boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        _fail(where, f"must be a boolean, not {type_name(value)}")
    return value


def _list_of(item: _Check) -> _Check:
    """A list (or tuple) whose items all pass ``item``."""

    def check(value: object, where: str) -> list[Any]:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            _fail(where, f"must be a list, not {type_name(value)}")
        return [item(entry, f"{where}[{i}]") for i, entry in enumerate(value)]

    return check


def _struct(fields: Mapping[str, _Check], required: tuple[str, ...] = ()) -> _Check:
    """A mapping with only ``fields`` (CDI decodes strictly) and all of ``required``."""

    def check(value: object, where: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            _fail(where, f"must be a mapping, not {type_name(value)}")
        copy: dict[str, Any] = {}
        for key, entry in value.items():
            field = fields.get(key) if isinstance(key, str) else None
            if field is None:
                _fail(f"{where}.{key}", f"unknown field (known: {', '.join(fields)})")
            copy[key] = field(entry, f"{where}.{key}")
        for key in required:
            if key not in copy:
                _fail(f"{where}.{key}", "required field missing")
        return copy

    return check


def _distinct(check: _Check, *keys: str) -> _Check:
    """A list of mappings in which no two items share a value of any of ``keys``."""

    def distinct(value: object, where: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = check(value, where)
        for key in keys:
            seen: set[object] = set()
            for i, item in enumerate(items):
                if item[key] in seen:
                    _fail(f"{where}[{i}].{key}", f"duplicate value {item[key]!r}")
                seen.add(item[key])
        return items

    return distinct


def _valid_clos_id(clos_id: str) -> bool:
    """A Linux file name, or "/" for the root CLOS (``IntelRdt.Validate``)."""
    if clos_id == "/":
        return True
    return (
        len(clos_id) < 4096 and clos_id not in (".", "..") and not any(c in clos_id for c in "/\n")
    )


_HOOK_NAMES = (
    "prestart",  # deprecated by OCI, still accepted by the CDI library
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
)
_DEVICE_TYPES = ("", "b", "c", "u", "p")

_UINT32 = _integer(0, 2**32 - 1, "an integer in 0..4294967295 (uint32)")
_INT64 = _integer(-(2**63), 2**63 - 1, "a 64-bit integer")
_STRING = _text()
_NON_EMPTY = _text(bool, "must not be empty")
_ABSOLUTE = _text(lambda path: path.startswith("/"), "must be an absolute path")
# ValidateEnv: an '=' after a non-empty name.
_ENV = _list_of(_text(lambda entry: entry.find("=") > 0, 'must be "NAME=VALUE", NAME not empty'))

_CONTAINER_EDITS = _struct(
    {
        "env": _ENV,
        "deviceNodes": _list_of(
            _struct(
                {
                    "path": _ABSOLUTE,
                    "hostPath": _STRING,
                    "type": _text(
                        lambda kind: kind in _DEVICE_TYPES, "must be one of b, c, u, p or empty"
                    ),
                    "major": _INT64,
                    "minor": _INT64,
                    "fileMode": _UINT32,
                    "permissions": _text(
                        lambda perms: set(perms) <= set("rwm"), "may only contain r, w and m"
                    ),
                    "uid": _UINT32,
                    "gid": _UINT32,
                },
                required=("path",),
            )
        ),
        "netDevices": _distinct(
            _list_of(
                _struct(
                    {"hostInterfaceName": _NON_EMPTY, "name": _NON_EMPTY},
                    required=("hostInterfaceName", "name"),
                )
            ),
            "hostInterfaceName",
            "name",
        ),
        "hooks": _list_of(
            _struct(
                {
                    "hookName": _text(
                        lambda name: name in _HOOK_NAMES,
                        f"is not a hook name ({', '.join(_HOOK_NAMES)})",
                    ),
                    "path": _ABSOLUTE,
                    "args": _list_of(_STRING),
                    "env": _ENV,
                    # SPEC.md: "If set, timeout MUST be greater than zero."
                    "timeout": _integer(1, 2**63 - 1, "a positive integer"),
                },
                required=("hookName", "path"),
            )
        ),
        "mounts": _list_of(
            _struct(
                {
                    "hostPath": _NON_EMPTY,
                    "containerPath": _NON_EMPTY,
                    "options": _list_of(_STRING),
                    "type": _STRING,
                },
                required=("hostPath", "containerPath"),
            )
        ),
        "intelRdt": _struct(
            {
                "closID": _text(_valid_clos_id, "is not a valid CLOS name"),
                "l3CacheSchema": _STRING,
                "memBwSchema": _STRING,
                "schemata": _list_of(_STRING),
                "enableMonitoring": _boolean,
            }
        ),
        "additionalGids": _list_of(_UINT32),
    }
)


def _is_empty(edits: Mapping[str, Any]) -> bool:
    """Whether edits do nothing, which CDI refuses for a device (``ContainerEdits.isEmpty``).

    A present ``intelRdt`` counts even when empty, as the Go library decodes it to a pointer.
    """
    return "intelRdt" not in edits and not any(
        edits.get(field)
        for field in ("env", "deviceNodes", "hooks", "mounts", "additionalGids", "netDevices")
    )


# --- Minimum required version ------------------------------------------------------------


_SpecRule = Callable[[Mapping[str, Any]], bool]


def _all_edits(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield spec.get("containerEdits") or {}
    for device in spec.get("devices") or ():
        yield device.get("containerEdits") or {}


def _in_edits(rule: _SpecRule) -> _SpecRule:
    """A rule on a spec: whether ``rule`` holds for its own or any device's edits."""
    return lambda spec: any(rule(edits) for edits in _all_edits(spec))


def _new_rdt_or_net_devices(edits: Mapping[str, Any]) -> bool:
    rdt = edits.get("intelRdt")
    new_rdt = rdt is not None and (rdt.get("schemata") is not None or rdt.get("enableMonitoring"))
    return bool(new_rdt or edits.get("netDevices"))


def _annotations_or_dotted_class(spec: Mapping[str, Any]) -> bool:
    _, slash, cdi_class = str(spec.get("kind", "")).partition("/")
    devices = spec.get("devices") or ()
    return bool(
        spec.get("annotations")
        or any(device.get("annotations") for device in devices)
        or (slash and "." in cdi_class)
    )


def _digit_first_device_name(spec: Mapping[str, Any]) -> bool:
    # Go compares the first byte with '0'..'9', so no other Unicode digits.
    devices = spec.get("devices") or ()
    return any(re.match("[0-9]", str(device.get("name", ""))) for device in devices)


_device_node_host_path = _in_edits(
    lambda e: any(n.get("hostPath") for n in e.get("deviceNodes") or ())
)

# Newest first, as in specs-go/version.go; the first rule that holds gives the version.
# 1.0.0 and 0.8.0 changed the Go API only: no spec field needs them.
_VERSION_RULES: tuple[tuple[str, _SpecRule], ...] = (
    ("1.1.0", _in_edits(_new_rdt_or_net_devices)),
    ("0.7.0", _in_edits(lambda e: e.get("intelRdt") is not None or bool(e.get("additionalGids")))),
    ("0.6.0", _annotations_or_dotted_class),
    ("0.5.0", lambda spec: _digit_first_device_name(spec) or _device_node_host_path(spec)),
    ("0.4.0", _in_edits(lambda e: any(m.get("type") for m in e.get("mounts") or ()))),
)
_EARLIEST_VERSION = "0.3.0"


def minimum_cdi_version(spec: Mapping[str, Any]) -> str:
    """The lowest ``cdiVersion`` a spec (as a mapping of its fields) may declare.

    This is what the Go library's ``MinimumRequiredVersion`` computes. Writing the minimum
    rather than the newest version keeps the spec loadable by runtimes whose CDI library is
    older: they reject versions they do not know.
    """
    for version, needs in _VERSION_RULES:
        if needs(spec):
            return version
    return _EARLIEST_VERSION
