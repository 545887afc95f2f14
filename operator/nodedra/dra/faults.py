"""Crash points: where the reliability tests kill the process to prove crash safety.

A crash point does nothing unless ``NODEDRA_CRASH_AT`` names it; then the process kills
itself with SIGKILL right there, as a power cut or the OOM killer would, leaving no chance to
clean up. The tests restart nodedra afterwards and check that nothing was lost or given
twice. The variable is read at every point (an environment lookup), so it costs nothing
worth measuring.
"""

from __future__ import annotations

import os
import signal

CRASH_AT = "NODEDRA_CRASH_AT"

PREPARE_ALLOCATED = "prepare-allocated"
"""The policy allocated, nothing is committed yet."""
PREPARE_COMMITTED = "prepare-committed"
"""The allocation is in the checkpoint, the CDI spec is not written."""
PREPARE_WRITTEN = "prepare-written"
"""The CDI spec is written, the kubelet has no answer yet."""
UNPREPARE_RELEASED = "unprepare-released"
"""The policy released, nothing is committed yet."""
UNPREPARE_COMMITTED = "unprepare-committed"
"""The release is in the checkpoint, the CDI spec is still there."""
UNPREPARE_REMOVED = "unprepare-removed"
"""The CDI spec is gone, the kubelet has no answer yet."""

POINTS = (
    PREPARE_ALLOCATED,
    PREPARE_COMMITTED,
    PREPARE_WRITTEN,
    UNPREPARE_RELEASED,
    UNPREPARE_COMMITTED,
    UNPREPARE_REMOVED,
)


def crash_point(name: str) -> None:
    """Die here, at once, if the tests asked for it."""
    if os.environ.get(CRASH_AT) == name:
        os.kill(os.getpid(), signal.SIGKILL)
