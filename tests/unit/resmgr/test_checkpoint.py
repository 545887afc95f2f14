"""The checkpoint: round trip, refusing what it cannot trust, migrations, the legacy file."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from nodedra.lib import durable
from nodedra.lib.slotfile import SlotFile
from nodedra.resmgr import checkpoint as cp
from nodedra.resmgr.checkpoint import Checkpoint, CheckpointError, State

STATE = State("topology-aware", "topology-aware.nri.io", {"u1": {"grants": []}})


@pytest.fixture
def checkpoint(tmp_path: Path) -> Checkpoint:
    return Checkpoint(tmp_path / "state" / cp.FILE_NAME)


def write_legacy(checkpoint: Checkpoint, version: int, data: dict[str, Any]) -> None:
    """A ``checkpoint.json`` as nodedra of schema ``version`` wrote it."""
    checkpoint.legacy_path.parent.mkdir(parents=True, exist_ok=True)
    document = {"kind": cp.KIND, "version": version, "data": data}
    document["checksum"] = cp._checksum(version, data)
    checkpoint.legacy_path.write_text(json.dumps(document))


def rewrite(checkpoint: Checkpoint, change: Any) -> None:
    """Save a record of the checkpoint's document changed by ``change``."""
    document = {"kind": cp.KIND, "version": cp.VERSION, "data": {"policy": "static"}}
    change(document)
    SlotFile(checkpoint.path).write(json.dumps(document).encode())


def test_missing_checkpoint_is_a_first_start(checkpoint: Checkpoint) -> None:
    assert checkpoint.load() is None


def test_round_trip(checkpoint: Checkpoint) -> None:
    checkpoint.save(STATE)
    assert checkpoint.load() == STATE
    assert sorted(os.listdir(checkpoint.path.parent)) == [cp.LEGACY_NAME, cp.FILE_NAME]
    newer = State("topology-aware", "topology-aware.nri.io", {})
    checkpoint.save(newer)
    assert checkpoint.load() == newer


def test_a_save_that_fails_keeps_the_state_before(
    checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.save(STATE)

    def fail(*args: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "pwrite", fail)
    with pytest.raises(OSError, match="Input/output error"):
        checkpoint.save(State("topology-aware", "topology-aware.nri.io", {}))
    monkeypatch.undo()
    assert checkpoint.load() == STATE


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(kind="other"), "not a nodedra.checkpoint document"),
        (lambda d: d.pop("data"), "its record is not a checkpoint document"),
        (lambda d: d.update(data=[]), "not a nodedra.checkpoint document"),
        (lambda d: d["data"].pop("policy"), "missing or malformed field"),
    ],
)
def test_a_record_that_is_no_checkpoint_is_refused(
    checkpoint: Checkpoint, change: Any, message: str
) -> None:
    rewrite(checkpoint, change)
    with pytest.raises(CheckpointError, match=message) as caught:
        checkpoint.load()
    assert "is corrupt" in str(caught.value)
    assert f"mv {checkpoint.path} {checkpoint.path}.corrupt" in str(caught.value)


def test_a_damaged_file_is_refused(checkpoint: Checkpoint) -> None:
    checkpoint.save(STATE)
    checkpoint.save(STATE)
    checkpoint.path.write_bytes(checkpoint.path.read_bytes().replace(b"u1", b"u2"))
    with pytest.raises(CheckpointError, match="neither of its two slots") as caught:
        checkpoint.load()
    # The command given moves the note aside too: the next start is a first start.
    command = re.search(r"\((mv .*)\) and start again", str(caught.value))
    assert command is not None, caught.value
    for move in command.group(1).split(" && "):
        _, source, target = move.split(" ")
        os.rename(source, target)
    assert Checkpoint(checkpoint.path).load() is None


def test_newer_version_is_refused(checkpoint: Checkpoint) -> None:
    rewrite(checkpoint, lambda d: d.update(version=cp.VERSION + 1))
    with pytest.raises(CheckpointError, match="written by a newer nodedra"):
        checkpoint.load()


def test_older_versions_are_migrated(
    checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older schema goes through every migration in turn."""
    monkeypatch.setattr(cp, "VERSION", 3)
    monkeypatch.setattr(
        cp,
        "MIGRATIONS",
        {
            1: lambda d: {
                "policy": d["policyName"],
                "driver": d["driverName"],
                "claims": d["held"],
            },
            2: lambda d: {
                **d,
                "claims": {uid: {"grants": g} for uid, g in d["claims"].items()},
                "reservations": {},
            },
        },
    )
    old = {"policyName": "static", "driverName": "static.nri.io", "held": {"u1": []}}
    write_legacy(checkpoint, 1, old)
    assert checkpoint.load() == State("static", "static.nri.io", {"u1": {"grants": []}})


def test_a_version_1_checkpoint_is_read(checkpoint: Checkpoint) -> None:
    """What nodedra wrote before it recorded reservations still loads, with none."""
    claims = {"u1": {"grants": [{"request": "r", "device": "cpu003", "cpus": "3"}]}}
    data = {"policy": "static", "driver": "static.nri.io", "claims": claims}
    write_legacy(checkpoint, 1, data)
    assert checkpoint.load() == State("static", "static.nri.io", claims, {})


def test_reservations_are_kept(checkpoint: Checkpoint) -> None:
    reservations = {"u1": {"namespace": "ns", "name": "c", "pods": ["p1"]}}
    checkpoint.save(State("static", "static.nri.io", {"u1": {"grants": []}}, reservations))
    loaded = checkpoint.load()
    assert loaded is not None
    assert loaded.reservations == reservations


def test_version_without_migration_is_refused(
    checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint.save(STATE)
    monkeypatch.setattr(cp, "VERSION", cp.VERSION + 1)
    with pytest.raises(CheckpointError, match="cannot migrate"):
        checkpoint.load()


def test_a_save_that_fails_once_written_says_the_new_state_is_in_place(
    checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync fails: the new state is what a reader gets, and the error says so
    (NotDurableError), not that the checkpoint is as it was."""
    checkpoint.save(STATE)
    newer = State("topology-aware", "topology-aware.nri.io", {})

    def fail(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", fail)
    with pytest.raises(durable.NotDurableError, match="may not survive a power cut") as caught:
        checkpoint.save(newer)
    assert isinstance(caught.value.__cause__, OSError)
    assert checkpoint.load() == newer


# -- checkpoint.json, as schema versions 1 and 2 kept it --------------------------------------

VERSION_2: dict[str, Any] = {
    "policy": "static",
    "driver": "static.nri.io",
    "claims": {"u1": {"grants": [{"request": "r", "device": "cpu003", "cpus": "3"}]}},
    "reservations": {"u1": {"namespace": "ns", "name": "c", "pods": ["p1"]}},
}


def test_a_legacy_checkpoint_is_read_and_then_left_a_note(checkpoint: Checkpoint) -> None:
    """The first save moves the state into the slot file and leaves in checkpoint.json a
    note that nodedra of schema version 2 refuses as newer (so an older instance still
    running during a rolling update stops acting on books it can no longer see)."""
    write_legacy(checkpoint, 2, VERSION_2)
    state = checkpoint.load()
    assert state == State("static", "static.nri.io", VERSION_2["claims"], VERSION_2["reservations"])
    checkpoint.save(state)
    assert checkpoint.load() == state
    note = json.loads(checkpoint.legacy_path.read_text())
    assert note["version"] == 3
    assert note["data"] == {"movedTo": cp.FILE_NAME}
    assert note["checksum"] == cp._checksum(3, note["data"]), "an old nodedra checks it first"
    assert sorted(os.listdir(checkpoint.path.parent)) == sorted([cp.FILE_NAME, cp.LEGACY_NAME])


def test_an_older_nodedra_refuses_the_note(
    checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What nodedra of schema version 2 reads in checkpoint.json: written by a newer one."""
    write_legacy(checkpoint, 2, VERSION_2)
    checkpoint.save(STATE)
    old = Checkpoint(checkpoint.path.with_name("elsewhere.slots"))  # sees only the legacy file
    monkeypatch.setattr(cp, "VERSION", 2)
    with pytest.raises(CheckpointError, match="schema version 3, written by a newer nodedra"):
        old.load()


def test_a_node_that_never_had_a_legacy_file_gets_the_note_too(
    checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nodedra of schema version 2 started on a node this version ran on (a rollback that
    did not drain the claims) refuses to start rather than hand out CPUs it cannot know are
    held: it would read no checkpoint.json as a first start."""
    checkpoint.save(STATE)
    old = Checkpoint(checkpoint.path.with_name("elsewhere.slots"))  # sees only the legacy file
    monkeypatch.setattr(cp, "VERSION", 2)
    with pytest.raises(CheckpointError, match="schema version 3, written by a newer nodedra"):
        old.load()


def test_the_note_without_the_slot_file_is_refused(checkpoint: Checkpoint) -> None:
    write_legacy(checkpoint, 2, VERSION_2)
    checkpoint.save(STATE)
    checkpoint.path.unlink()
    with pytest.raises(CheckpointError, match="it says the state moved to"):
        checkpoint.load()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_text("{not json"), "not a checkpoint document"),
        (lambda p: p.write_text("[]"), "not a checkpoint document"),
        (lambda p: p.write_bytes(bytes(range(256))), "not text"),
        (lambda p: p.write_text(p.read_text().replace("cpu003", "cpu004")), "checksum does not"),
    ],
)
def test_a_damaged_legacy_checkpoint_is_refused(
    checkpoint: Checkpoint, damage: Any, message: str
) -> None:
    write_legacy(checkpoint, 2, VERSION_2)
    damage(checkpoint.legacy_path)
    with pytest.raises(CheckpointError, match=message) as caught:
        checkpoint.load()
    assert f"mv {checkpoint.legacy_path} {checkpoint.legacy_path}.corrupt" in str(caught.value)


def test_leftovers_of_both_files_are_removed(checkpoint: Checkpoint) -> None:
    checkpoint.save(STATE)
    for name in (f".{cp.FILE_NAME}.x1.tmp", f".{cp.LEGACY_NAME}.x2.tmp"):
        (checkpoint.path.parent / name).write_text("")
    assert sorted(checkpoint.remove_leftovers()) == sorted(
        [f".{cp.FILE_NAME}.x1.tmp", f".{cp.LEGACY_NAME}.x2.tmp"]
    )
    assert sorted(os.listdir(checkpoint.path.parent)) == [cp.LEGACY_NAME, cp.FILE_NAME]


def test_the_legacy_name_is_not_the_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="legacy"):
        Checkpoint(tmp_path / cp.LEGACY_NAME)


def test_until_the_note_is_in_place_the_legacy_file_is_the_checkpoint(
    checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state moves in two writes: the slot file, then the note. If the note never
    comes (a kill, OOM, a full disk in between), the older instance still serving during
    the rolling update goes on committing to checkpoint.json: it is what a restart reads,
    and what an instance catches up with, until it says the state moved."""
    write_legacy(checkpoint, 2, VERSION_2)
    state = checkpoint.load()
    assert state is not None

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cp, "replace_file", full)
    with pytest.raises(OSError, match="No space left") as caught:
        checkpoint.save(State(state.policy, state.driver, {**state.claims, "u2": {}}))
    assert not isinstance(caught.value, durable.NotDurableError), "the state did not move"
    monkeypatch.undo()
    seen = checkpoint.identity()
    later = {**VERSION_2, "claims": {**VERSION_2["claims"], "u3": {"grants": []}}}
    write_legacy(checkpoint, 2, later)  # the older instance commits
    assert checkpoint.identity() != seen, "its commit goes unnoticed"
    for reader in (checkpoint, Checkpoint(checkpoint.path)):
        loaded = reader.load()
        assert loaded is not None
        assert set(loaded.claims) == {"u1", "u3"}
    checkpoint.save(State(state.policy, state.driver, later["claims"], {}))
    assert json.loads(checkpoint.legacy_path.read_text())["data"] == {"movedTo": cp.FILE_NAME}
    assert set(Checkpoint(checkpoint.path).load().claims) == {"u1", "u3"}  # type: ignore[union-attr]
