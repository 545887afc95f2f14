"""Replacing a file so that a crash at any moment leaves the old or the new content whole.

The checkpoint, the CDI specs and the device metadata are all written this way: a temporary
file in the same directory (its name starts with "." and ends in ".tmp", which CDI runtimes
watching the directory ignore), renamed over the target. Readers see the old file or the new
one, never a partial one, and so does a restart after the process crashed. For the
checkpoint the file is fsynced before the rename and the directory after it, so that the new
content survives a power cut too; the specs and metadata are written again by the kubelet's
prepare after every boot, and skip both (half a millisecond of a prepare on a disk).

A failure after the rename is not a failure like the others: the new content is in place
(a reader, a restarted process sees it), only its surviving a power cut is in doubt. It
raises `NotDurableError`, so that a caller keeping a copy of the file's content in memory
can make the copy the new content rather than the old.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from nodedra.lib import faults


class NotDurableError(OSError):
    """The file has its new content, but what came after the rename failed.

    Readers and a restart see the new content; a power cut may bring the old one back
    (the directory was not synced). The cause is ``__cause__``.
    """


def replace_file(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o600,
    dir_mode: int = 0o700,
    crash_points: faults.WritePoints | None = None,
    survive_power_cut: bool = True,
) -> None:
    """Make ``data`` the content of ``path``, atomically and durably; raise on failure.

    The directory is created (with ``dir_mode``) if missing. On failure before the rename
    the temporary file is removed and ``path`` is as it was; after it, `NotDurableError`.
    ``crash_points`` name the places inside the sequence where the reliability tests may
    kill the process. Without ``survive_power_cut`` nothing is fsynced: a process crash still
    leaves the old or the new file, a power cut may leave either or an empty one; for files
    that are written again after a boot anyway.
    """
    directory = path.parent
    directory.mkdir(mode=dir_mode, parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    temporary = Path(name)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if survive_power_cut:
                os.fsync(fd)
        finally:
            os.close(fd)
        if crash_points is not None:
            faults.crash_point(crash_points.written)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    try:
        if crash_points is not None:
            faults.crash_point(crash_points.renamed)
        if survive_power_cut:
            fsync_directory(directory)
    except Exception as err:
        raise NotDurableError(
            f"{path} has its new content, but it may not survive a power cut: {err}"
        ) from err


def remove_leftovers(directory: Path, target_prefix: str) -> list[str]:
    """Remove the temporary files a crash left behind in ``directory``; their names.

    Only ours: the temporary files of targets whose names start with ``target_prefix``.
    The caller must hold whatever lock serializes the writes of those targets, or it
    could remove a file another writer is about to rename.
    """
    removed = []
    for leftover in sorted(directory.glob(f".{glob_escape(target_prefix)}*.tmp")):
        leftover.unlink(missing_ok=True)
        removed.append(leftover.name)
    return removed


def glob_escape(text: str) -> str:
    """``text`` with glob's special characters matching only themselves."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def fsync_directory(directory: Path) -> None:
    """Make a rename or removal in ``directory`` survive a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
