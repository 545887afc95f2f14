"""The claim status writer: what it writes, when, and how it tries again."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodedra.claims.status import StatusWriter
from nodedra.dra import ClaimRef, KubeAPIError, RequestReport
from nodedra.observability import ClaimWatchCounts, Metrics, StatusCounts
from nodedra.topology import format_cpu_list
from tests.peers.cluster import poll
from tests.unit.claims.helpers import TA
from tests.unit.dra.fakes import NODE, result
from tests.unit.resmgr.test_manager import Node


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path, "topology-aware")
    n.manager.start()
    yield n
    n.manager.stop()


def test_status_names_what_the_claim_got_and_goes_on_release(node: Node) -> None:
    ref = node.add_claim(
        "u1",
        [
            result(
                "req",
                "cpudevnuma000",
                driver=TA,
                pool=NODE,
                consumedCapacity={"cpu": "2"},
                shareID="s1",
            )
        ],
    )
    node.manager.plugin.node_prepare([ref])
    writer = StatusWriter(node.cluster, node.manager, NODE)
    assert writer.write(ref) is True
    (entry,) = node.cluster.claims[("default", "claim-u1")]["status"]["devices"]
    (grant,) = node.manager.policy.grants("u1")
    assert entry["driver"] == TA
    assert (entry["pool"], entry["device"], entry["shareID"]) == (NODE, "cpudevnuma000", "s1")
    assert entry["data"] == {
        "cpus": format_cpu_list(grant.cpus),
        "mems": "0",
        "memory": 0,
    }
    assert len(grant.cpus) == 2
    assert writer.write(ref) is False, "nothing changed: no second write"
    node.manager.plugin.node_unprepare([ref])
    assert writer.write(ref) is True
    assert node.cluster.claims[("default", "claim-u1")]["status"]["devices"] == []


def test_status_of_a_replaced_or_missing_claim_is_not_written(node: Node) -> None:
    writer = StatusWriter(node.cluster, node.manager, NODE)
    assert writer.write(ClaimRef("default", "missing", "x")) is False
    node.add_claim("u2", [])
    assert writer.write(ClaimRef("default", "claim-u2", "other-uid")) is False
    assert not [w for w in node.cluster.writes if w[0] == "status"]


def prepared(ref: ClaimRef, claim: dict[str, object] | None = None) -> RequestReport:
    """The report of a prepare of ``ref`` that went well."""
    fetched = {ref.uid: claim} if claim is not None else {}
    return RequestReport("prepare", (ref,), {ref.uid: None}, 0.01, fetched)


def unprepared(ref: ClaimRef) -> RequestReport:
    """The report of an unprepare of ``ref`` that went well (it fetches nothing)."""
    return RequestReport("unprepare", (ref,), {ref.uid: None}, 0.01, {})


def one_cpu_claim(node: Node) -> ClaimRef:
    """Claim u1, one CPU of NUMA node 0's device, on the fake API server."""
    return node.add_claim(
        "u1", [result("req", "cpudevnuma000", driver=TA, pool=NODE, consumedCapacity={"cpu": "1"})]
    )


def wait_looked_at(writer: StatusWriter, count: int) -> None:
    def looked_at() -> int:
        c = writer.counts()
        return c.written + c.unchanged + c.failed

    poll(
        lambda: looked_at() >= count or None,
        30,
        lambda: f"the writer looked at {writer.counts()}, not {count} claims",
        interval=0.01,
    )


def test_status_waits_while_the_kubelet_is_busy_and_then_writes_once(node: Node) -> None:
    """A burst of requests is served first; a claim queued many times is written once."""
    ref = one_cpu_claim(node)
    node.manager.plugin.node_prepare([ref])
    writer = StatusWriter(node.cluster, node.manager, NODE, quiet=60, max_delay=60)
    writer.start()
    for _ in range(3):
        writer.request_done(prepared(ref))
    time.sleep(0.3)  # time for a writer that does not wait to write (this one must not)
    assert ("status", "claim-u1") not in node.cluster.writes, "written while the kubelet is busy"
    writer.stop()  # the queue is written at once
    assert node.cluster.writes.count(("status", "claim-u1")) == 1
    assert writer.counts() == StatusCounts(written=1, unchanged=0, failed=0)


def test_a_claim_waits_no_longer_than_the_longest_delay(node: Node) -> None:
    ref = one_cpu_claim(node)
    node.manager.plugin.node_prepare([ref])
    writer = StatusWriter(node.cluster, node.manager, NODE, quiet=60, max_delay=0.1)
    writer.start()
    writer.request_done(prepared(ref))
    wait_looked_at(writer, 1)
    writer.stop()
    assert node.cluster.writes.count(("status", "claim-u1")) == 1


def test_a_claim_prepared_and_unprepared_before_its_turn_costs_no_write(node: Node) -> None:
    ref = one_cpu_claim(node)
    writer = StatusWriter(node.cluster, node.manager, NODE, quiet=0.2, max_delay=60)
    node.manager.plugin.node_prepare([ref])
    writer.request_done(prepared(ref, node.cluster.get_claim("default", "claim-u1")))
    node.manager.plugin.node_unprepare([ref])
    writer.request_done(unprepared(ref))
    writer.start()  # both queued before its turn, however slow the machine
    wait_looked_at(writer, 1)  # once the kubelet has been quiet for 0.2 s
    writer.stop()
    assert ("status", "claim-u1") not in node.cluster.writes
    assert writer.counts() == StatusCounts(written=0, unchanged=1, failed=0)


def test_status_writer_thread_writes_after_requests(node: Node) -> None:
    ref = one_cpu_claim(node)
    writer = StatusWriter(node.cluster, node.manager, NODE)
    writer.start()
    writer.request_done(prepared(ref))
    writer.stop()  # finishes what is queued
    assert ("status", "claim-u1") not in node.cluster.writes, "not prepared: nothing to write"
    node.manager.plugin.node_prepare([ref])
    writer = StatusWriter(node.cluster, node.manager, NODE)
    writer.start()
    writer.request_done(prepared(ref))
    writer.stop()
    assert ("status", "claim-u1") in node.cluster.writes


def wait_for(what: str, condition: Callable[[], bool]) -> None:
    poll(lambda: condition() or None, 30, lambda: what, interval=0.01)


def fast_writer(node: Node) -> StatusWriter:
    """A writer that writes at once, and tries again after 0.01 s doubling up to 0.04 s."""
    return StatusWriter(node.cluster, node.manager, NODE, quiet=0, max_delay=0, retry=(0.01, 0.04))


def test_a_failed_status_write_is_tried_again_with_backoff_until_written(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    ref = one_cpu_claim(node)
    node.manager.plugin.node_prepare([ref])
    FailingApply(node, KubeAPIError(503, "the API server is busy"), lambda: None, times=5)
    writer = fast_writer(node)
    with caplog.at_level(logging.WARNING, "nodedra.claims.status"):
        writer.start()
        writer.request_done(prepared(ref))
        wait_for("the status to be written", lambda: writer.counts().written == 1)
        writer.stop()
    assert writer.counts() == StatusCounts(written=1, unchanged=0, failed=5, retrying=0)
    assert node.cluster.writes.count(("status", "claim-u1")) == 1
    waits = [float(w) for w in re.findall(r"trying again in (\S+) s", caplog.text)]
    assert waits == [0.01, 0.02, 0.04, 0.04, 0.04], "a wait that doubles, up to the longest"


class FailingApply:
    """Status writes that fail (the first ``times``, or all), after doing ``meanwhile`` to the
    cluster. Only status writes: the slice publisher's thread talks to the cluster too, and a
    failure for any next call could meet one of its calls instead."""

    def __init__(
        self,
        node: Node,
        error: KubeAPIError,
        meanwhile: Callable[[], None],
        times: int | None = None,
    ) -> None:
        self.error = error
        self.meanwhile = meanwhile
        self.times = times
        self.tries = 0
        self.apply = node.cluster.apply_claim_status
        node.cluster.apply_claim_status = self  # type: ignore[method-assign]

    def __call__(
        self, claim: Any, devices: list[dict[str, Any]], field_manager: str
    ) -> dict[str, Any]:
        self.tries += 1
        if self.times is not None and self.tries > self.times:
            return self.apply(claim, devices, field_manager)
        self.meanwhile()
        raise self.error


@pytest.mark.parametrize("fate", ["deleted", "replaced"])
def test_retries_end_when_the_claim_is_gone(node: Node, fate: str) -> None:
    ref = one_cpu_claim(node)
    node.manager.plugin.node_prepare([ref])
    key = ("default", "claim-u1")

    def meanwhile() -> None:
        if fate == "deleted":
            del node.cluster.claims[key]
        else:
            node.cluster.claims[key]["metadata"]["uid"] = "u1-again"

    failing = FailingApply(node, KubeAPIError(409, "the UID precondition failed"), meanwhile)
    writer = fast_writer(node)
    writer.start()
    writer.request_done(prepared(ref, node.cluster.get_claim(*key)))
    wait_for("the retry to find the claim gone", lambda: writer.counts().unchanged == 1)
    assert writer.counts() == StatusCounts(written=0, unchanged=1, failed=1, retrying=0)
    writer.stop()
    assert failing.tries == 1


def test_a_conflict_reads_the_claim_again(node: Node) -> None:
    """The claim as the prepare saw it is used once; a try after a failure reads it anew."""
    ref = one_cpu_claim(node)
    node.manager.plugin.node_prepare([ref])
    claim = node.cluster.get_claim("default", "claim-u1")
    gets = node.cluster.gets
    FailingApply(node, KubeAPIError(409, "the object has been modified"), lambda: None, times=1)
    writer = fast_writer(node)
    writer.start()
    writer.request_done(prepared(ref, claim))
    wait_for("the status to be written", lambda: writer.counts().written == 1)
    writer.stop()
    assert node.cluster.gets == gets + 1
    assert writer.counts() == StatusCounts(written=1, unchanged=0, failed=1, retrying=0)


def test_a_status_the_server_finds_invalid_is_not_tried_again(node: Node) -> None:
    """As for claims whose opaque parameters the server re-encodes (docs/operations.md)."""
    ref = one_cpu_claim(node)
    node.manager.plugin.node_prepare([ref])
    failing = FailingApply(node, KubeAPIError(422, "field is immutable"), lambda: None)
    writer = fast_writer(node)
    writer.start()
    writer.request_done(prepared(ref))
    wait_for("a failed write", lambda: writer.counts().failed == 1)
    writer.stop()  # which would try once more a claim waiting to be tried again
    assert failing.tries == 1
    assert writer.counts() == StatusCounts(written=0, unchanged=0, failed=1, retrying=0)


def test_stopping_ends_the_wait_for_a_retry(node: Node) -> None:
    ref = one_cpu_claim(node)
    node.manager.plugin.node_prepare([ref])
    failing = FailingApply(node, KubeAPIError(503, "the API server is busy"), lambda: None)
    writer = StatusWriter(
        node.cluster, node.manager, NODE, quiet=0, max_delay=0, retry=(3600, 3600)
    )
    writer.start()
    writer.request_done(prepared(ref))
    wait_for("a failed write", lambda: writer.counts().retrying == 1)
    metrics = Metrics()
    metrics.count_claim_watch(lambda: ClaimWatchCounts(1, 1, 0, 0), writer.counts)
    assert metrics.registry.get_sample_value("nodedra_claim_status_retrying") == 1
    writer.request_done(prepared(ref))  # queued again: it keeps its wait, in its newest state
    stopper = threading.Thread(target=writer.stop)
    stopper.start()
    stopper.join(timeout=30)
    assert not stopper.is_alive(), "stop() waited for the retry"
    assert failing.tries == 2, "tried once more on the way out, and no more"
    assert writer.counts() == StatusCounts(written=0, unchanged=0, failed=2, retrying=0)


class Recorder:
    """Keeps the plugin's request reports."""

    def __init__(self) -> None:
        self.reports: list[RequestReport] = []

    def request_done(self, report: RequestReport) -> None:
        self.reports.append(report)


def test_status_after_a_prepare_reuses_its_claim_and_waits_for_no_lock(node: Node) -> None:
    """The plugin fetched the claim and the checkpoint has its grants: writing the status
    reads the claim no second time and does not wait for a kubelet request in flight."""
    node.manager.stop()
    recorder = Recorder()
    node.manager = node.new_manager(observer=recorder)
    node.manager.start()
    ref = node.add_claim(
        "u1", [result("req", "cpudevnuma000", driver=TA, pool=NODE, consumedCapacity={"cpu": "2"})]
    )
    node.manager.plugin.node_prepare([ref])
    (report,) = recorder.reports
    claim = report.fetched["u1"]
    assert claim["metadata"]["uid"] == "u1"
    gets = node.cluster.gets
    writer = StatusWriter(node.cluster, node.manager, NODE)
    written: list[bool] = []
    with node.manager:  # a kubelet request in flight holds the lock
        worker = threading.Thread(target=lambda: written.append(writer.write(ref, claim)))
        worker.start()
        worker.join(timeout=30)
        assert written == [True], "the status write waited for the lock, or wrote nothing"
    assert node.cluster.gets == gets, "the claim was read again"
    (entry,) = node.cluster.claims[("default", "claim-u1")]["status"]["devices"]
    (grant,) = node.manager.policy.grants("u1")
    assert entry["data"]["cpus"] == format_cpu_list(grant.cpus)
