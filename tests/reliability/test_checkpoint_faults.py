"""The checkpoint's disk fails, several commits in a row, and then works again.

Through the resource manager as deployed (a pod UID: the instance lock, the catch-up of
rolling updates), with claims on a real API server: each kind of fault a state disk gives
(ENOSPC, EIO, a short write and then ENOSPC, as a copy-on-write filesystem that overwrites in
place gives it; a sync that fails) hits K commits in a row. Every one of those requests
fails with why; after each, the running books are what a restart reads, no CPU is held twice,
and what a restart reads is the last acknowledged state or, when the failure came after the
new state was written, that one; once the disk works again, the kubelet's retries get what a
run without faults gives.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra.resmgr import Checkpoint
from tests.peers.controlplane import ControlPlane
from tests.reliability.helpers import (
    POLICIES,
    ClaimsOnServer,
    LocalNode,
    check_state,
    sample_claim,
    short_dir,
)


class DiskFaults:
    """Makes the next ``count`` checkpoint writes (or their syncs) fail as ``kind`` says."""

    def __init__(self, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kind = kind
        self.count = 0
        real_write, real_sync = os.pwrite, os.fdatasync
        written: set[int] = set()

        def pwrite(fd: int, data: Any, offset: int) -> int:
            written.add(fd)
            if self.count and kind == "ENOSPC":
                self.count -= 1
                raise OSError(errno.ENOSPC, "No space left on device")
            if self.count and kind == "EIO half-way":
                self.count -= 1
                real_write(fd, bytes(data[: len(data) // 2]), offset)
                raise OSError(errno.EIO, "Input/output error")
            if self.count and kind == "short write, then ENOSPC" and len(data) > 1:
                # A short write: the slot file's writer asks for the rest, which fails.
                return int(real_write(fd, bytes(data[: max(1, len(data) // 3)]), offset))
            if self.count and kind == "short write, then ENOSPC":
                self.count -= 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return int(real_write(fd, data, offset))

        def fdatasync(fd: int) -> None:
            if self.count and kind == "sync EIO" and fd in written:
                self.count -= 1
                written.discard(fd)
                raise OSError(errno.EIO, "Input/output error")
            written.discard(fd)
            real_sync(fd)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "fdatasync", fdatasync)


# "short write, then ENOSPC": the first pwrite writes a third and returns short, each later
# one of more than a byte does too, and the last byte's fails.
FAULTS = ["ENOSPC", "EIO half-way", "short write, then ENOSPC", "sync EIO"]
WRITTEN_ANYWAY = {"sync EIO"}
"""Faults that come after the new state was written: it is the checkpoint then."""


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_dir("nd-ckpt-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def restart_reads(node: LocalNode) -> set[str]:
    """The claims a restart reads from the node's checkpoint (a reader of its own)."""
    state = Checkpoint(node.manager.checkpoint.path).load()
    assert state is not None
    return set(state.claims)


def in_a_row(times: int, attempt: Callable[[], str], what: str) -> None:
    """``attempt`` fails ``times`` times with ``what`` in its error."""
    for _ in range(times):
        assert what in attempt()


@pytest.mark.parametrize("times", [1, 2, 4])
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("policy", POLICIES)
def test_commits_that_fail_in_a_row_lose_nothing(  # noqa: PLR0917 (fixtures)
    control_plane: ControlPlane,
    namespace: str,
    root: Path,
    policy: str,
    fault: str,
    times: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = LocalNode(root, policy, cluster=ClaimsOnServer(control_plane, namespace))
    assert node.pod_uid is not None, "as deployed: with the instance lock and the catch-up"
    held, new = (node.serve(sample_claim(policy, uid)) for uid in ("b", "a"))
    node.manager.start()
    faults = DiskFaults(fault, monkeypatch)
    written = fault in WRITTEN_ANYWAY
    try:
        assert node.prepare(held)[held.uid].error is None

        def prepare_new() -> str:
            faults.count = 1
            error = str(node.prepare(new)[new.uid].error)
            reads = restart_reads(node)
            assert reads == ({held.uid, new.uid} if written else {held.uid}), error
            check_state(node.state(), every_claim_has_a_spec=False)
            return error

        in_a_row(times, prepare_new, "committing the allocation failed")
        assert node.prepare(new)[new.uid].error is None
        assert restart_reads(node) == {held.uid, new.uid}
        check_state(node.state())

        def unprepare_held() -> str:
            faults.count = 1
            error = str(node.unprepare(held)[held.uid])
            assert restart_reads(node) == ({new.uid} if written else {held.uid, new.uid})
            if written:  # released on disk, its spec kept for the kubelet's retry
                assert node.policy.snapshot() == node.saved_state().claims  # type: ignore[union-attr]
            else:
                check_state(node.state())
            return error

        in_a_row(times, unprepare_held, "committing the release failed")
        assert node.unprepare(held) == {held.uid: None}
        assert restart_reads(node) == {new.uid}
        check_state(node.state())
    finally:
        node.manager.stop()
    assert restart_reads(node) == {new.uid}, "the final save"
