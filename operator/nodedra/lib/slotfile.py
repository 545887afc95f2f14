"""A record kept durable by writing it in place, in turn into one of two slots.

Replacing a file (``nodedra.lib.durable``) costs a new file, two fsyncs and a rename on every
write: about half a millisecond on a disk, on every kubelet request. A slot file is made once,
preallocated, and then only overwritten in place, followed by one ``fdatasync`` (the file's
size never changes, so no metadata has to reach the disk with it), about a tenth of that.

Each slot starts with a header line: a sequence number, the record's length and a SHA-256
of both and the record. A reader takes the whole record with the highest sequence number.

What keeps a record safe is which slot a write goes into: never the one holding the newest
record known to be on the disk. A write cut short (a power cut, a kill between the pages of
a write, an error half-way such as ENOSPC where overwriting in place needs new blocks) leaves
its slot torn, and its checksum tells; the write after it (the retry, or the first after a
restart) goes into that torn slot again, with a higher sequence number than either slot's,
so however many writes in a row are cut short, the other slot still holds the last record
whose write returned. The writer knows which slot that is from its own writes; when it does
not (its first write, or another process wrote since) it reads both slots, takes the newest
whole one and syncs the file first, so that what it keeps is on the disk and not only in the
page cache a killed writer left behind. A write whose sync failed is not taken as on the
disk: the next write goes into its slot again.

Readers that do not exclude writers (another process during a rolling update) remember as
seen (``Reading.identity``) only the headers of slots whose records they found whole: a slot
read half copied is read again once its header or record changes, and never taken for one
already seen.

What two slots cannot tell apart from a torn write: the newest slot rotting on the disk after
its write returned (the one before it is read; the disk's own checksums guard against that),
and a sync that failed in another process before this one synced the same file (Linux reports
a failed writeback once, to whoever syncs first).

A record that does not fit its slot makes a new file with slots twice as large, put in place
as ``durable.replace_file`` does; that happens once per doubling of the record.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, NoReturn

from nodedra.lib import faults
from nodedra.lib.durable import NotDurableError, fsync_directory, replace_file

HEADER_SIZE = 128
"""Bytes of a slot's header line (padded with spaces, ends in a newline)."""
MIN_SLOT_SIZE = 64 * 1024
"""The smallest slot: room for a few hundred claims before the file grows."""
_MAGIC = b"nodedra-slot"
_HEADER = re.compile(rb"nodedra-slot (\d{20}) (\d{10}) ([0-9a-f]{64}) *\n")


class Identity(NamedTuple):
    """Which file, and its slots' headers: any write changes it.

    A header is None where the slot's record was not found whole: it is then never equal
    to what the slot holds, so a reader reads the file again.
    """

    inode: int
    headers: tuple[bytes | None, bytes | None]


class Reading(NamedTuple):
    """The newest whole record, and the identity of the file it was read from."""

    record: bytes
    identity: Identity


class DamagedError(ValueError):
    """The file holds no whole record; the message says what is wrong with it."""


@dataclass(frozen=True)
class _Known:
    """What a writer knows of the file: as of ``identity``, slot ``kept`` is on the disk."""

    identity: Identity
    kept: int | None
    """The slot holding the newest record known to be on the disk; None: neither."""


class _Slot(NamedTuple):
    header: bytes
    sequence: int
    """The header's sequence number, whole record or not; 0 if it is no header."""
    record: bytes | None
    """None unless the slot holds a whole record."""


class SlotFile:
    """The slot file at ``path``: ``read`` the newest whole record, ``write`` a new one."""

    def __init__(self, path: Path, *, mode: int = 0o600, dir_mode: int = 0o700) -> None:
        self.path = path
        self._mode = mode
        self._dir_mode = dir_mode
        self._known: _Known | None = None

    def read(self) -> bytes | None:
        """The record written last; None if there is no file; DamagedError if none is whole."""
        reading = self.reading()
        return reading.record if reading is not None else None

    def reading(self) -> Reading | None:
        """The newest whole record and what was seen of the file; None if there is none."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            inode = os.fstat(fd).st_ino
            data = _read_all(fd)
        finally:
            os.close(fd)
        size = len(data)
        if size % 2 or size // 2 < HEADER_SIZE:
            raise DamagedError(f"its size ({size} bytes) is not that of two slots")
        slots = (_parse(data[: size // 2]), _parse(data[size // 2 :]))
        newest = _newest(slots)
        if newest is None:
            raise DamagedError("neither of its two slots holds a whole record")
        record = slots[newest].record
        assert record is not None
        return Reading(record, _seen(inode, slots))

    def identity(self) -> Identity | None:
        """What changes whenever anyone writes the file; None if there is none.

        Cheap (two header reads), for a process that must notice another's writes: compare
        it with a ``Reading``'s or a ``write``'s.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            return self._headers(fd)
        finally:
            os.close(fd)

    def write(self, record: bytes, crash_points: faults.SlotPoints | None = None) -> Identity:
        """Make ``record`` the newest, durably, and return the file's identity; raise on failure.

        An OSError leaves the record before it the newest (the slot written is torn);
        ``NotDurableError`` says the write is done and readers see ``record``, but it may
        not survive a power cut (the sync failed, or the write failed after its last byte).
        """
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return self._create(record, 1)
        try:
            return self._write(fd, record, crash_points)
        finally:
            os.close(fd)

    def _write(self, fd: int, record: bytes, crash_points: faults.SlotPoints | None) -> Identity:
        size = os.fstat(fd).st_size
        slot = size // 2
        if size % 2 or slot < HEADER_SIZE:
            raise DamagedError(f"{self.path}: its size ({size} bytes) is not that of two slots")
        known = self._known
        current = self._headers(fd)
        if known is None or known.identity != current:
            known = self._learn(fd, slot)
        sequences = [_parse(header or b"").sequence for header in current.headers]
        sequence = 1 + max(sequences)
        if HEADER_SIZE + len(record) > slot:
            return self._create(record, sequence)
        target = 1 - known.kept if known.kept is not None else sequences.index(min(sequences))
        entry = _header(sequence, record) + record
        try:
            _write_all(fd, entry, target * slot)
        except OSError as err:
            self._cut_short(fd, err, at=target * slot, slot=slot, record=record, kept=known.kept)
        written = list(known.identity.headers)
        written[target] = entry[:HEADER_SIZE]
        identity = Identity(known.identity.inode, (written[0], written[1]))
        try:
            if crash_points is not None:
                faults.crash_point(crash_points.written)
            os.fdatasync(fd)
            if crash_points is not None:
                faults.crash_point(crash_points.synced)
        except Exception as err:
            self._known = _Known(identity, known.kept)  # the next write goes here again
            raise NotDurableError(
                f"{self.path} has its new content, but it may not survive a power cut: {err}"
            ) from err
        self._known = _Known(identity, target)
        return identity

    def _cut_short(
        self, fd: int, err: OSError, *, at: int, slot: int, record: bytes, kept: int | None
    ) -> NoReturn:
        """A write into the slot ``at`` failed part-way: raise what it left.

        As far as anyone can tell the slot is torn, and the next write goes into it again;
        unless the write went through in the end (what it still lacked was there already):
        then readers take it for the newest, and NotDurableError says so.
        """
        try:
            whole = self._slot_at(fd, at, slot).record == record
            self._known = _Known(self._headers(fd), kept)
        except OSError:
            self._known = None  # the next write reads both slots again
            raise err from None
        if not whole:
            raise err
        raise NotDurableError(
            f"{self.path} has its new content, but its write reported an error: {err}"
        ) from err

    def _learn(self, fd: int, slot: int) -> _Known:
        """Read both slots and make the newest whole one durable: the one to keep.

        The file's name too: the process that made it may have been killed before it
        synced the directory, and what this one writes next (another file's rename, such
        as the checkpoint's note) must not reach the disk without it.
        """
        slots = (self._slot_at(fd, 0, slot), self._slot_at(fd, slot, slot))
        os.fdatasync(fd)
        fsync_directory(self.path.parent)
        return _Known(_seen(os.fstat(fd).st_ino, slots), _newest(slots))

    def _slot_at(self, fd: int, start: int, slot: int) -> _Slot:
        header = os.pread(fd, HEADER_SIZE, start)
        match = _HEADER.fullmatch(header)
        length = int(match[2]) if match else 0
        body = os.pread(fd, min(length, slot - HEADER_SIZE), start + HEADER_SIZE)
        return _parse(header + body)

    def _headers(self, fd: int) -> Identity:
        """The file's identity as it is now, both headers as they are."""
        info = os.fstat(fd)
        slot = info.st_size // 2
        first, second = os.pread(fd, HEADER_SIZE, 0), os.pread(fd, HEADER_SIZE, slot)
        return Identity(info.st_ino, (first, second))

    def _create(self, record: bytes, sequence: int) -> Identity:
        """A new file, with slots large enough for ``record`` twice over, put in place.

        The record goes into its first slot; the second is empty (zeros, no header).
        """
        slot = MIN_SLOT_SIZE
        while slot < 2 * (HEADER_SIZE + len(record)):
            slot *= 2
        data = bytearray(2 * slot)
        entry = _header(sequence, record) + record
        data[: len(entry)] = entry
        replace_file(self.path, bytes(data), mode=self._mode, dir_mode=self._dir_mode)
        identity = Identity(self.path.stat().st_ino, (entry[:HEADER_SIZE], bytes(HEADER_SIZE)))
        self._known = _Known(identity, 0)
        return identity


def _checksum(sequence: int, record: bytes) -> str:
    return hashlib.sha256(b"%d\n" % sequence + record).hexdigest()


def _header(sequence: int, record: bytes) -> bytes:
    checksum = _checksum(sequence, record).encode()
    line = b"%s %020d %010d %s" % (_MAGIC, sequence, len(record), checksum)
    return line.ljust(HEADER_SIZE - 1) + b"\n"


def _parse(slot: bytes) -> _Slot:
    """A slot's header and, if it is whole, its record."""
    header = slot[:HEADER_SIZE]
    match = _HEADER.fullmatch(header)
    if match is None:
        return _Slot(header, 0, None)
    sequence, length = int(match[1]), int(match[2])
    record = slot[HEADER_SIZE : HEADER_SIZE + length]
    if len(record) != length or _checksum(sequence, record) != match[3].decode():
        return _Slot(header, sequence, None)
    return _Slot(header, sequence, record)


def _newest(slots: tuple[_Slot, _Slot]) -> int | None:
    """Which slot holds the newest whole record; None if neither holds one."""
    whole = [(s.sequence, i) for i, s in enumerate(slots) if s.record is not None]
    return max(whole)[1] if whole else None


def _seen(inode: int, slots: tuple[_Slot, _Slot]) -> Identity:
    """The identity of a file read whole: the headers of its whole slots only."""
    first, second = (s.header if s.record is not None else None for s in slots)
    return Identity(inode, (first, second))


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
