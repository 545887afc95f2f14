"""The checkpoint: round trip, atomic replacement, refusing what it cannot trust, migrations."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from nodedra.lib import durable
from nodedra.resmgr import checkpoint as cp
from nodedra.resmgr.checkpoint import Checkpoint, CheckpointError, State

STATE = State("topology-aware", "topology-aware.nri.io", {"u1": {"grants": []}})


@pytest.fixture
def checkpoint(tmp_path: Path) -> Checkpoint:
    return Checkpoint(tmp_path / "state" / "checkpoint.json")


def test_missing_checkpoint_is_a_first_start(checkpoint: Checkpoint) -> None:
    assert checkpoint.load() is None


def test_round_trip(checkpoint: Checkpoint) -> None:
    checkpoint.save(STATE)
    assert checkpoint.load() == STATE
    assert os.listdir(checkpoint.path.parent) == ["checkpoint.json"]
    document = json.loads(checkpoint.path.read_text())
    assert (document["kind"], document["version"]) == ("nodedra.checkpoint", cp.VERSION)


def test_save_replaces_atomically(checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint.save(STATE)
    before = checkpoint.path.read_bytes()

    def fail(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(State("topology-aware", "topology-aware.nri.io", {}))
    assert checkpoint.path.read_bytes() == before
    assert os.listdir(checkpoint.path.parent) == ["checkpoint.json"], "temp file left behind"


def tamper(checkpoint: Checkpoint, change: Any) -> None:
    document = json.loads(checkpoint.path.read_text())
    change(document)
    checkpoint.path.write_text(json.dumps(document))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_text("{not json"), "not a checkpoint document"),
        (lambda p: p.write_text("[]"), "not a checkpoint document"),
        (lambda p: p.write_text(p.read_text()[:40]), "not a checkpoint document"),
        (
            lambda p: p.write_text(p.read_text().replace('"u1"', '"u2"')),
            "checksum does not match",
        ),
        (
            lambda p: p.write_text(p.read_text().replace("nodedra.checkpoint", "other")),
            "not a nodedra.checkpoint document",
        ),
    ],
)
def test_corrupt_checkpoint_is_refused(checkpoint: Checkpoint, damage: Any, message: str) -> None:
    checkpoint.save(STATE)
    damage(checkpoint.path)
    with pytest.raises(CheckpointError, match=message) as caught:
        checkpoint.load()
    assert "is corrupt" in str(caught.value)
    assert "move the file" in str(caught.value)


def test_newer_version_is_refused(checkpoint: Checkpoint) -> None:
    checkpoint.save(STATE)

    def newer(document: dict[str, Any]) -> None:
        document["version"] = cp.VERSION + 1
        document["checksum"] = cp._checksum(document["version"], document["data"])

    tamper(checkpoint, newer)
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
    checkpoint.path.parent.mkdir(parents=True)
    checkpoint.path.write_text(
        json.dumps({"kind": cp.KIND, "version": 1, "data": old, "checksum": cp._checksum(1, old)})
    )
    assert checkpoint.load() == State("static", "static.nri.io", {"u1": {"grants": []}})


def test_a_version_1_checkpoint_is_read(checkpoint: Checkpoint) -> None:
    """What nodedra wrote before it recorded reservations still loads, with none."""
    claims = {"u1": {"grants": [{"request": "r", "device": "cpu003", "cpus": "3"}]}}
    data = {"policy": "static", "driver": "static.nri.io", "claims": claims}
    checkpoint.path.parent.mkdir(parents=True)
    checkpoint.path.write_text(
        json.dumps({"kind": cp.KIND, "version": 1, "data": data, "checksum": cp._checksum(1, data)})
    )
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


def test_a_save_that_fails_after_the_rename_says_the_new_state_is_in_place(
    checkpoint: Checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The directory's fsync fails: the new state is what a reader gets, and the error
    says so (NotDurableError), not that the checkpoint is as it was."""
    checkpoint.save(STATE)
    newer = State("topology-aware", "topology-aware.nri.io", {})

    def fail(directory: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(durable, "fsync_directory", fail)
    with pytest.raises(durable.NotDurableError, match="may not survive a power cut") as caught:
        checkpoint.save(newer)
    assert isinstance(caught.value.__cause__, OSError)
    assert checkpoint.load() == newer
    assert os.listdir(checkpoint.path.parent) == ["checkpoint.json"]
