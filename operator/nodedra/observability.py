"""Metrics and logs: what someone paged at 3 a.m. looks at first.

Metrics are Prometheus metrics on their own registry, served over HTTP: kubelet requests
(counts, errors, latency), what is published, what claims hold, free and allocated CPUs per
NUMA node, claims gone from the API, claims holding what the node no longer offers,
configuration reloads. Logs are lines of text or JSON; every line about a claim carries its
UID, namespace and name as fields.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodedra.dra import ClaimRef, RequestObserver, RequestReport

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass(frozen=True)
class PinningUsage:
    """A snapshot of the containers' pinning."""

    connected: bool
    pinned: int
    """Containers running on their claims' CPUs."""
    containers: int
    """Containers known to run on the node."""
    shared_cpus: int
    unreserved: int
    """Containers seen naming claims not reserved for their pods, so far."""
    cpu_manager_conflicts: int = 0
    """Cpusets the kubelet asked for, so far: its CPU manager pins containers too."""
    container_errors: int = 0
    """Containers given the shared pool because what the runtime sent about them could
    not be read, or handling it failed, so far."""


@dataclass(frozen=True)
class NodeUsage:
    """A snapshot of what the policy has handed out."""

    devices: int
    claims: int
    allocated_cpus: Mapping[int, int]
    """NUMA node -> CPUs held by claims."""
    free_cpus: Mapping[int, int]
    """NUMA node -> grantable CPUs nobody holds."""
    pinning: PinningUsage | None = None
    """None when pinning is off."""
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    """API server feature gate -> on, for the gates probed so far."""
    capacity_missing: Mapping[str, int] = field(default_factory=dict)
    """Device capacity (``hugepages_1Gi``) -> claims holding more of it than their devices
    offer now (a boot with fewer huge pages)."""
    devices_withheld: Mapping[str, int] = field(default_factory=dict)
    """Feature gate -> devices not published because, with the gate off, a claim would take
    each whole (topology-aware: a NUMA node)."""


@dataclass(frozen=True)
class ClaimWatchCounts:
    """What the ResourceClaim watch has done so far."""

    lists: int
    watches: int
    """WATCH requests: one after each list, one more each time the server ends a watch."""
    parsed: int
    """Watch events parsed: those of our claims, bookmarks and errors."""
    skipped: int
    """Watch events dropped unparsed: other nodes' and other drivers' claims."""


@dataclass(frozen=True)
class StatusCounts:
    """What the claim status writer has done so far."""

    written: int
    unchanged: int
    """Claims looked at whose status was already right, or that were gone: no write."""
    failed: int
    """Tries that failed (tried again, unless the server finds the write invalid)."""
    retrying: int = 0
    """Claims whose write failed, waiting to be tried again."""


class _QuietCollector(Collector):
    def __init__(
        self, status: Callable[[], Mapping[str, Any]], passes: Callable[[], tuple[int, float]]
    ) -> None:
        self._status = status
        self._passes = passes

    def collect(self) -> Iterable[Metric]:
        count, seconds = self._passes()
        yield CounterMetricFamily(
            "nodedra_quiet_cpu_passes",
            "Passes quietCPUs made over the host's work (one after each change of the claims "
            "or of the configuration, and every 10 s).",
            value=count,
        )
        yield CounterMetricFamily(
            "nodedra_quiet_cpu_pass_seconds",
            "Seconds those passes took: the time from a claim's change to its CPUs kept quiet.",
            value=seconds,
        )
        status = self._status()
        sources = GaugeMetricFamily(
            "nodedra_quiet_cpu_sources",
            "Sources of the host's work (interrupts, workqueues, systemd's slices) quietCPUs "
            "steers, by whether they are kept off every claimed CPU (off_claims) or still may "
            "run on one (left).",
            labels=["state"],
        )
        left = len(status.get("left", ()))
        sources.add_metric(["off_claims"], status.get("sources", 0) - left)
        sources.add_metric(["left"], left)
        yield sources


class _ClaimWatchCollector(Collector):
    def __init__(
        self, counts: Callable[[], ClaimWatchCounts], status: Callable[[], StatusCounts]
    ) -> None:
        self._counts = counts
        self._status = status

    def collect(self) -> Iterable[Metric]:
        counts = self._counts()
        yield CounterMetricFamily(
            "nodedra_claim_watch_lists",
            "LISTs of all ResourceClaims: one per start, one more per watch the server expired.",
            value=counts.lists,
        )
        yield CounterMetricFamily(
            "nodedra_claim_watch_requests",
            "WATCH requests of ResourceClaims: one after each list, one per watch resumed.",
            value=counts.watches,
        )
        events = CounterMetricFamily(
            "nodedra_claim_watch_events",
            "ResourceClaim watch events, by whether they were parsed (false: not ours, dropped).",
            labels=["parsed"],
        )
        events.add_metric(["true"], counts.parsed)
        events.add_metric(["false"], counts.skipped)
        yield events
        status = self._status()
        writes = CounterMetricFamily(
            "nodedra_claim_status_writes",
            "Claims whose status.devices was brought up to date, by result "
            "(unchanged: it was right already, no write).",
            labels=["result"],
        )
        for result, value in (
            ("written", status.written),
            ("unchanged", status.unchanged),
            ("failed", status.failed),
        ):
            writes.add_metric([result], value)
        yield writes
        yield GaugeMetricFamily(
            "nodedra_claim_status_retrying",
            "Claims whose status write failed, waiting to be tried again.",
            value=status.retrying,
        )


class _UsageCollector(Collector):
    """Reads the usage gauges when Prometheus scrapes, not on every change."""

    def __init__(self, usage: Callable[[], NodeUsage | None]) -> None:
        self._usage = usage

    def collect(self) -> Iterable[Metric]:
        usage = self._usage()
        if usage is None:
            return
        yield GaugeMetricFamily(
            "nodedra_devices_published",
            "Devices the policy publishes (less those withheld).",
            value=usage.devices,
        )
        withheld = GaugeMetricFamily(
            "nodedra_devices_withheld",
            "Devices not published because the API server has the feature gate off and a claim "
            "would take each whole (a NUMA node): see /readyz and the Node's Events.",
            labels=["gate"],
        )
        for gate, count in sorted(usage.devices_withheld.items()):
            withheld.add_metric([gate], count)
        yield withheld
        yield GaugeMetricFamily(
            "nodedra_claims_held", "Claims the policy holds.", value=usage.claims
        )
        for name, doc, values in (
            ("nodedra_cpus_allocated", "CPUs held by claims.", usage.allocated_cpus),
            ("nodedra_cpus_free", "Grantable CPUs nobody holds.", usage.free_cpus),
        ):
            family = GaugeMetricFamily(name, doc, labels=["numa_node"])
            for node, count in sorted(values.items()):
                family.add_metric([str(node)], count)
            yield family
        gates = GaugeMetricFamily(
            "nodedra_api_feature_gate",
            "1 if the API server has the feature gate on (probed once; fields of gates that "
            "are off are not published).",
            labels=["gate"],
        )
        for gate, on in sorted(usage.feature_gates.items()):
            gates.add_metric([gate], int(on))
        yield gates
        missing = GaugeMetricFamily(
            "nodedra_claims_capacity_missing",
            "Claims holding capacity their device does not offer now (huge pages a boot took), "
            "by capacity: kept, and named in the log and a Node Event.",
            labels=["capacity"],
        )
        for capacity, claims in sorted(usage.capacity_missing.items()):
            missing.add_metric([capacity], claims)
        yield missing
        pinning = usage.pinning
        if pinning is None:
            return
        for name, doc, value in (
            ("nodedra_nri_connected", "1 while synchronized with the runtime.", pinning.connected),
            ("nodedra_pinned_containers", "Containers on their claims' CPUs.", pinning.pinned),
            ("nodedra_containers", "Containers known to run on the node.", pinning.containers),
            ("nodedra_shared_cpus", "CPUs of the containers without claims.", pinning.shared_cpus),
        ):
            yield GaugeMetricFamily(name, doc, value=int(value))
        yield CounterMetricFamily(
            "nodedra_unreserved_claims",
            "Containers that named claims not reserved for their pod (given the shared pool).",
            value=pinning.unreserved,
        )
        yield CounterMetricFamily(
            "nodedra_cpu_manager_conflicts",
            "Cpusets the kubelet asked for: its CPU manager policy is not none.",
            value=pinning.cpu_manager_conflicts,
        )
        yield CounterMetricFamily(
            "nodedra_container_errors",
            "Containers given the shared pool because what the runtime sent about them "
            "could not be read, or handling it failed.",
            value=pinning.container_errors,
        )


class Metrics:
    """nodedra's metrics, on a registry of their own (no process-global state)."""

    def __init__(self, usage: Callable[[], NodeUsage | None] = lambda: None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "nodedra_requests",
            "Claims in kubelet requests, by request kind and result.",
            ["kind", "result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "nodedra_request_seconds",
            "Time to answer a kubelet request, by kind.",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.preflight = Gauge(
            "nodedra_preflight_checks",
            "1 for the status each preflight check has now (ok, unknown, warn, fail).",
            ["check", "status"],
            registry=self.registry,
        )
        self.orphans = Gauge(
            "nodedra_orphan_claims",
            "Claims held here whose ResourceClaim is gone from the API server.",
            registry=self.registry,
        )
        self.observer_errors = Counter(
            "nodedra_observer_errors",
            "Failures of those told about kubelet requests (metrics, claim status), by observer.",
            ["observer"],
            registry=self.registry,
        )
        self.nri_events = Counter(
            "nodedra_nri_events",
            "Events of the container runtime answered, by event and result.",
            ["event", "result"],
            registry=self.registry,
        )
        self.nri_latency = Histogram(
            "nodedra_nri_event_seconds",
            "Time to answer an event of the container runtime, by event.",
            ["event"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.config_reloads = Counter(
            "nodedra_config_reloads",
            "Configuration changes seen, by result (applied or refused).",
            ["result"],
            registry=self.registry,
        )
        self.registry.register(_UsageCollector(usage))

    def show_quiet_cpus(
        self, status: Callable[[], Mapping[str, Any]], passes: Callable[[], tuple[int, float]]
    ) -> None:
        """Show what ``quietCPUs`` keeps off the claimed CPUs and the passes it made.

        ``status`` is QuietKeeper.status; ``passes`` their count and seconds.
        """
        self.registry.register(_QuietCollector(status, passes))

    def count_claim_watch(
        self, counts: Callable[[], ClaimWatchCounts], status: Callable[[], StatusCounts]
    ) -> None:
        """Show the ResourceClaim watch's and the status writer's counts (watch on)."""
        self.registry.register(_ClaimWatchCollector(counts, status))

    def request_done(self, report: RequestReport) -> None:
        """Count a kubelet request (the plugin's RequestObserver)."""
        self.latency.labels(report.kind).observe(report.seconds)
        for ref in report.claims:
            result = "error" if report.errors.get(ref.uid) is not None else "ok"
            self.requests.labels(report.kind, result).inc()

    def event_done(self, event: str, result: str, seconds: float) -> None:
        """Count an event of the runtime (the NRI plugin's EventObserver)."""
        self.nri_events.labels(event, result).inc()
        self.nri_latency.labels(event).observe(seconds)


class Observers:
    """Hands each kubelet request to the metrics and to other observers (claim status).

    Each observer is told on its own: one that raises is logged and counted
    (``nodedra_observer_errors_total``), and the others are told all the same.
    """

    def __init__(self, metrics: Metrics, *observers: RequestObserver) -> None:
        self._metrics = metrics
        self._observers = [metrics, *observers]

    def add(self, observer: RequestObserver) -> None:
        """Tell ``observer`` too, from the next request on."""
        self._observers.append(observer)

    def request_done(self, report: RequestReport) -> None:
        """Tell every observer."""
        for observer in self._observers:
            try:
                observer.request_done(report)
            except Exception:
                name = type(observer).__name__
                log.exception("observer %s failed on a %s request", name, report.kind)
                self._metrics.observer_errors.labels(name).inc()


class JSONFormatter(logging.Formatter):
    """One JSON object a line, with the claim's UID, namespace and name as fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as JSON."""
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(claim_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    """Plain lines; a claim's fields are appended where the message does not name them."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The record as a line of text."""
        line = super().format(record)
        fields = claim_fields(record)
        if fields and fields["claim_uid"] not in record.getMessage():
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return line


def claim_fields(record: logging.LogRecord) -> dict[str, str]:
    """The claim a log record is about, if any (``extra={"claim": ClaimRef}``)."""
    claim = getattr(record, "claim", None)
    if not isinstance(claim, ClaimRef):
        return {}
    return {"claim_uid": claim.uid, "claim_namespace": claim.namespace, "claim_name": claim.name}


def configure_logging(level: str, fmt: str) -> None:
    """Send every logger's records to stderr in ``fmt`` (text or json) from ``level`` up."""
    handler = logging.StreamHandler()
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
