"""What nodedra says when it withholds devices a claim would take whole: readiness, log,
an Event on the Node, the metric's counts.

Against the ClusterAPI fake, which refuses Events the API server's strict checks refuse;
that a real server takes the Event and /readyz says it is tests/integration's business.
"""

from __future__ import annotations

import logging
import threading

import pytest

from nodedra.dra import Withheld
from nodedra.nodeevents import NOTE_LIMIT, NodeEvents
from nodedra.wholenuma import REASON, counts, problem, report, report_in_background
from tests.unit.dra.fakes import NODE, FakeCluster

DRIVER = "topology-aware.nri.io"
WITHHELD = Withheld("DRAConsumableCapacity", ("cpudevnuma000", "cpudevnuma001"))


def test_the_problem_names_the_gate_its_releases_and_the_opt_in() -> None:
    assert problem(WITHHELD) == (
        "2 devices withheld (cpudevnuma000, cpudevnuma001): the API server has feature gate "
        "DRAConsumableCapacity off, so a claim of one would take all of it, however little it "
        "asks for, a whole NUMA node. DRAConsumableCapacity is alpha and off by default in "
        "Kubernetes 1.34 and 1.35, beta and on by default from 1.36: turn it on in the API "
        "server, the scheduler and the kubelet, then restart nodedra; or set "
        "--allow-whole-numa-node-devices=true (NODEDRA_ALLOW_WHOLE_NUMA_NODE_DEVICES) to "
        "publish them anyway, each claim then taking every CPU of its NUMA node but the "
        "reserved ones"
    )


def test_a_report_is_a_warning_in_the_log_and_one_event_on_the_node(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = FakeCluster()
    with caplog.at_level(logging.WARNING, logger="nodedra.wholenuma"):
        report(WITHHELD, NodeEvents(cluster, NODE, DRIVER))
    (event,) = cluster.events
    assert (event["type"], event["reason"], event["action"]) == (
        "Warning",
        REASON,
        "WithholdDevices",
    )
    assert REASON == "WholeNUMANodeDevicesWithheld"
    assert event["regarding"]["kind"] == "Node"
    assert event["regarding"]["name"] == NODE
    assert event["note"] == problem(WITHHELD)
    assert len(event["note"].encode()) <= NOTE_LIMIT
    assert [r.getMessage() for r in caplog.records] == [problem(WITHHELD)]


def test_a_report_in_the_background_posts_from_a_thread_of_its_own() -> None:
    cluster = FakeCluster()
    before = set(threading.enumerate())
    report_in_background(WITHHELD, NodeEvents(cluster, NODE, DRIVER))
    for thread in set(threading.enumerate()) - before:  # none: it has already finished
        assert thread.name == "node-events-withheld"
        thread.join()
    assert [e["reason"] for e in cluster.events] == [REASON]


def test_an_event_the_server_refuses_fails_nothing(caplog: pytest.LogCaptureFixture) -> None:
    cluster = FakeCluster()
    cluster.nodes.clear()  # the Node's UID cannot be asked
    report(WITHHELD, NodeEvents(cluster, NODE, DRIVER))
    assert cluster.events == []
    assert f"could not record Event {REASON}" in caplog.text


def test_counts_by_gate() -> None:
    assert counts(WITHHELD) == {"DRAConsumableCapacity": 2}
    assert counts(None) == {}
