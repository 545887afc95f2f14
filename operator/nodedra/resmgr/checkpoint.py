"""The checkpoint: what the policy granted, kept on disk so that it outlives the process.

Claims cannot be rebuilt from anything else: the kubelet does not tell a restarted driver
which claims it prepared, and running containers keep their CPUs whatever we remember. So
the file is written so that a crash at any moment leaves the old or the new version whole
(temp file, fsync, rename, directory fsync); it carries a schema version, so that a newer
format is migrated and an unknown one refused rather than misread; and a checksum, so that a
damaged file is refused with a message instead of silently losing claims.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodedra.lib import faults
from nodedra.lib.durable import remove_leftovers, replace_file

KIND = "nodedra.checkpoint"
VERSION = 2
FILE_NAME = "checkpoint.json"

Migration = Callable[[dict[str, Any]], dict[str, Any]]


def _reservations_added(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 records whom each claim was reserved for; version 1 knew nothing of it."""
    return {**data, "reservations": {}}


MIGRATIONS: dict[int, Migration] = {1: _reservations_added}
"""``MIGRATIONS[n]`` turns the data of schema version ``n`` into that of version ``n + 1``."""


class CheckpointError(RuntimeError):
    """A checkpoint nodedra will not use; the message says what to do about it."""


@dataclass(frozen=True)
class State:
    """What the checkpoint holds."""

    policy: str
    driver: str
    claims: Mapping[str, Any] = field(default_factory=dict)
    """The policy's record of the claims it holds (``Policy.snapshot()``)."""
    reservations: Mapping[str, Any] = field(default_factory=dict)
    """Claim UID -> its name and the pods it was reserved for, as of its prepare."""


def _checksum(version: int, data: Mapping[str, Any]) -> str:
    canonical = json.dumps(
        {"version": version, "data": data}, sort_keys=True, separators=(",", ":")
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


class Checkpoint:
    """The checkpoint file at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def identity(self) -> tuple[int, int] | None:
        """Which file the checkpoint is now (every save writes a new one); None if absent."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return None
        return info.st_dev, info.st_ino

    def load(self) -> State | None:
        """The state saved last; None when there is no checkpoint (a first start)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {err}") from None
        except UnicodeDecodeError as err:  # we write JSON, so UTF-8: it was damaged since
            raise self._corrupt(f"not text ({err})") from None
        try:
            document = json.loads(text)
            kind, version = document["kind"], document["version"]
            data, checksum = document["data"], document["checksum"]
        except (ValueError, TypeError, KeyError) as err:
            raise self._corrupt(f"not a checkpoint document ({err})") from None
        if kind != KIND or not isinstance(version, int) or not isinstance(data, dict):
            raise self._corrupt(f"not a {KIND} document")
        if checksum != _checksum(version, data):
            raise self._corrupt("its checksum does not match its content")
        if version > VERSION:
            raise CheckpointError(
                f"checkpoint {self.path} has schema version {version}, written by a newer "
                f"nodedra; this one knows versions up to {VERSION}. Run the newer nodedra "
                "(or roll back only after draining the node's claims)."
            )
        for old in range(version, VERSION):
            if old not in MIGRATIONS:
                raise CheckpointError(
                    f"checkpoint {self.path} has schema version {version}, which this nodedra "
                    "cannot migrate: drain the node's claims and move the file aside"
                )
            data = MIGRATIONS[old](data)
        try:
            return State(
                str(data["policy"]),
                str(data["driver"]),
                dict(data["claims"]),
                dict(data["reservations"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise self._corrupt(f"missing or malformed field {err}") from None

    def save(self, state: State, crash_points: faults.WritePoints | None = None) -> None:
        """Replace the checkpoint with ``state``, atomically and durably; raise on failure.

        ``NotDurableError`` (``nodedra.lib.durable``) says the failure came after ``state``
        was put in place: it is the checkpoint now, what a restart reads (unless a power
        cut undoes the rename).
        """
        data = {
            "policy": state.policy,
            "driver": state.driver,
            "claims": dict(state.claims),
            "reservations": dict(state.reservations),
        }
        document = {
            "kind": KIND,
            "version": VERSION,
            "data": data,
            "checksum": _checksum(VERSION, data),
        }
        # One line: json's C encoder writes no indentation (with it, the pure-Python one
        # runs, several times slower, on every commit).
        text = json.dumps(document, sort_keys=True) + "\n"
        replace_file(self.path, text.encode(), crash_points=crash_points)

    def remove_leftovers(self) -> list[str]:
        """Remove the temporary files of saves that a crash interrupted; their names."""
        if not self.path.parent.is_dir():
            return []
        return remove_leftovers(self.path.parent, f"{self.path.name}.")

    def _corrupt(self, why: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {self.path} is corrupt: {why}. nodedra does not guess which claims "
            "hold which CPUs. Drain the node's pods that use DRA claims, then move the file "
            f"aside (mv {self.path} {self.path}.corrupt) and start again."
        )
