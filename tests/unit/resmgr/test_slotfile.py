"""The slot file: the newest whole record wins, a torn write loses only itself, it grows."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from nodedra.lib import durable, slotfile
from nodedra.lib.slotfile import HEADER_SIZE, MIN_SLOT_SIZE, DamagedError, SlotFile


@pytest.fixture
def slots(tmp_path: Path) -> SlotFile:
    return SlotFile(tmp_path / "state" / "record.slots")


def test_no_file_is_no_record(slots: SlotFile) -> None:
    assert slots.read() is None
    assert slots.identity() is None


def test_the_newest_record_is_read(slots: SlotFile) -> None:
    for n in range(5):
        slots.write(b"record %d" % n)
        assert slots.read() == b"record %d" % n
    assert slots.path.stat().st_size == 2 * MIN_SLOT_SIZE
    assert os.listdir(slots.path.parent) == [slots.path.name]


def test_writes_go_in_place_into_the_older_slot(slots: SlotFile) -> None:
    slots.write(b"first")
    inode = slots.path.stat().st_ino
    slots.write(b"second")
    slots.write(b"third")
    assert slots.path.stat().st_ino == inode, "a write made a new file"
    data = slots.path.read_bytes()
    # In turn: the first into slot 0, the second beside it, the third over the first.
    assert b"third" in data[:MIN_SLOT_SIZE]
    assert b"second" in data[MIN_SLOT_SIZE:], "the record before the newest is kept"
    assert b"first" not in data


def test_every_write_changes_the_identity(slots: SlotFile) -> None:
    seen = set()
    for _ in range(4):
        slots.write(b"same")
        seen.add(slots.identity())
    assert len(seen) == 4


def tear_newest(slots: SlotFile, record: bytes) -> None:
    """Damage the slot holding ``record`` after its header, as a write cut short would."""
    data = bytearray(slots.path.read_bytes())
    at = data.index(record)
    data[at : at + len(record)] = b"\0" * len(record)
    slots.path.write_bytes(bytes(data))


def test_a_torn_newest_slot_leaves_the_record_before_it(slots: SlotFile) -> None:
    slots.write(b"acknowledged")
    slots.write(b"cut short")
    tear_newest(slots, b"cut short")
    assert slots.read() == b"acknowledged"
    slots.write(b"retried")  # into the torn slot again, with the next sequence number
    assert slots.read() == b"retried"
    slots.write(b"after")
    assert slots.read() == b"after"


def test_two_writes_cut_short_in_a_row_leave_the_last_whole_record(slots: SlotFile) -> None:
    """The write after a torn one goes into the torn slot again, never over the only whole
    record: a second write cut short by a power cut (the first after the restart) loses
    only itself too."""
    slots.write(b"acknowledged")
    for attempt in (b"cut short", b"cut short again"):
        SlotFile(slots.path).write(attempt)  # the process that wrote it is gone
        tear_newest(slots, attempt)  # and the power cut kept its header only
        assert SlotFile(slots.path).read() == b"acknowledged"
    SlotFile(slots.path).write(b"after")
    assert slots.read() == b"after"
    assert b"acknowledged" in slots.path.read_bytes(), "the slot before the newest is kept"


def test_writes_that_fail_half_way_again_and_again_keep_the_last_whole_record(
    slots: SlotFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short write and then ENOSPC (a copy-on-write filesystem overwrites in place into
    new blocks), several times in a row: every retry goes into the slot it tore."""
    slots.write(b"acknowledged")
    real = os.pwrite

    def half_then_full(fd: int, data: Any, offset: int) -> int:
        real(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", half_then_full)
    for attempt in range(3):
        with pytest.raises(OSError, match="No space left") as caught:
            slots.write(b"attempt %d " % attempt * 500)
        assert not isinstance(caught.value, durable.NotDurableError)
        assert SlotFile(slots.path).read() == b"acknowledged"
    monkeypatch.undo()
    slots.write(b"space again")
    assert SlotFile(slots.path).read() == b"space again"


def test_a_write_cut_short_by_an_error_leaves_the_record_before_it(
    slots: SlotFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    slots.write(b"acknowledged")
    real = os.pwrite

    def half_then_fail(fd: int, data: Any, offset: int) -> int:
        if len(data) > 8:
            real(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "pwrite", half_then_fail)
    with pytest.raises(OSError, match="Input/output error") as caught:
        slots.write(b"x" * 4000)
    assert not isinstance(caught.value, durable.NotDurableError)
    monkeypatch.undo()
    assert slots.read() == b"acknowledged"


def test_a_failed_sync_says_the_new_record_is_in_place(
    slots: SlotFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    slots.write(b"old")

    def fail(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", fail)
    with pytest.raises(durable.NotDurableError, match="may not survive a power cut"):
        slots.write(b"new")
    assert slots.read() == b"new"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: b"", "is not that of two slots"),
        (lambda data: data[:-1], "is not that of two slots"),
        (lambda data: bytes(range(256)), "neither of its two slots"),
        (lambda data: data.replace(b"record", b"recorz"), "neither of its two slots"),
    ],
)
def test_a_file_without_a_whole_record_is_refused(
    slots: SlotFile, damage: Any, message: str
) -> None:
    slots.write(b"record 1")
    slots.write(b"record 2")
    slots.path.write_bytes(damage(slots.path.read_bytes()))
    with pytest.raises(DamagedError, match=message):
        slots.read()


def test_a_record_larger_than_a_slot_grows_the_file(slots: SlotFile) -> None:
    slots.write(b"small")
    large = b"L" * (MIN_SLOT_SIZE + 1)
    slots.write(large)
    assert slots.read() == large
    size = slots.path.stat().st_size
    assert size >= 4 * (HEADER_SIZE + len(large)), "room for the record twice, in each slot"
    inode = slots.path.stat().st_ino
    slots.write(b"small again")
    assert slots.read() == b"small again"
    assert slots.path.stat().st_ino == inode
    assert os.listdir(slots.path.parent) == [slots.path.name]


def test_the_header_names_sequence_length_and_checksum(slots: SlotFile) -> None:
    slots.write(b"abc")
    data = slots.path.read_bytes()
    slot = data[:MIN_SLOT_SIZE]  # a new file's record goes into slot 0
    header = slot[:HEADER_SIZE]
    assert header.startswith(b"nodedra-slot 00000000000000000001 0000000003 ")
    assert header.endswith(b"\n")
    assert slot[HEADER_SIZE : HEADER_SIZE + 3] == b"abc"
    assert slotfile._parse(slot).record == b"abc"
    assert data[MIN_SLOT_SIZE:] == bytes(MIN_SLOT_SIZE), "the other slot is empty"
