"""Metrics and log formats."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import pytest
from prometheus_client import generate_latest

from nodedra import httpserver
from nodedra.dra import ClaimRef, RequestReport
from nodedra.observability import JSONFormatter, Metrics, NodeUsage, Observers, TextFormatter

REF = ClaimRef("ns", "name", "uid-1")


def record(message: str, claim: ClaimRef | None = None) -> logging.LogRecord:
    rec = logging.LogRecord("nodedra.dra.plugin", logging.ERROR, __file__, 1, message, (), None)
    if claim is not None:
        rec.claim = claim
    return rec


def test_json_lines_name_the_claim() -> None:
    line = json.loads(JSONFormatter().format(record("it failed", REF)))
    assert line["message"] == "it failed"
    assert line["level"] == "error"
    assert (line["claim_uid"], line["claim_namespace"], line["claim_name"]) == (
        "uid-1",
        "ns",
        "name",
    )
    assert "claim_uid" not in json.loads(JSONFormatter().format(record("no claim")))


def test_text_lines_add_the_claim_when_the_message_lacks_it() -> None:
    assert (
        TextFormatter()
        .format(record("it failed", REF))
        .endswith("it failed claim_uid=uid-1 claim_namespace=ns claim_name=name")
    )
    assert (
        TextFormatter()
        .format(record("claim ns/name (uid-1) failed", REF))
        .endswith("claim ns/name (uid-1) failed")
    )


def sample(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return metrics.registry.get_sample_value(name, labels or {})


def test_request_metrics() -> None:
    metrics = Metrics()
    other = ClaimRef("ns", "b", "uid-2")
    errors = {"uid-1": None, "uid-2": ValueError("x")}
    metrics.request_done(RequestReport("prepare", (REF, other), errors, 0.02))
    metrics.request_done(RequestReport("unprepare", (REF,), {"uid-1": None}, 0.001))
    assert sample(metrics, "nodedra_requests_total", {"kind": "prepare", "result": "ok"}) == 1
    assert sample(metrics, "nodedra_requests_total", {"kind": "prepare", "result": "error"}) == 1
    assert sample(metrics, "nodedra_requests_total", {"kind": "unprepare", "result": "ok"}) == 1
    assert sample(metrics, "nodedra_request_seconds_count", {"kind": "prepare"}) == 1
    assert (
        sample(metrics, "nodedra_request_seconds_bucket", {"kind": "prepare", "le": "0.025"}) == 1
    )
    assert sample(metrics, "nodedra_request_seconds_bucket", {"kind": "prepare", "le": "0.01"}) == 0


class Failing:
    """An observer with a bug."""

    def request_done(self, report: RequestReport) -> None:
        raise RuntimeError("observer bug")


class Recorder:
    def __init__(self) -> None:
        self.reports: list[RequestReport] = []

    def request_done(self, report: RequestReport) -> None:
        self.reports.append(report)


def test_an_observer_that_fails_is_counted_and_the_others_are_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    after = Recorder()
    observers = Observers(metrics, Failing())
    observers.add(after)
    report = RequestReport("prepare", (REF,), {"uid-1": None}, 0.01)
    with caplog.at_level(logging.ERROR):
        observers.request_done(report)
        observers.request_done(report)
    assert after.reports == [report, report]
    assert sample(metrics, "nodedra_requests_total", {"kind": "prepare", "result": "ok"}) == 2
    assert sample(metrics, "nodedra_observer_errors_total", {"observer": "Failing"}) == 2
    assert "observer Failing failed on a prepare request" in caplog.text
    assert "observer bug" in caplog.text


def test_usage_is_read_at_scrape_time() -> None:
    usage = [NodeUsage(4, 2, {0: 3, 1: 0}, {0: 11, 1: 14})]
    metrics = Metrics(lambda: usage[0])
    assert sample(metrics, "nodedra_cpus_free", {"numa_node": "0"}) == 11
    usage[0] = NodeUsage(4, 3, {0: 4, 1: 0}, {0: 10, 1: 14})
    assert sample(metrics, "nodedra_cpus_allocated", {"numa_node": "0"}) == 4
    assert sample(metrics, "nodedra_claims_held") == 3
    assert sample(metrics, "nodedra_devices_published") == 4
    assert (
        sample(metrics, "nodedra_api_feature_gate", {"gate": "DRANodeAllocatableResources"}) is None
    )
    usage[0] = NodeUsage(4, 3, {}, {}, feature_gates={"DRANodeAllocatableResources": False})
    assert sample(metrics, "nodedra_api_feature_gate", {"gate": "DRANodeAllocatableResources"}) == 0


def test_claims_holding_capacity_no_longer_offered_are_counted_by_capacity() -> None:
    usage = [NodeUsage(4, 3, {}, {}, capacity_missing={"hugepages_1Gi": 2})]
    metrics = Metrics(lambda: usage[0])
    assert sample(metrics, "nodedra_claims_capacity_missing", {"capacity": "hugepages_1Gi"}) == 2
    usage[0] = NodeUsage(4, 1, {}, {})  # released, or the pages are back
    assert sample(metrics, "nodedra_claims_capacity_missing", {"capacity": "hugepages_1Gi"}) is None


def test_devices_withheld_are_counted_by_gate() -> None:
    usage = [NodeUsage(0, 0, {}, {}, devices_withheld={"DRAConsumableCapacity": 2})]
    metrics = Metrics(lambda: usage[0])
    assert sample(metrics, "nodedra_devices_withheld", {"gate": "DRAConsumableCapacity"}) == 2
    assert sample(metrics, "nodedra_devices_published") == 0
    usage[0] = NodeUsage(2, 0, {}, {})  # allowed whole, or the gate turned on
    assert sample(metrics, "nodedra_devices_withheld", {"gate": "DRAConsumableCapacity"}) is None


def test_metrics_and_readiness_endpoints() -> None:
    metrics = Metrics()
    metrics.orphans.set(2)
    state = {"ready": False}
    app = httpserver.metrics_app(metrics.registry, lambda: (state["ready"], {"problems": ["x"]}))
    port, stop = httpserver.serve("127.0.0.1", 0, app)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert refused.value.code == 503
        assert json.loads(refused.value.read()) == {"ready": False, "problems": ["x"]}
        state["ready"] = True
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as response:
            assert json.loads(response.read())["ready"] is True
    finally:
        stop()
    assert "nodedra_orphan_claims 2.0" in text
    assert text == generate_latest(metrics.registry).decode()
