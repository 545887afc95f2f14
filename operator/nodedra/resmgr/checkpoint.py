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
The state moves in two writes: into the slot file, then a note that it moved replaces
``checkpoint.json`` (durably: file and directory synced). Until the note is in place the
legacy file is the checkpoint, whatever the slot file holds: a crash, OOM or full disk
between the two leaves the older instance of a rolling update committing to it, and a
restart or a catch-up must read what it committed. nodedra of those versions refuses the
note as written by a newer one: an older instance still running beside this one fails its
requests rather than work from books it can no longer see, and one started on a node this
version ran on refuses to start (so the note is left even where there was no legacy file)
instead of granting CPUs it cannot know are held; a downgrade needs the node's claims
drained (docs/deploying.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from nodedra.lib import faults, slotfile
from nodedra.lib.durable import NotDurableError, fsync_directory, remove_leftovers, replace_file
from nodedra.lib.slotfile import DamagedError, SlotFile

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


class Identity(NamedTuple):
    """What changes with every save, by any process (see ``nodedra.lib.slotfile.Identity``)."""

    slots: slotfile.Identity | None
    """The slot file's; None if there is none."""
    legacy: tuple[int, int, int] | None
    """Inode, size and mtime of ``checkpoint.json`` while it may still be the checkpoint."""


class Reading(NamedTuple):
    """The state saved last (None: a first start), and the identity of what held it."""

    state: State | None
    identity: Identity


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
        self._moved = False
        """Whether this process put the note in place (durably): the legacy file is done."""

    def identity(self) -> Identity:
        """What changes with every save, by any process (cheap: a few small reads)."""
        return Identity(self._slots.identity(), self._legacy_identity())

    def load(self) -> State | None:
        """The state saved last; None when there is no checkpoint (a first start)."""
        return self.read().state

    def read(self) -> Reading:
        """The state saved last, and the identity of what it was read from.

        The identity is what a reader may remember as seen: compared with ``identity()``
        later, it differs if anyone saved since, or if this read met a save half done.
        """
        legacy = self._legacy_identity()
        if not self._moved:
            legacy_state, _ = self._load_legacy()
            if legacy_state is not None:  # the state has not moved yet
                return Reading(legacy_state, Identity(self._slots.identity(), legacy))
        try:
            reading = self._slots.reading()
        except DamagedError as err:
            raise self._corrupt(str(err)) from None
        except OSError as err:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {err}") from None
        if reading is None:
            if self._load_legacy()[1]:  # a lost checkpoint is no first start
                raise self._corrupt(
                    f"it says the state moved to {self.path}, which is missing", self.legacy_path
                )
            return Reading(None, Identity(None, legacy))
        try:
            document = json.loads(reading.record)
            kind, version, data = document["kind"], document["version"], document["data"]
        except (ValueError, TypeError, KeyError) as err:
            raise self._corrupt(f"its record is not a checkpoint document ({err})") from None
        return Reading(self._state(kind, version, data), Identity(reading.identity, legacy))

    def save(self, state: State, crash_points: faults.SlotPoints | None = None) -> Identity:
        """Make ``state`` the checkpoint, durably, and return its identity; raise on failure.

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
        if self._moved:
            return Identity(self._slots.write(record.encode() + b"\n", crash_points), None)
        try:
            self._slots.write(record.encode() + b"\n", crash_points)
        except NotDurableError as err:
            # The legacy file is still the checkpoint, and the note must not make a slot
            # that may not be on the disk the checkpoint: the state is as it was.
            raise OSError(f"cannot move the checkpoint into {self.path}: {err}") from err
        self._leave_note_in_legacy()
        return self.identity()

    def remove_leftovers(self) -> list[str]:
        """Remove the temporary files of saves that a crash interrupted; their names."""
        if not self.path.parent.is_dir():
            return []
        return [
            *remove_leftovers(self.path.parent, f"{self.path.name}."),
            *remove_leftovers(self.path.parent, f"{self.legacy_path.name}."),
        ]

    def _legacy_identity(self) -> tuple[int, int, int] | None:
        """The legacy file's inode, size and mtime, until this process moved the state."""
        if self._moved:
            return None
        try:
            info = os.stat(self.legacy_path)
        except FileNotFoundError:
            return None
        return info.st_ino, info.st_size, info.st_mtime_ns

    def _load_legacy(self) -> tuple[State | None, bool]:
        """The state in ``checkpoint.json`` (versions 1 and 2), and whether it is the note.

        No state if there is no such file, or if it is the note that the state moved.
        """
        path = self.legacy_path
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None, False
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
        if kind == KIND and version == VERSION and data == _MOVED:
            return None, True
        return self._state(kind, version, data, path), False

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
        """Make ``checkpoint.json`` the note that the state moved, durably.

        After the slot file holds the state: a crash in between leaves the legacy file the
        checkpoint. A note already there may be one a crashed process renamed into place
        without syncing its directory (a power cut could still bring the old file back):
        it is synced too before the legacy file is done with.
        """
        try:
            text = self.legacy_path.read_text()
        except FileNotFoundError:
            text = None
        except (OSError, UnicodeDecodeError):
            text = ""
        if text != _NOTE:
            replace_file(self.legacy_path, _NOTE.encode())
        else:
            fd = os.open(self.legacy_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_directory(self.legacy_path.parent)
        self._moved = True

    def _corrupt(self, why: str, path: Path | None = None) -> CheckpointError:
        """The refusal of a damaged ``path``, with the command that moves the state aside.

        A damaged slot file goes aside with the note beside it, if there is one: the note
        alone says the state moved to a file that is not there, and would stop the next
        start too.
        """
        path = path or self.path
        aside = [path]
        if path == self.path and self.legacy_path.exists():
            aside.append(self.legacy_path)
        command = " && ".join(f"mv {each} {each}.corrupt" for each in aside)
        return CheckpointError(
            f"checkpoint {path} is corrupt: {why}. nodedra does not guess which claims "
            "hold which CPUs. Drain the node's pods that use DRA claims, then move the "
            f"state aside ({command}) and start again."
        )


_MOVED = {"movedTo": FILE_NAME}
"""The data of the legacy file once the state is in the slot file."""
_NOTE = (
    json.dumps(
        {"kind": KIND, "version": VERSION, "data": _MOVED, "checksum": _checksum(VERSION, _MOVED)},
        sort_keys=True,
    )
    + "\n"
)
"""The legacy file's content once the state is in the slot file."""
