"""Orphan reports: claims held here whose ResourceClaim is gone, counted while synced only."""

from __future__ import annotations

import logging

import pytest

from nodedra.claims.index import ClaimIndex
from nodedra.claims.orphans import OrphanTracker
from tests.unit.claims.helpers import TA, ours
from tests.unit.dra.fakes import NODE


def test_orphans_after_grace(caplog: pytest.LogCaptureFixture) -> None:
    index = ClaimIndex(TA, NODE)
    held = {"a", "b"}
    now = [100.0]
    tracker = OrphanTracker(index, lambda: frozenset(held), grace=60, clock=lambda: now[0])
    index.observe(None, ours("a"))
    now[0] += 3600  # before the watch has listed, a claim missing from the index means nothing
    assert tracker.check() is None
    index.listed({"a"})
    assert tracker.check() == frozenset()
    now[0] += 59
    assert tracker.check() == frozenset()
    now[0] += 1
    with caplog.at_level(logging.WARNING):
        assert tracker.check() == frozenset({"b"})
        assert tracker.check() == frozenset({"b"})
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert (
        "claim b is held here but its ResourceClaim has been gone" in caplog.records[0].getMessage()
    )
    held.discard("b")
    assert tracker.check() == frozenset()


def test_no_orphans_from_an_index_that_is_not_synced_and_no_grace_time_either() -> None:
    """While the watch fails, claims made meanwhile never reach the index: they must not
    count as missing, and the time without a watch must not count as missing time."""
    index = ClaimIndex(TA, NODE)
    held = {"gone"}
    now = [0.0]
    tracker = OrphanTracker(index, lambda: frozenset(held), grace=60, clock=lambda: now[0])
    index.listed(set())
    assert tracker.check() == frozenset()  # "gone" is missing from now on
    now[0] += 30
    assert tracker.check() == frozenset()
    index.lost()  # the watch fails, and goes on failing
    held.add("new")  # a claim made meanwhile, prepared: its ADDED event never came
    for _ in range(3):
        now[0] += 3600
        assert tracker.check() is None
    index.following()  # back: the first check starts the clock of "new", and has nothing
    assert tracker.check() == frozenset()  # to add to that of "gone" (30 s so far)
    index.observe("ADDED", ours("new"))  # what the resumed watch sends first
    now[0] += 29
    assert tracker.check() == frozenset()
    index.lost()  # the watch ends between two checks, and is resumed
    index.following()
    now[0] += 3600
    assert tracker.check() == frozenset(), "a check in another stretch adds nothing"
    now[0] += 1
    assert tracker.check() == frozenset({"gone"}), "60 s missing while synced"
