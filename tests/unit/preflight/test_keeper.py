"""The agent's checks: made again as time goes, held pinning, readiness, Events, the metric."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

from nodedra.dra import KubeAPIError
from nodedra.nodeevents import NodeEvents
from nodedra.preflight import ControlPlane, Inputs, Preflight
from nodedra.preflight.keeper import CLUSTER_PERIOD, REASONS
from tests.peers.cluster import poll
from tests.unit.dra.fakes import NODE, FakeCluster


class Facts:
    """The API server as the checks ask it (nodedra's own NodeFacts protocol)."""

    def __init__(self) -> None:
        self.runtime = "containerd://2.4.2"
        self.asked = 0
        self.down = False

    def get_node(self, name: str) -> dict[str, Any]:
        self.asked += 1
        if self.down:
            raise KubeAPIError(0, "GET /api/v1/nodes: connection refused")
        return {"status": {"nodeInfo": {"containerRuntimeVersion": self.runtime}}}

    def list_node_slices(self, node_name: str) -> list[dict[str, Any]]:
        return []


class Setup:
    def __init__(self, tmp_path: Path, *, pinning: bool = True) -> None:
        self.state = tmp_path / "cpu_manager_state"
        self.facts = Facts()
        self.cluster = FakeCluster()
        self.registry = CollectorRegistry()
        self.now = 0.0
        self.preflight = Preflight(
            Inputs(self.state, None, frozenset({0})),
            self.facts,
            NODE,
            pinning=pinning,
            control=ControlPlane(
                lambda: {"DRAConsumableCapacity": True}, {}, "v1.37.2", lambda: "scalar"
            ),
            events=NodeEvents(self.cluster, NODE, "static.nri.io"),
            gauge=Gauge(
                "nodedra_preflight_checks", "status", ["check", "status"], registry=self.registry
            ),
            clock=lambda: self.now,
        )

    def policy(self, name: str) -> None:
        self.state.write_text(json.dumps({"policyName": name}))

    def gauge(self, check: str, status: str) -> float | None:
        return self.registry.get_sample_value(
            "nodedra_preflight_checks", {"check": check, "status": status}
        )


def test_a_static_cpu_manager_holds_pinning_until_it_is_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    setup = Setup(tmp_path)
    setup.policy("static")
    setup.preflight.check()
    held = setup.preflight.holding()
    assert held is not None
    assert "policy is static" in held
    assert "To fix: move the node off the kubelet's CPU manager" in held
    (problem,) = setup.preflight.problems()
    assert problem.startswith("kubelet-cpu-manager: the kubelet's CPU manager policy is static")
    assert setup.gauge("kubelet-cpu-manager", "fail") == 1
    assert setup.gauge("kubelet-cpu-manager", "ok") == 0
    event = poll(lambda: next(iter(setup.cluster.events), None), 10, lambda: "an Event on the Node")
    assert (event["reason"], event["type"]) == (REASONS["kubelet-cpu-manager"], "Warning")
    assert "policy is static" in event["note"]

    setup.policy("none")
    with caplog.at_level(logging.INFO, logger="nodedra.preflight.keeper"):
        setup.preflight.check()
    assert setup.preflight.holding() is None
    assert setup.preflight.problems() == []
    assert setup.gauge("kubelet-cpu-manager", "ok") == 1
    assert "preflight ok again: kubelet-cpu-manager" in caplog.text


def test_an_unknown_cpu_manager_holds_nothing(tmp_path: Path) -> None:
    setup = Setup(tmp_path)  # no state file
    (check, *_) = setup.preflight.check()
    assert check.status == "unknown"
    assert setup.preflight.holding() is None
    assert setup.preflight.problems() == []


def test_without_pinning_the_cpu_manager_holds_nothing(tmp_path: Path) -> None:
    setup = Setup(tmp_path, pinning=False)
    setup.policy("static")
    setup.facts.runtime = "containerd://1.7.24"
    setup.preflight.check()
    assert setup.preflight.holding() is None
    assert setup.preflight.problems() == []


def test_the_api_server_is_asked_once_per_period_and_an_outage_is_unknown(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    setup.facts.runtime = "containerd://1.7.24"
    setup.preflight.check()
    setup.now += CLUSTER_PERIOD / 2
    setup.preflight.check()
    assert setup.facts.asked == 1
    assert any(
        p.startswith("container-runtime: containerd://1.7.24") for p in setup.preflight.problems()
    )
    setup.facts.down = True
    setup.now += CLUSTER_PERIOD
    results = {c.name: c for c in setup.preflight.check()}
    assert setup.facts.asked == 2
    assert results["container-runtime"].status == "unknown"
    assert "connection refused" in results["container-runtime"].detail
