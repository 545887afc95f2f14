"""The claim feed's loop: when the index may be trusted, and how fast a watch is reopened.

The feed's own steps (list, watch, pause) are scripted here; what the API server sends is
tested against a real one in tests/integration/test_claim_watch.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kubernetes.client import ApiClient

from nodedra.claims.index import ClaimIndex
from nodedra.claims.orphans import OrphanTracker
from nodedra.claims.watch import BACKOFF, ClaimFeed
from nodedra.dra import KubeAPIError
from tests.unit.claims.helpers import TA
from tests.unit.dra.fakes import NODE


class ScriptedFeed(ClaimFeed):
    """A feed whose lists find no claim of ours, whose watches do what ``watch`` says, and
    whose pauses are recorded (with what ``on_pause`` returns) instead of waited."""

    def __init__(self, index: ClaimIndex, pauses: int) -> None:
        self.now = 0.0
        super().__init__(ApiClient(), index, lambda ref, claim: None, clock=lambda: self.now)
        self._stream_list = False  # lists in pages: ``_list`` below
        self.pauses: list[tuple[float, Any]] = []
        self.max_pauses = pauses
        self.watches: list[str | None] = []

    def on_pause(self) -> Any:
        return None

    def _pause(self, seconds: float) -> None:
        self.pauses.append((seconds, self.on_pause()))
        if len(self.pauses) == self.max_pauses:
            self._stopping.set()

    def _list(self) -> str:
        self._lists += 1
        self._index.listed(set())
        return "1"


def test_while_the_watch_fails_the_index_is_not_synced_and_nothing_is_an_orphan() -> None:
    """The watch fails for hours after the list: a claim prepared meanwhile is not in the
    index, and must not be taken for an orphan."""
    index = ClaimIndex(TA, NODE)
    held: set[str] = set()
    feed = ScriptedFeed(index, pauses=5)
    tracker = OrphanTracker(index, lambda: frozenset(held), grace=60, clock=lambda: feed.now)

    def failing(version: str | None) -> Iterator[str]:
        feed.watches.append(version)
        assert index.synced, "listed just now"
        raise KubeAPIError(0, "connection refused")

    def on_pause() -> tuple[bool, frozenset[str] | None]:
        held.add("made-while-away")
        feed.now += 3600
        return index.synced, tracker.check()

    feed._watch = failing  # type: ignore[method-assign]
    feed.on_pause = on_pause  # type: ignore[method-assign]
    feed._run()
    assert feed.watches == ["1"] * 5
    assert [seen for _, seen in feed.pauses] == [(False, None)] * 5


def bookmark(version: str) -> bytes:
    event = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": version}}}
    return json.dumps(event).encode()


class EndingFeed(ScriptedFeed):
    """Each watch ends as ``endings`` says: after so many seconds, with or without events."""

    def __init__(self, endings: list[tuple[float, bool]]) -> None:
        super().__init__(ClaimIndex(TA, NODE), pauses=len(endings) + 1)
        self.endings = endings

    def _watch(self, version: str | None) -> Iterator[str]:
        self.watches.append(version)
        if not self.endings:
            self._stopping.set()
            return
        seconds, events = self.endings.pop(0)
        self.now += seconds
        if events:
            newer, _ = self._event(bookmark(str(len(self.watches) + 1)), None)
            assert newer is not None
            yield newer


def test_a_watch_that_ends_at_once_again_and_again_is_reopened_with_backoff() -> None:
    at_once = (0.0, False)
    endings = [at_once] * 8 + [(0.0, True), at_once, (10.0, False), (9.0, False), at_once]
    feed = EndingFeed(endings)
    feed._run()
    assert [seconds for seconds, _ in feed.pauses] == [
        *(0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0),
        # A watch that delivered an event ran normally: reopened at once, backoff anew.
        0.5,
        # So did one open for 10 s, without events (a quiet cluster); 9 s is too short.
        0.5,
        1.0,
    ]
    assert BACKOFF == (0.5, 30.0)
    assert len(feed.watches) == 14
