"""The claim index: which claims are ours, which events are worth parsing, when it is synced."""

from __future__ import annotations

import json
from typing import Any

from nodedra.claims.index import ClaimIndex
from nodedra.dra import ClaimRef
from tests.unit.claims.helpers import TA, ours
from tests.unit.dra.fakes import NODE, make_claim, result


def test_index_keeps_only_claims_allocated_to_us() -> None:
    index = ClaimIndex(TA, NODE)
    assert index.observe(None, ours("a")) == ClaimRef("default", "claim-a", "a")
    assert (
        index.observe("ADDED", make_claim("b", [result("r", "d", driver="gpu.example.com")]))
        is None
    )
    assert (
        index.observe(
            "ADDED", make_claim("c", [result("r", "cpudevnuma000", driver=TA, pool="other-node")])
        )
        is None
    )
    unallocated = ours("d")
    del unallocated["status"]["allocation"]
    assert index.observe("MODIFIED", unallocated) is None
    assert index.observe("MODIFIED", {"metadata": {}}) is None  # malformed: ignored
    assert index.uids() == {"a"}
    deallocated = ours("a")
    del deallocated["status"]["allocation"]
    index.observe("MODIFIED", deallocated)
    assert index.uids() == set()
    index.observe("ADDED", ours("e"))
    index.observe("DELETED", ours("e"))
    assert len(index) == 0


def test_a_list_drops_the_claims_deleted_while_nobody_watched() -> None:
    index = ClaimIndex(TA, NODE)
    for uid in ("a", "b"):
        index.observe("ADDED", ours(uid))
    assert not index.synced
    index.listed({"b"})
    assert index.uids() == {"b"}
    assert index.synced


def test_the_index_is_synced_only_while_a_watch_follows_the_cluster() -> None:
    index = ClaimIndex(TA, NODE)
    index.following()  # a watch before any list: resumed from nothing, so
    index.lost()
    assert (index.synced, index.stretch()) == (False, None)
    index.listed(set())
    assert (index.synced, index.stretch()) == (True, 2)
    index.following()  # the watch after a paged list: the same stretch
    assert index.stretch() == 2
    index.lost()  # the watch failed or ended
    assert (index.synced, index.stretch()) == (False, None)
    index.following()  # the server took the watch resumed from the last version seen
    assert (index.synced, index.stretch()) == (True, 3)
    index.lost()
    index.listed(set())  # or the version was gone: listed again
    assert (index.synced, index.stretch()) == (True, 4)


def event_line(kind: str, claim: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": claim}, separators=(",", ":")).encode()


def test_only_events_naming_our_driver_and_pool_or_our_claims_are_worth_parsing() -> None:
    index = ClaimIndex(TA, NODE)
    other_driver = make_claim("b", [result("r", "d", driver="gpu.example.com", pool=NODE)])
    other_node = make_claim("c", [result("r", "cpudevnuma000", driver=TA, pool="other-node")])
    assert index.mentioned_in(event_line("ADDED", ours("a")))
    assert not index.mentioned_in(event_line("ADDED", other_driver))
    assert not index.mentioned_in(event_line("ADDED", other_node))
    # A claim of ours, deallocated: only its UID says it is ours, once it is indexed.
    index.observe("ADDED", ours("a"))
    deallocated = ours("a")
    del deallocated["status"]["allocation"]
    assert index.mentioned_in(event_line("MODIFIED", deallocated))
    index.observe("MODIFIED", deallocated)
    assert not index.mentioned_in(event_line("MODIFIED", deallocated))
    # A prefix of a name is not the name.
    assert not ClaimIndex(TA, NODE[:-1]).mentioned_in(event_line("ADDED", ours("a")))
