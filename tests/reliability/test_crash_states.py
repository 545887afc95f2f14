"""Every state a crash can leave the checkpoint in, over two saves cut short in a row.

What one save does to the state directory is recorded (`diskmodel.Recorder`) and every
state a power cut can leave is enumerated from it (`diskmodel.Disk`): a file replaced is the
old or the new one, whole; a file written in place holds any subset of its changed 4 KiB
pages. Two saves in a row are cut short, with what can come between them:

* a power cut, then a restart (which reads the checkpoint and saves, as ``start`` does);
* a kill (the page cache keeps what was written, any pages of a write under way), then a
  restart, then a power cut in the restart's save;
* an error in any system call of the first save (ENOSPC, EIO; a write that fails after
  some of its pages), then the same process saving again (the retry), then a power cut.

After each, a restart must read the last commit whose save returned, or a later one: never
a file it refuses, never an older state. The checkpoint starts as each of the shapes a node
can have: both slots full, one slot (the file just made), the record outgrowing its slot,
and the ``checkpoint.json`` of an older nodedra (the migration).
"""

from __future__ import annotations

import errno
import functools
import itertools
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodedra.resmgr.checkpoint import FILE_NAME, LEGACY_NAME, Checkpoint, State
from tests.reliability.diskmodel import Disk, Recorder, Snapshot
from tests.unit.resmgr.test_checkpoint import write_legacy

VISIBLE = (FILE_NAME, LEGACY_NAME)


def state(*claims: str, pad: int = 3000) -> State:
    """A state holding ``claims``, each padded so that the record spans several pages."""
    return State("static", "static.nri.io", {c: {"pad": c * pad} for c in claims}, {})


OLDER, ACKED, FIRST, SECOND = state("o"), state("a"), state("a", "b"), state("a", "b", "c")
BIG = state("a", "b", "big", pad=40_000)
"""Too large for a slot of 64 KiB: the first save grows the file."""


def slots_full(directory: Path) -> None:
    checkpoint = Checkpoint(directory / FILE_NAME)
    checkpoint.save(OLDER)
    checkpoint.save(ACKED)


def slot_file_just_made(directory: Path) -> None:
    Checkpoint(directory / FILE_NAME).save(ACKED)


def legacy_file(directory: Path) -> None:
    checkpoint = Checkpoint(directory / FILE_NAME)
    data = {"policy": "static", "driver": "static.nri.io", "claims": dict(ACKED.claims)}
    write_legacy(checkpoint, 2, {**data, "reservations": {}})


@dataclass(frozen=True)
class Shape:
    """How the checkpoint looks before the first save, and what that save writes."""

    name: str
    make: Callable[[Path], None]
    first: State


SHAPES = [
    Shape("both slots full", slots_full, FIRST),
    Shape("one slot", slot_file_just_made, FIRST),
    Shape("outgrows its slot", slots_full, BIG),
    Shape("legacy checkpoint.json", legacy_file, FIRST),
]


class Trial:
    """The crash states tried, and what each restart read."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp
        self.monkeypatch = monkeypatch
        self.counter = itertools.count()
        self.tried = 0

    def directory(self) -> Path:
        directory = self.tmp / f"d{next(self.counter)}"
        directory.mkdir()
        return directory

    def restart_reads(self, snapshot: Snapshot, allowed: tuple[State, ...], why: str) -> State:
        """What a restart reads from ``snapshot``: one of ``allowed``, never refused."""
        directory = self.directory()
        snapshot.materialize(directory)
        self.tried += 1
        try:
            read = Checkpoint(directory / FILE_NAME).load()
        except Exception as err:
            pytest.fail(f"{why}: a restart refuses the checkpoint: {err}")
        finally:
            shutil.rmtree(directory)
        assert read in allowed, f"{why}: a restart reads {_claims(read)}"
        assert read is not None
        return read

    def all_power_cuts(
        self, start: Disk, steps: list[Any], allowed: tuple[State, ...], done: State, why: str
    ) -> None:
        """A power cut before each of ``steps`` and after the last; ``done`` once all ran."""
        for cut in range(len(steps) + 1):
            disk = start.after(steps[:cut])
            for snapshot in disk.power_cuts(VISIBLE):
                last = cut == len(steps) and not disk.pending and not disk.limbo
                self.restart_reads(snapshot, (done,) if last else allowed, f"{why}, cut {cut}")

    def second_save(
        self, snapshot: Snapshot, base: Disk | None, why: str, allowed: tuple[State, ...]
    ) -> None:
        """A restart on ``snapshot`` reads and saves SECOND; a power cut anywhere in that.

        ``base``: what the disk held when the restart came (a kill: the cache was
        ``snapshot``); None if it held ``snapshot`` (a power cut, then a boot).
        """
        directory = self.directory()
        ids = snapshot.materialize(directory)
        recorder = Recorder(directory, self.monkeypatch, ids)

        def restart() -> None:
            checkpoint = Checkpoint(directory / FILE_NAME)
            checkpoint.load()
            checkpoint.save(SECOND)

        error = recorder.run(restart)
        shutil.rmtree(directory)
        assert error is None, f"{why}: the restart failed: {error}"
        start = base if base is not None else Disk(recorder.start)
        self.all_power_cuts(start, recorder.steps, (*allowed, SECOND), SECOND, why)


def _claims(read: State | None) -> list[str] | None:
    return None if read is None else sorted(read.claims)


def subsets(items: list[Any]) -> Iterator[tuple[Any, ...]]:
    for size in range(len(items) + 1):
        yield from itertools.combinations(items, size)


@pytest.fixture
def trial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Trial:
    return Trial(tmp_path, monkeypatch)


def first_save(trial: Trial, shape: Shape) -> tuple[Recorder, Checkpoint]:
    """The shape made, and the first save recorded through to its end."""
    directory = trial.directory()
    shape.make(directory)
    recorder = Recorder(directory, trial.monkeypatch)
    checkpoint = Checkpoint(directory / FILE_NAME)
    assert recorder.run(lambda: checkpoint.save(shape.first)) is None
    return recorder, checkpoint


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_a_power_cut_then_a_restart_whose_save_is_cut_too(trial: Trial, shape: Shape) -> None:
    recorder, _ = first_save(trial, shape)
    allowed = (ACKED, shape.first)
    trial.all_power_cuts(Disk(recorder.start), recorder.steps, allowed, shape.first, "first")
    for cut in range(len(recorder.steps) + 1):
        disk = Disk(recorder.start).after(recorder.steps[:cut])
        for n, snapshot in enumerate(disk.power_cuts(VISIBLE)):
            why = f"power cut {cut}.{n} in the first save, then in the restart's"
            trial.second_save(snapshot, None, why, allowed)
    assert trial.tried > 100, f"only {trial.tried} crash states"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_a_kill_then_a_restart_whose_save_a_power_cut_ends(trial: Trial, shape: Shape) -> None:
    recorder, _ = first_save(trial, shape)
    allowed = (ACKED, shape.first)
    start = Disk(recorder.start)
    for cut, step in enumerate(recorder.steps):
        before = start.after(recorder.steps[:cut])
        # Of the pages of the call under way, any may be in the cache; those of a file no
        # visible name binds (a temporary file the kill keeps from being renamed) all are.
        hidden = [u for u in step.units if not before.after([step]).visible(u, VISIBLE)]
        shown = [u for u in step.units if u not in hidden]
        for n, written in enumerate(subsets(shown)):
            disk = before.with_lost_or_not([*hidden, *written])
            why = f"killed in call {cut} ({step.call}, {n}), then a power cut in the restart"
            trial.second_save(disk.cache(), disk, why, allowed)
    assert trial.tried > 100, f"only {trial.tried} crash states"


def _nth_fails(failing: int, error: OSError, call: str, n: int) -> OSError | None:
    return error if n == failing else None


def _pages_written(pages: int, page: int) -> bool:
    """Of the first three pages of a write, those ``pages`` has a bit for; the rest if all."""
    return bool(pages >> page & 1) if page < 3 else pages == 7


ERRORS = [OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EIO, "I/O error")]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_an_error_then_a_retry_that_a_power_cut_ends(trial: Trial, shape: Shape) -> None:
    """Each system call of the first save fails in turn (a write after some of its pages);
    the same process saves again; a power cut anywhere in that."""
    calls = len(first_save(trial, shape)[0].steps)
    for failing, error, pages in itertools.product(range(1, calls + 1), ERRORS, range(8)):
        directory = trial.directory()  # removed with the others at the end
        shape.make(directory)
        recorder = Recorder(directory, trial.monkeypatch)
        checkpoint = Checkpoint(directory / FILE_NAME)
        raised = recorder.run(
            functools.partial(checkpoint.save, shape.first),
            fail=functools.partial(_nth_fails, failing, error),
            partial=functools.partial(_pages_written, pages),
        )
        assert raised is not None, "the failure did not reach the caller"
        cut_short = len(recorder.steps)
        assert recorder.run(functools.partial(checkpoint.save, SECOND)) is None
        why = f"call {failing} failed ({error.strerror}, pages {pages:03b}), then the retry"
        assert cut_short < len(recorder.steps)
        trial.all_power_cuts(
            Disk(recorder.start), recorder.steps, (ACKED, shape.first, SECOND), SECOND, why
        )
    assert trial.tried > 100, f"only {trial.tried} crash states"
