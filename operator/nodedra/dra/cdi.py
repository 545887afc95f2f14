"""The CDI spec files of prepared claims: one file per claim, one device per allocation result.

A container runtime learns what a claim's devices do to a container only from these files: the
kubelet passes it nothing but the qualified device names. The store writes what the policy
decided (the container edits) and nothing else. It checks the edits against the CDI spec
(v1.1.0) before writing, because the runtime's CDI library loads specs strictly and would
reject a bad file only later, when a container that needs it is created, far from the cause.

The rules follow cncf-tags/container-device-interface at v1.1.0: ``SPEC.md``,
``specs-go/config.go`` (the fields), ``specs-go/version.go`` (minimum versions),
``pkg/cdi/container-edits.go`` and ``pkg/cdi/device.go`` (validation) and ``pkg/cdi/spec.go``
(file names and writing).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from nodedra.lib import faults
from nodedra.lib.durable import remove_leftovers, replace_file

from .names import (
    CDI_CLASS,
    cdi_device_name,
    is_valid_cdi_device_name,
    is_valid_cdi_vendor,
    qualified_cdi_device,
)

DEFAULT_CDI_DIR = "/var/run/cdi"
"""CDI's dynamic spec directory: runtimes watch it, and it wins over the static ``/etc/cdi``."""

_SPEC_MODE = 0o644
_DIR_MODE = 0o755


class CDISpecError(ValueError):
    """A spec the store refuses to write; the message names the claim, device and field."""


# --- Validation of container edits -------------------------------------------------------
#
# Each check takes a value and where it is ("containerEdits.mounts[0].type"), raises
# _InvalidEditError if the value is not what CDI accepts there, and otherwise returns a plain
# copy (dict, list, str, int, bool) that json.dumps can write. Copying keeps the edits
# verbatim (same keys in the same order, same values) while making sure that what is written is
# what was checked.

_Check = Callable[[object, str], Any]


class _InvalidEditError(Exception):
    """A problem in one device's edits; claim_spec adds the claim and the device."""


def _fail(where: str, problem: str) -> NoReturn:
    raise _InvalidEditError(f"{where}: {problem}")


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _text(rule: Callable[[str], bool] | None = None, problem: str = "") -> _Check:
    """A string, which ``rule`` (if any) must accept; ``problem`` says what a refusal means."""

    def check(value: object, where: str) -> str:
        if not isinstance(value, str):
            _fail(where, f"must be a string, not {_type_name(value)}")
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
            _fail(where, f"must be {what}, not {_type_name(value)}")
        if not low <= value <= high:
            _fail(where, f"{value} is out of range: must be {what}")
        return int(value)

    return check


def _boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        _fail(where, f"must be a boolean, not {_type_name(value)}")
    return value


def _list_of(item: _Check) -> _Check:
    """A list (or tuple) whose items all pass ``item``."""

    def check(value: object, where: str) -> list[Any]:
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            _fail(where, f"must be a list, not {_type_name(value)}")
        return [item(entry, f"{where}[{i}]") for i, entry in enumerate(value)]

    return check


def _struct(fields: Mapping[str, _Check], required: tuple[str, ...] = ()) -> _Check:
    """A mapping with only ``fields`` (CDI decodes strictly) and all of ``required``."""

    def check(value: object, where: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            _fail(where, f"must be a mapping, not {_type_name(value)}")
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


# --- The store ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimSpec:
    """A claim's CDI spec, checked and ready to write."""

    uid: str
    content: Mapping[str, Any]
    device_ids: tuple[str, ...]
    """The qualified CDI device names, one per allocation result, in order."""


class CDIStore:
    """The CDI spec files of one driver's prepared claims, in one directory.

    Each claim gets the file ``<driver>-device_<uid>.yaml``, holding the kind
    ``<driver>/device`` and the device ``claim-<uid>-<i>`` for the ``i``-th allocation result
    of the driver. Nothing reads the files back but the container runtimes, so the store keeps
    no cache. It does no locking either: its owner serializes prepares and unprepares.
    """

    def __init__(self, driver: str, directory: str | os.PathLike[str] | None = None) -> None:
        """Make a store for ``driver``'s specs in ``directory`` (default ``/var/run/cdi``).

        The driver name is the CDI vendor, so it must be a valid one; a bad name is refused
        here rather than on the first write, when a claim would fail for it. The directory is
        not created: whoever configured it decides whether it should exist. An empty path
        means the default, as in the Go original.
        """
        if not isinstance(driver, str) or not is_valid_cdi_vendor(driver):
            raise ValueError(
                f"invalid CDI vendor (driver name) {driver!r}: it must start with a letter, "
                "end with a letter or digit and have only letters, digits, '_', '-' and '.' "
                "in between"
            )
        self._driver = driver
        if directory is None or os.fspath(directory) == "":
            directory = DEFAULT_CDI_DIR
        self._directory = Path(directory)
        self._file_name = re.compile(re.escape(f"{driver}-{CDI_CLASS}_") + r"(.+)\.yaml")

    @property
    def driver(self) -> str:
        """The driver name, which is the CDI vendor of the specs."""
        return self._driver

    @property
    def kind(self) -> str:
        """The CDI kind of the specs, ``<driver>/device``."""
        return f"{self._driver}/{CDI_CLASS}"

    @property
    def directory(self) -> Path:
        """The directory the specs are written to."""
        return self._directory

    def spec_path(self, uid: str) -> Path:
        """The spec file of claim ``uid``.

        The name is the Go library's ``GenerateTransientSpecName(vendor, class, uid)`` plus
        ``.yaml``, so a Go implementation of the driver would find the same files; like it,
        '/' in the uid becomes '_', which keeps any uid inside the directory.
        """
        transient_id = uid.replace("/", "_")
        return self._directory / f"{self._driver}-{CDI_CLASS}_{transient_id}.yaml"

    def claim_spec(self, uid: str, edits: Sequence[Mapping[str, Any]]) -> ClaimSpec:
        """Claim ``uid``'s spec, one device per edits, checked but not written.

        The ``i``-th device is ``claim-<uid>-<i>`` with ``edits[i]`` as its container edits,
        verbatim: the store does not know what they mean. ``cdiVersion`` is the minimum the
        edits need. A spec CDI would refuse raises :class:`CDISpecError`; checking apart
        from writing lets a caller refuse bad edits before committing to them.
        """
        content = self._spec(uid, edits)
        ids = tuple(qualified_cdi_device(self._driver, uid, i) for i in range(len(edits)))
        return ClaimSpec(uid, content, ids)

    def write_spec(
        self, spec: ClaimSpec, crash_points: faults.WritePoints | None = None
    ) -> list[str]:
        """Write a spec made by :meth:`claim_spec`, replacing any earlier one of its claim.

        The file is replaced atomically, so a failure leaves any earlier spec as it was and
        no partial file a runtime could load. Returns the qualified device names.

        The directory is created (mode 0755) if missing: /var/run/cdi is usually a tmpfs, so
        after a reboot it may not exist until someone writes a spec, and the runtimes, which
        may not run as our user, must be able to list it; the file is 0644 for the same
        reason. The temporary file's name ends in ``.tmp``, which runtimes watching the
        directory ignore (they load only ``.json`` and ``.yaml``). The content is JSON,
        which is YAML too: CDI parses a spec the same whatever its extension, and a JSON
        encoder is many times faster than a YAML one on the prepare path.

        The rename is not made durable with a directory fsync, as CDI writers do not make
        it: specs are transient (the tmpfs vanishes on reboot and a re-prepare writes them
        again); the checkpoint, saved before, is the durable record.
        """
        replace_file(
            self.spec_path(spec.uid),
            json.dumps(spec.content).encode() + b"\n",
            mode=_SPEC_MODE,
            dir_mode=_DIR_MODE,
            crash_points=crash_points,
            sync_directory=False,
        )
        return list(spec.device_ids)

    def remove_claim(self, uid: str) -> None:
        """Remove claim ``uid``'s spec; a spec that is not there is already removed.

        A UID no spec can be written for has none, whatever file its name would map to:
        ``a/b`` must not remove the spec of claim ``a_b``.
        """
        if not _valid_uid(uid):
            return
        path = self.spec_path(uid)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError:
            # A read-only directory refuses to unlink even what is not there (EROFS): the
            # claim's spec is gone all the same, and a claim never prepared has none.
            try:
                path.lstat()
            except FileNotFoundError:
                return
            raise

    def has_claim(self, uid: str) -> bool:
        """Whether claim ``uid`` has a spec.

        The spec is the last thing a successful prepare writes, so a claim with one was
        prepared at least once and its devices may be in use. Errors other than a missing
        file are raised: "cannot tell" must not pass for "no". A UID no spec can be written
        for has none (``a/b`` does not have the spec of claim ``a_b``).
        """
        if not _valid_uid(uid):
            return False
        try:
            self.spec_path(uid).stat()
        except FileNotFoundError:
            return False
        return True

    def remove_leftovers(self) -> list[str]:
        """Remove the temporary files of our specs that a crash left; their names."""
        if not self._directory.is_dir():
            return []
        return remove_leftovers(self._directory, f"{self._driver}-{CDI_CLASS}_")

    def claim_uids(self) -> list[str]:
        """The UIDs of the claims that have a spec of ours in the directory, sorted.

        Only file names are looked at: ``<driver>-device_<uid>.yaml`` with a uid that
        :meth:`claim_spec` would accept. Other vendors' and classes' specs, our own temporary
        files and malformed names are ignored and left alone. No directory, no specs.
        """
        try:
            entries = list(os.scandir(self._directory))
        except FileNotFoundError:
            return []
        uids = []
        for entry in entries:
            match = self._file_name.fullmatch(entry.name)
            if match and _valid_uid(match.group(1)) and entry.is_file():
                uids.append(match.group(1))
        return sorted(uids)

    def _spec(self, uid: str, edits: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The spec of claim ``uid`` as plain data, or CDISpecError if CDI would refuse it."""
        if not isinstance(uid, str) or not uid:
            raise CDISpecError(
                f"claim uid {uid!r}: must be a non-empty string: a spec without one could "
                "never be named for removal"
            )
        if not _valid_uid(uid):
            raise CDISpecError(
                f"claim {uid!r}: makes the invalid CDI device name {cdi_device_name(uid, 0)!r} "
                "(allowed: letters, digits, '_', '-', '.' and ':')"
            )
        if isinstance(edits, str | bytes | Mapping) or not isinstance(edits, Sequence):
            raise CDISpecError(
                f"claim {uid!r}: edits must be a list of container edits, one per device, "
                f"not {_type_name(edits)}"
            )
        if not edits:
            raise CDISpecError(f"claim {uid!r}: no container edits: a spec needs a device")
        devices = []
        for i, device_edits in enumerate(edits):
            name = cdi_device_name(uid, i)
            try:
                checked = _CONTAINER_EDITS(device_edits, "containerEdits")
                if _is_empty(checked):
                    _fail("containerEdits", "empty: CDI refuses a device that edits nothing")
            except _InvalidEditError as err:
                raise CDISpecError(f"claim {uid!r}, device {name!r}: {err}") from None
            devices.append({"name": name, "containerEdits": checked})
        spec: dict[str, Any] = {"cdiVersion": "", "kind": self.kind, "devices": devices}
        spec["cdiVersion"] = minimum_cdi_version(spec)
        return spec


def _valid_uid(uid: str) -> bool:
    """Whether ``uid`` can be part of a device name (and so of a spec file name)."""
    return bool(uid) and is_valid_cdi_device_name(cdi_device_name(uid, 0))
