"""Events on the Node: what they say, that the server would take them, that failing is harmless.

Against the ClusterAPI fake, which refuses what the API server's strict events.k8s.io/v1
checks refuse; that a real server takes them (and the RBAC rule lets nodedra post them) is
the integration tests' business.
"""

from __future__ import annotations

import logging

import pytest

from nodedra.dra import KubeAPIError
from nodedra.nodeevents import NodeEvents
from nodedra.policy import Shortfall
from nodedra.runtime import claims_short, report_shortfalls
from tests.unit.dra.fakes import NODE, FakeCluster

DRIVER = "topology-aware.nri.io"
GI = 1 << 30


def test_a_warning_regards_the_node_and_says_what_and_who() -> None:
    cluster = FakeCluster()
    assert NodeEvents(cluster, NODE, DRIVER).warning("HugePagesMissing", "KeepClaim", "why")
    (event,) = cluster.events
    assert event["metadata"]["namespace"] == "default"
    assert event["metadata"]["name"].startswith(f"{NODE}.")
    assert event["regarding"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": NODE,
        "uid": cluster.nodes[NODE],
    }
    assert (event["type"], event["reason"], event["action"], event["note"]) == (
        "Warning",
        "HugePagesMissing",
        "KeepClaim",
        "why",
    )
    assert event["reportingController"] == DRIVER
    assert event["eventTime"].endswith("Z")


def test_a_long_note_and_a_long_node_name_are_cut_to_what_the_server_takes() -> None:
    node = "n" * 253  # the longest a node's name can be
    cluster = FakeCluster(node)
    events = NodeEvents(cluster, node, DRIVER)
    assert events.warning("HugePagesMissing", "KeepClaim", "é" * 1000)
    (event,) = cluster.events
    assert event["note"] == "é" * 510 + "..."  # 1023 bytes: no half of a character
    assert len(event["reportingInstance"]) == 128


@pytest.mark.parametrize("failing", ["the node", "the event"])
def test_an_event_that_cannot_be_posted_is_logged_and_nothing_fails(
    failing: str, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = FakeCluster()
    events = NodeEvents(cluster, NODE, DRIVER)
    if failing == "the event":
        events.warning("First", "KeepClaim", "the node's UID is asked once")
    cluster.fail_next.append(KubeAPIError(403, "events.events.k8s.io is forbidden"))
    with caplog.at_level(logging.WARNING, logger="nodedra.nodeevents"):
        assert not events.warning("HugePagesMissing", "KeepClaim", "why")
    assert "could not record Event HugePagesMissing on node node-a: (403)" in caplog.text
    assert [e["reason"] for e in cluster.events] == (["First"] if failing == "the event" else [])
    assert events.warning("HugePagesMissing", "KeepClaim", "why")  # the next one is tried


SHORT = [
    Shortfall("u-1", "cpudevnuma000", "hugepages_1Gi", 2 * GI, 2 * GI, 0, "NUMA node 0 has none"),
    Shortfall("u-2", "cpudevnuma001", "hugepages_2Mi", GI, 2 * GI, GI, "NUMA node 1 has 1Gi"),
    Shortfall("u-3", "cpudevnuma001", "hugepages_2Mi", GI, 2 * GI, GI, "NUMA node 1 has 1Gi"),
]


def test_each_claim_short_after_a_start_is_named_in_the_log_and_an_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = FakeCluster()
    with caplog.at_level(logging.WARNING, logger="nodedra.runtime"):
        report_shortfalls(SHORT, NodeEvents(cluster, NODE, DRIVER))
    warnings = [r.getMessage() for r in caplog.records if r.name == "nodedra.runtime"]
    assert [e["note"] for e in cluster.events] == warnings
    assert [e["reason"] for e in cluster.events] == ["HugePagesMissing"] * 3
    assert warnings[0].startswith(
        "claim u-1 holds 2Gi of hugepages_1Gi of cpudevnuma000, where claims hold 2Gi and it "
        "offers 0 now: NUMA node 0 has none. The claim is kept"
    )
    assert ["u-2" in w for w in warnings] == [False, True, False]


def test_a_capacity_other_than_huge_pages_is_reported_as_such() -> None:
    cluster = FakeCluster()
    other = Shortfall("u-4", "dev", "widgets", 2, 2, 1, "fewer widgets")
    report_shortfalls([other], NodeEvents(cluster, NODE, DRIVER))
    assert [e["reason"] for e in cluster.events] == ["CapacityMissing"]


def test_nothing_short_records_nothing() -> None:
    cluster = FakeCluster()
    report_shortfalls([], NodeEvents(cluster, NODE, DRIVER))
    assert cluster.events == []
    assert claims_short([]) == {}


def test_the_metric_counts_claims_by_capacity() -> None:
    assert claims_short(SHORT) == {"hugepages_1Gi": 1, "hugepages_2Mi": 2}
