"""Crash points: where the reliability tests kill the process to prove crash safety.

A crash point does nothing unless ``NODEDRA_CRASH_AT`` names it; then the process kills
itself with SIGKILL right there, as a power cut or the OOM killer would, leaving no chance to
clean up. ``point@N`` kills it the Nth time it passes the point (the second request of a
batch, say). The tests restart nodedra afterwards and check that nothing was lost or given
twice. The variable is read once, when the process starts (the tests set it for the
process they start), so a point costs one comparison.
"""

from __future__ import annotations

import itertools
import os
import signal
from typing import NamedTuple

CRASH_AT = "NODEDRA_CRASH_AT"


class WritePoints(NamedTuple):
    """The crash points inside one atomic file write (see ``nodedra.lib.durable``)."""

    written: str
    """The temporary file is written and synced; the target is as it was."""
    renamed: str
    """The new file is in place; its directory is not synced yet."""


class SlotPoints(NamedTuple):
    """The crash points inside one write of a slot file (see ``nodedra.lib.slotfile``)."""

    written: str
    """The slot is written in place, not synced: readers see the new record."""
    synced: str
    """The slot is synced: the new record survives a power cut."""


PREPARE_ALLOCATED = "prepare-allocated"
"""The policy allocated, nothing is committed yet."""
PREPARE_CHECKPOINT = SlotPoints("prepare-checkpoint-written", "prepare-checkpoint-synced")
"""Inside the commit of an allocation (the checkpoint's write)."""
PREPARE_COMMITTED = "prepare-committed"
"""The allocation is in the checkpoint, the CDI spec is not written."""
PREPARE_SPEC = WritePoints("prepare-spec-written", "prepare-spec-renamed")
"""Inside the write of the claim's CDI spec."""
PREPARE_WRITTEN = "prepare-written"
"""The CDI spec is written, the kubelet has no answer yet."""
UNPREPARE_RELEASED = "unprepare-released"
"""The policy released, nothing is committed yet."""
UNPREPARE_CHECKPOINT = SlotPoints("unprepare-checkpoint-written", "unprepare-checkpoint-synced")
"""Inside the commit of a release (the checkpoint's write)."""
UNPREPARE_COMMITTED = "unprepare-committed"
"""The release is in the checkpoint, the CDI spec is still there."""
UNPREPARE_REMOVED = "unprepare-removed"
"""The CDI spec is gone, the kubelet has no answer yet."""

POINTS = (
    PREPARE_ALLOCATED,
    *PREPARE_CHECKPOINT,
    PREPARE_COMMITTED,
    *PREPARE_SPEC,
    PREPARE_WRITTEN,
    UNPREPARE_RELEASED,
    *UNPREPARE_CHECKPOINT,
    UNPREPARE_COMMITTED,
    UNPREPARE_REMOVED,
)
"""Every crash point, in the order a prepare and then an unprepare pass them."""


_TARGET, _, _NTH = (os.environ.get(CRASH_AT) or "").partition("@")
_passes = itertools.count(1)


def crash_point(name: str) -> None:
    """Die here, at once, if the tests asked for it.

    As the first process of a PID namespace (nodedra in its container) the kernel ignores
    every signal the process sends itself, SIGKILL too: then it exits at once instead, with
    no more cleanup than SIGKILL allows.
    """
    if name == _TARGET and next(_passes) >= int(_NTH or 1):
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(128 + signal.SIGKILL)
