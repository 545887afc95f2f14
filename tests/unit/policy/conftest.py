"""Topologies of the fixture machines, and a host that records what a policy publishes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from nodedra.dra import AllocationResult
from nodedra.topology import read_topology
from nodedra.topology.model import Topology

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"
SHAPES = sorted(p.name for p in FIXTURES.iterdir() if (p / "devices").is_dir())


def topology(shape: str) -> Topology:
    return read_topology(FIXTURES / shape)


class Host:
    """A PolicyHost that keeps what it was asked to publish."""

    def __init__(self) -> None:
        self.published: list[list[dict[str, Any]]] = []

    def publish_devices(self, devices: Sequence[Mapping[str, Any]]) -> None:
        self.published.append([dict(d) for d in devices])


@pytest.fixture
def host() -> Host:
    return Host()


def claim(uid: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "namespace": "default", "name": f"claim-{uid}"}}


def ask(device: str, request: str = "req", **consumed: str) -> AllocationResult:
    """A result of the topology-aware driver consuming ``consumed`` of ``device``."""
    return AllocationResult(
        request=request,
        driver="topology-aware.nri.io",
        pool="node",
        device=device,
        consumed_capacity=consumed,
    )
