"""What a save does to a directory, and every state a crash can leave it in.

A `Recorder` runs real code on a real directory and watches the system calls that change
files or make them durable (``os.write``, ``os.pwrite``, ``os.replace``, ``os.unlink``,
``os.fsync``, ``os.fdatasync``). After each one it compares the directory with what it was:
a directory entry that changed (a file made, renamed over, removed) is one *unit*, a 4 KiB
page of a file whose bytes changed is one unit, a file's new size is one. A sync of a file
makes its units durable, a sync of the directory its entries.

`crash_states` enumerates what a power cut can leave: at every point of the record, the
durable units, plus any subset of those not yet synced (the kernel writes dirty pages back
in any order, and a rename may reach the disk before or after a page). Only units the
reader can see are enumerated: those of the files bound to the names it reads, and their
directory entries; a temporary file nobody renamed yet is not read by anyone.

This is a model of the disk (a page is written whole or not at all, which is what the
sector-atomic writes of disks and the page cache's writeback give), not a fake of anything:
the code under test runs unchanged on a real filesystem.
"""

from __future__ import annotations

import functools
import itertools
import os
import stat
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PAGE = 4096


Inode = Hashable
"""A file of the model: the real inode number, tagged by the recording that saw it made
(numbers are reused), or the file of an earlier model the directory was made from."""


@dataclass(frozen=True)
class Snapshot:
    """A directory: its names bound to files, and the bytes of each file."""

    names: dict[str, Inode]
    contents: dict[Inode, bytes]

    @classmethod
    def of(cls, directory: Path, inode: Callable[[int], Inode]) -> Snapshot:
        names: dict[str, Inode] = {}
        contents: dict[Inode, bytes] = {}
        for entry in os.scandir(directory):
            if entry.is_file(follow_symlinks=False):
                names[entry.name] = inode(entry.inode())
                contents[names[entry.name]] = Path(entry.path).read_bytes()
        return cls(names, contents)

    def materialize(self, directory: Path) -> dict[int, Inode]:
        """Make ``directory`` hold exactly these files; their real inodes, to ours."""
        for entry in os.scandir(directory):
            os.unlink(entry.path)
        ids = {}
        for name, inode in self.names.items():
            path = directory / name
            path.write_bytes(self.contents[inode])
            ids[path.stat().st_ino] = inode
        return ids


@dataclass(frozen=True)
class Unit:
    """One change that reaches the disk whole or not at all."""

    kind: str
    """"name" (``key`` a name, ``value`` its inode or None), "page" (``key`` (inode,
    page index), ``value`` its bytes), or "size" (``key`` an inode, ``value`` its size)."""
    key: Any
    value: Any


@dataclass
class Step:
    """A system call's changes, and what its sync made durable (or failed to)."""

    call: str
    units: list[Unit] = field(default_factory=list)
    synced: Inode | None = None
    synced_directory: bool = False
    sync_failed: Inode | None = None


def _diff(before: Snapshot, after: Snapshot) -> list[Unit]:
    units = []
    for name in sorted(set(before.names) | set(after.names)):
        if before.names.get(name) != after.names.get(name):
            units.append(Unit("name", name, after.names.get(name)))
    for inode, data in after.contents.items():
        old = before.contents.get(inode, b"")
        if len(old) != len(data):
            units.append(Unit("size", inode, len(data)))
        for page in range(0, len(data), PAGE):
            new = data[page : page + PAGE]
            if old[page : page + PAGE] != new:
                units.append(Unit("page", (inode, page // PAGE), new))
    return units


class Recorder:
    """Records what code run inside ``recording`` does to ``directory``.

    ``fail`` may make one call fail: given the call's name and its number (from 1), it
    returns None to let it run, or the error to raise; a write then raises after writing
    the pages ``partial`` selects (of those it would change).
    """

    def __init__(
        self,
        directory: Path,
        monkeypatch: pytest.MonkeyPatch,
        ids: Mapping[int, Inode] | None = None,
    ) -> None:
        self.directory = directory
        self.monkeypatch = monkeypatch
        self._ids = dict(ids or {})
        self.start = Snapshot.of(directory, self.inode)
        self.steps: list[Step] = []
        self._last = self.start

    def inode(self, number: int) -> Inode:
        """The model's name of the real inode ``number``."""
        return self._ids.setdefault(number, (id(self), number))

    def _note(self, call: str, fd: int | None = None, *, sync: str = "") -> None:
        now = Snapshot.of(self.directory, self.inode)
        step = Step(call, _diff(self._last, now))
        self._last = now
        if sync and fd is not None:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                same = os.path.samefile(f"/proc/self/fd/{fd}", self.directory)
                step.synced_directory = same and sync == "done"
            elif sync == "done":
                step.synced = self.inode(info.st_ino)
            else:
                step.sync_failed = self.inode(info.st_ino)
        self.steps.append(step)

    def run(
        self,
        action: Callable[[], Any],
        fail: Callable[[str, int], OSError | None] = lambda call, n: None,
        partial: Callable[[int], bool] = lambda page: True,
    ) -> BaseException | None:
        """Run ``action`` with its calls recorded; the exception it raised, if any."""
        real = {name: getattr(os, name) for name in _CALLS}
        counter = itertools.count(1)

        def wrap(name: str) -> Callable[..., Any]:
            def call(*args: Any) -> Any:
                error = fail(name, next(counter))
                syncs = name in ("fsync", "fdatasync")
                if error is not None:
                    if name in ("write", "pwrite"):
                        self._write_part(real, name, args, partial)
                    self._note(f"{name} (failed)", args[0] if syncs else None, sync="failed")
                    raise error
                result = real[name](*args)
                self._note(name, args[0] if syncs else None, sync="done")
                return result

            return call

        with self.monkeypatch.context() as patch:
            for name in _CALLS:
                patch.setattr(os, name, wrap(name))
            try:
                action()
            except Exception as err:
                return err
        return None

    @staticmethod
    def _write_part(
        real: dict[str, Callable[..., Any]],
        name: str,
        args: Sequence[Any],
        partial: Callable[[int], bool],
    ) -> None:
        """Of the pages a write would change, write those ``partial`` selects."""
        fd, data = args[0], bytes(args[1])
        offset = args[2] if name == "pwrite" else os.lseek(fd, 0, os.SEEK_CUR)
        first = offset // PAGE
        for page in range(first, (offset + len(data) - 1) // PAGE + 1):
            start, end = max(offset, page * PAGE), min(offset + len(data), (page + 1) * PAGE)
            if partial(page - first):
                real["pwrite"](fd, data[start - offset : end - offset], start)


_CALLS = ("write", "pwrite", "replace", "rename", "unlink", "fsync", "fdatasync")


@dataclass
class Disk:
    """What the disk holds (``durable``), and what may or may not have reached it yet.

    ``limbo``: pages whose sync failed. Linux marks them clean all the same, so a later
    sync does not write them: they may be on the disk or not, whatever comes, until the
    page is written anew and synced.
    """

    durable: Snapshot
    pending: list[Unit] = field(default_factory=list)
    limbo: list[Unit] = field(default_factory=list)

    def after(self, steps: Iterable[Step]) -> Disk:
        """The disk once ``steps`` ran (and nothing was lost)."""
        disk = Disk(self.durable, list(self.pending), list(self.limbo))
        for step in steps:
            disk.pending.extend(step.units)
            if step.synced is not None:
                disk._sync(functools.partial(_of_file, step.synced))
            if step.synced_directory:
                disk._sync(lambda u: u.kind == "name")
            if step.sync_failed is not None:
                lost = [u for u in disk.pending if _of_file(step.sync_failed, u)]
                disk.pending = [u for u in disk.pending if u not in lost]
                disk.limbo.extend(lost)
        return disk

    def _sync(self, which: Callable[[Unit], bool]) -> None:
        now = [u for u in self.pending if which(u)]
        self.durable = _apply(self.durable, now)
        self.pending = [u for u in self.pending if not which(u)]
        written = {u.key for u in now}
        self.limbo = [u for u in self.limbo if u.key not in written]

    def with_lost_or_not(self, units: Iterable[Unit]) -> Disk:
        """This disk with ``units`` in the cache too (a write cut short by a kill)."""
        return Disk(self.durable, [*self.pending, *units], list(self.limbo))

    def cache(self) -> Snapshot:
        """What a reader sees while the machine runs: every unit, in order."""
        return _apply(self.durable, [*self.limbo, *self.pending])

    def visible(self, unit: Unit, names: Sequence[str]) -> bool:
        """Whether ``unit`` can change what a reader of the files ``names`` reads."""
        if unit.kind == "name":
            return unit.key in names
        files = {self.durable.names.get(n) for n in names}
        files |= {
            u.value for u in [*self.limbo, *self.pending] if u.kind == "name" and u.key in names
        }
        return _inode(unit) in files

    def power_cuts(self, visible: Sequence[str]) -> Iterator[Snapshot]:
        """Every state a power cut can leave, as far as the files named ``visible`` go."""
        seen = [u for u in [*self.limbo, *self.pending] if self.visible(u, visible)]
        for size in range(len(seen) + 1):
            for kept in itertools.combinations(seen, size):
                yield _apply(self.durable, kept)


def _of_file(inode: Inode, unit: Unit) -> bool:
    """Whether ``unit`` changes the bytes of file ``inode``."""
    return unit.kind != "name" and _inode(unit) == inode


def _inode(unit: Unit) -> Inode:
    inode: Inode = unit.key[0] if unit.kind == "page" else unit.key
    return inode


def _apply(base: Snapshot, units: Iterable[Unit]) -> Snapshot:
    names = dict(base.names)
    contents: dict[Inode, bytearray] = {i: bytearray(d) for i, d in base.contents.items()}
    for unit in units:
        if unit.kind == "name":
            if unit.value is None:
                names.pop(unit.key, None)
            else:
                names[unit.key] = unit.value
                contents.setdefault(unit.value, bytearray())
        elif unit.kind == "size":
            data = contents.setdefault(unit.key, bytearray())
            del data[unit.value :]
            data.extend(bytes(unit.value - len(data)))
        else:
            inode, page = unit.key
            data = contents.setdefault(inode, bytearray())
            end = page * PAGE + len(unit.value)
            if len(data) < end:
                data.extend(bytes(end - len(data)))
            data[page * PAGE : end] = unit.value
    # Files no name binds are kept: a rename that reaches the disk later binds one.
    return Snapshot(names, {i: bytes(d) for i, d in contents.items()})
