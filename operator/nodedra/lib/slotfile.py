"""A record kept durable by writing it in place, in turn into one of two slots.

Replacing a file (``nodedra.lib.durable``) costs a new file, two fsyncs and a rename on every
write: about half a millisecond on a disk, on every kubelet request. A slot file is made once,
preallocated, and then only overwritten in place: each write goes into the slot that does
not hold the newest record, followed by one ``fdatasync`` (the file's size never changes, so
no metadata has to reach the disk with it), about a tenth of that.

Each slot starts with a header line: a sequence number, the record's length and a SHA-256
of both and the record. A reader takes the whole record with the highest sequence number.
A write cut short (a power cut, or a kill between the pages of a write) leaves its slot
torn, and its checksum tells: the other slot still holds the record before it, the last one
whose write returned, so nothing a caller was told is durable is lost. That the newest slot
could rot on the disk after its write returned and the older one be read instead is the one
thing two slots cannot tell from a torn write; the disk's own checksums are what guards it.

A record that does not fit its slot makes a new file with slots twice as large, put in place
as ``durable.replace_file`` does; that happens once per doubling of the record.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from nodedra.lib import faults
from nodedra.lib.durable import NotDurableError, replace_file

HEADER_SIZE = 128
"""Bytes of a slot's header line (padded with spaces, ends in a newline)."""
MIN_SLOT_SIZE = 64 * 1024
"""The smallest slot: room for a few hundred claims before the file grows."""
_MAGIC = b"nodedra-slot"
_HEADER = re.compile(rb"nodedra-slot (\d{20}) (\d{10}) ([0-9a-f]{64}) *\n")

Identity = tuple[int, bytes, bytes]
"""Which file, and both slots' headers: any write changes it."""


class DamagedError(ValueError):
    """The file holds no whole record; the message says what is wrong with it."""


class SlotFile:
    """The slot file at ``path``: ``read`` the newest whole record, ``write`` a new one."""

    def __init__(self, path: Path, *, mode: int = 0o600, dir_mode: int = 0o700) -> None:
        self.path = path
        self._mode = mode
        self._dir_mode = dir_mode

    def read(self) -> bytes | None:
        """The record written last; None if there is no file; DamagedError if none is whole."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        slot = len(data) // 2
        if len(data) % 2 or slot < HEADER_SIZE:
            raise DamagedError(f"its size ({len(data)} bytes) is not that of two slots")
        records = [_record(data[start : start + slot]) for start in (0, slot)]
        whole = [record for record in records if record is not None]
        if not whole:
            raise DamagedError("neither of its two slots holds a whole record")
        return max(whole)[1]

    def write(self, record: bytes, crash_points: faults.SlotPoints | None = None) -> None:
        """Make ``record`` the newest, durably; raise on failure.

        An OSError before the slot is whole leaves the record before it the newest;
        ``NotDurableError`` says the write is done and readers see ``record``, but it may
        not survive a power cut (the sync failed).
        """
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            self._create(record, 1)
            return
        try:
            size = os.fstat(fd).st_size
            slot = size // 2
            sequence = 1 + max(_sequence(os.pread(fd, HEADER_SIZE, at)) for at in (0, slot))
            if size % 2 or HEADER_SIZE + len(record) > slot:
                os.close(fd)
                fd = -1
                self._create(record, sequence)
                return
            _write_all(fd, _header(sequence, record) + record, (sequence % 2) * slot)
            try:
                if crash_points is not None:
                    faults.crash_point(crash_points.written)
                os.fdatasync(fd)
                if crash_points is not None:
                    faults.crash_point(crash_points.synced)
            except Exception as err:
                raise NotDurableError(
                    f"{self.path} has its new content, but it may not survive a power cut: {err}"
                ) from err
        finally:
            if fd >= 0:
                os.close(fd)

    def identity(self) -> Identity | None:
        """What changes whenever anyone writes the file; None if there is none.

        Cheap (two header reads), for a process that must notice another's writes.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            info = os.fstat(fd)
            slot = info.st_size // 2
            return info.st_ino, os.pread(fd, HEADER_SIZE, 0), os.pread(fd, HEADER_SIZE, slot)
        finally:
            os.close(fd)

    def _create(self, record: bytes, sequence: int) -> None:
        """A new file, with slots large enough for ``record`` twice over, put in place."""
        slot = MIN_SLOT_SIZE
        while slot < 2 * (HEADER_SIZE + len(record)):
            slot *= 2
        data = bytearray(2 * slot)
        start = (sequence % 2) * slot
        entry = _header(sequence, record) + record
        data[start : start + len(entry)] = entry
        replace_file(self.path, bytes(data), mode=self._mode, dir_mode=self._dir_mode)


def _checksum(sequence: int, record: bytes) -> str:
    return hashlib.sha256(b"%d\n" % sequence + record).hexdigest()


def _header(sequence: int, record: bytes) -> bytes:
    checksum = _checksum(sequence, record).encode()
    line = b"%s %020d %010d %s" % (_MAGIC, sequence, len(record), checksum)
    return line.ljust(HEADER_SIZE - 1) + b"\n"


def _sequence(header: bytes) -> int:
    """The sequence number a header names; 0 if it is not a header."""
    match = _HEADER.fullmatch(header)
    return int(match[1]) if match else 0


def _record(slot: bytes) -> tuple[int, bytes] | None:
    """The sequence number and record of a slot, or None if it is not whole."""
    match = _HEADER.fullmatch(slot[:HEADER_SIZE])
    if match is None:
        return None
    sequence, length = int(match[1]), int(match[2])
    record = slot[HEADER_SIZE : HEADER_SIZE + length]
    if len(record) != length or _checksum(sequence, record) != match[3].decode():
        return None
    return sequence, record


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
