"""The checkpoint: what the policy granted, kept on disk so that it outlives the process.

Claims cannot be rebuilt from anything else: the kubelet does not tell a restarted driver
which claims it prepared, and running containers keep their CPUs whatever we remember. So
every commit is made durable before the kubelet hears of it, in a slot file
(``nodedra.lib.slotfile``): written in place and synced, a crash at any moment leaves the
new state or the one before it whole, and it costs a kubelet request a tenth of what
replacing a file does. The record carries a schema version, so that an older format is
migrated and an unknown one refused rather than misread; and the slots a checksum, so that a
damaged file is refused with a message instead of silently losing claims.

Up to schema version 2 the checkpoint was ``checkpoint.json``, replaced on every commit.
It is read once, when there is no slot file yet; then it is replaced by a note that the
state moved, which nodedra of those versions refuses as written by a newer one: so an
older instance still running beside this one during a rolling update fails its requests
rather than work from books it can no longer see, and a downgrade is refused until the
node's claims are drained (docs/deploying.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodedra.lib import faults
from nodedra.lib.durable import remove_leftovers, replace_file
from nodedra.lib.slotfile import DamagedError, Identity, SlotFile

KIND = "nodedra.checkpoint"
VERSION = 3
FILE_NAME = "checkpoint.slots"
LEGACY_NAME = "checkpoint.json"
"""Where versions 1 and 2 kept the checkpoint (in the same directory)."""

Migration = Callable[[dict[str, Any]], dict[str, Any]]


def _reservations_added(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 records whom each claim was reserved for; version 1 knew nothing of it."""
    return {**data, "reservations": {}}


def _moved_into_slots(data: dict[str, Any]) -> dict[str, Any]:
    """Version 3 is version 2 in a slot file: the data did not change."""
    return data


MIGRATIONS: dict[int, Migration] = {1: _reservations_added, 2: _moved_into_slots}
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
    """The checkpoint file at ``path`` (a slot file; ``checkpoint.json`` beside it: legacy)."""

    def __init__(self, path: Path) -> None:
        if path.name == LEGACY_NAME:
            raise ValueError(f"{LEGACY_NAME} is the legacy checkpoint: name the slot file")
        self.path = path
        self.legacy_path = path.with_name(LEGACY_NAME)
        self._slots = SlotFile(path)
        self._legacy_moved = False
        """Whether the legacy file is known to say that the state moved (or to be absent)."""

    def identity(self) -> Identity | None:
        """What changes with every save, by any process; None if nothing was saved yet."""
        return self._slots.identity()

    def load(self) -> State | None:
        """The state saved last; None when there is no checkpoint (a first start)."""
        try:
            record = self._slots.read()
        except DamagedError as err:
            raise self._corrupt(str(err)) from None
        except OSError as err:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {err}") from None
        if record is None:
            return self._load_legacy()
        try:
            document = json.loads(record)
            kind, version, data = document["kind"], document["version"], document["data"]
        except (ValueError, TypeError, KeyError) as err:
            raise self._corrupt(f"its record is not a checkpoint document ({err})") from None
        return self._state(kind, version, data)

    def save(self, state: State, crash_points: faults.SlotPoints | None = None) -> None:
        """Make ``state`` the checkpoint, durably; raise on failure.

        ``NotDurableError`` (``nodedra.lib.durable``) says the failure came after ``state``
        was written: it is the checkpoint now, what a restart reads (unless a power cut
        undoes the write).
        """
        data = {
            "policy": state.policy,
            "driver": state.driver,
            "claims": dict(state.claims),
            "reservations": dict(state.reservations),
        }
        # One line: json's C encoder writes no indentation (with it, the pure-Python one
        # runs, several times slower, on every commit).
        record = json.dumps({"kind": KIND, "version": VERSION, "data": data}, sort_keys=True)
        self._slots.write(record.encode() + b"\n", crash_points)
        if not self._legacy_moved:
            self._leave_note_in_legacy()

    def remove_leftovers(self) -> list[str]:
        """Remove the temporary files of saves that a crash interrupted; their names."""
        if not self.path.parent.is_dir():
            return []
        return [
            *remove_leftovers(self.path.parent, f"{self.path.name}."),
            *remove_leftovers(self.path.parent, f"{self.legacy_path.name}."),
        ]

    def _load_legacy(self) -> State | None:
        """The state in ``checkpoint.json`` (versions 1 and 2); None if there is none."""
        path = self.legacy_path
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise CheckpointError(f"cannot read checkpoint {path}: {err}") from None
        except UnicodeDecodeError as err:  # we write JSON, so UTF-8: it was damaged since
            raise self._corrupt(f"not text ({err})", path) from None
        try:
            document = json.loads(text)
            kind, version = document["kind"], document["version"]
            data, checksum = document["data"], document["checksum"]
        except (ValueError, TypeError, KeyError) as err:
            raise self._corrupt(f"not a checkpoint document ({err})", path) from None
        if (
            isinstance(version, int)
            and isinstance(data, dict)
            and checksum != _checksum(version, data)
        ):
            raise self._corrupt("its checksum does not match its content", path)
        if version == VERSION and kind == KIND and data == _moved_note():
            raise self._corrupt(f"it says the state moved to {self.path}, which is missing")
        return self._state(kind, version, data, path)

    def _state(
        self, kind: object, version: object, data: object, path: Path | None = None
    ) -> State:
        """The state of a document of schema ``version``, migrated; CheckpointError if bad."""
        path = path or self.path
        if kind != KIND or not isinstance(version, int) or not isinstance(data, dict):
            raise self._corrupt(f"not a {KIND} document", path)
        if version > VERSION:
            raise CheckpointError(
                f"checkpoint {path} has schema version {version}, written by a newer "
                f"nodedra; this one knows versions up to {VERSION}. Run the newer nodedra "
                "(or roll back only after draining the node's claims)."
            )
        for old in range(version, VERSION):
            if old not in MIGRATIONS:
                raise CheckpointError(
                    f"checkpoint {path} has schema version {version}, which this nodedra "
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
            raise self._corrupt(f"missing or malformed field {err}", path) from None

    def _leave_note_in_legacy(self) -> None:
        """Replace a legacy ``checkpoint.json`` with the note that the state moved.

        After the slot file holds the state: a crash in between leaves both, and the slot
        file is what is read.
        """
        try:
            text = self.legacy_path.read_text()
        except FileNotFoundError:
            self._legacy_moved = True
            return
        except (OSError, UnicodeDecodeError):
            text = ""
        note = {"kind": KIND, "version": VERSION, "data": _moved_note()}
        note["checksum"] = _checksum(VERSION, _moved_note())
        content = json.dumps(note, sort_keys=True) + "\n"
        if text != content:
            replace_file(self.legacy_path, content.encode())
        self._legacy_moved = True

    def _corrupt(self, why: str, path: Path | None = None) -> CheckpointError:
        path = path or self.path
        return CheckpointError(
            f"checkpoint {path} is corrupt: {why}. nodedra does not guess which claims "
            "hold which CPUs. Drain the node's pods that use DRA claims, then move the file "
            f"aside (mv {path} {path}.corrupt) and start again."
        )


def _moved_note() -> dict[str, Any]:
    """The data of the legacy file once the state is in the slot file."""
    return {"movedTo": FILE_NAME}
