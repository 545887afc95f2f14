"""The CDI spec files of prepared claims: one file per claim, one device per allocation result.

A container runtime learns what a claim's devices do to a container only from these files: the
kubelet passes it nothing but the qualified device names. The store writes what the policy
decided (the container edits) and nothing else, checked first as CDI would (``cdi_schema``).
File names and writing follow cncf-tags/container-device-interface at v1.1.0
(``pkg/cdi/spec.go``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodedra.lib import faults
from nodedra.lib.durable import remove_leftovers, replace_file

from .cdi_schema import InvalidEditError, checked_edits, minimum_cdi_version, type_name
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

        Nothing is fsynced, as CDI's own writer does not: specs are transient (the tmpfs
        vanishes on reboot and a re-prepare writes them again); the checkpoint, saved
        before, is the durable record.
        """
        replace_file(
            self.spec_path(spec.uid),
            json.dumps(spec.content).encode() + b"\n",
            mode=_SPEC_MODE,
            dir_mode=_DIR_MODE,
            crash_points=crash_points,
            survive_power_cut=False,
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
                f"not {type_name(edits)}"
            )
        if not edits:
            raise CDISpecError(f"claim {uid!r}: no container edits: a spec needs a device")
        devices = []
        for i, device_edits in enumerate(edits):
            name = cdi_device_name(uid, i)
            try:
                checked = checked_edits(device_edits)
            except InvalidEditError as err:
                raise CDISpecError(f"claim {uid!r}, device {name!r}: {err}") from None
            devices.append({"name": name, "containerEdits": checked})
        spec: dict[str, Any] = {"cdiVersion": "", "kind": self.kind, "devices": devices}
        spec["cdiVersion"] = minimum_cdi_version(spec)
        return spec


def _valid_uid(uid: str) -> bool:
    """Whether ``uid`` can be part of a device name (and so of a spec file name)."""
    return bool(uid) and is_valid_cdi_device_name(cdi_device_name(uid, 0))
