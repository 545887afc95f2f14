"""Containers wait for nodedra where containerd requires it: a real node (kubelet, containerd,
runc) whose containerd runs NRI's default validator with ``required_plugins = ['nodedra']``
(docs/pinning.md, "Holding containers while nodedra is down";
``RealNode(require_nodedra=True)``).

Without it, a container created while nodedra is down runs on every CPU, claimed ones
included, until nodedra's Synchronize (test_node_pinning.py's restart test shows that). With
it, containerd refuses the creation, the kubelet retries, and the container starts once nodedra
is back: pinned from its first instruction, as its own first report says.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from nodedra.topology import format_cpu_list, parse_cpu_list
from tests.conftest import NodedraFactory, RealNodeFactory
from tests.integration.test_node_pinning import Pinned, pinned_node
from tests.peers.cluster import get_pod, poll
from tests.peers.controlplane import ControlPlane
from tests.peers.pods import WORKLOAD_CONTAINER, pod_events, wait_reports
from tests.peers.runtime import NODE_RUNTIMES

POLICY = "topology-aware"
REFUSAL = 'required plugin "nodedra" not present'
"""NRI's default validator, when a required plugin did not take part in a creation
(plugins/default-validator/default-validator.go, NRI v0.10.0 and later)."""


@pytest.fixture(params=NODE_RUNTIMES)
def required(
    request: pytest.FixtureRequest,
    workload_controllers: ControlPlane,
    namespace: str,
    real_node_factory: RealNodeFactory,
    nodedra_factory: NodedraFactory,
) -> Pinned:
    return pinned_node(
        workload_controllers,
        namespace,
        real_node_factory,
        nodedra_factory,
        runtime=request.param,
        policy=POLICY,
        require_nodedra=True,
    )


def container_state(pinned: Pinned, pod: str) -> dict[str, Any]:
    """The workload container's status (empty before the kubelet reports one)."""
    found = get_pod(pinned.cp, pinned.namespace, pod)
    for status in (found.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == WORKLOAD_CONTAINER:
            return dict(status)
    return {}


def wait_refused(pinned: Pinned, pod: str, old: str | None = None) -> dict[str, Any]:
    """Wait until the kubelet reports containerd's refusal for the pod's container; its
    status. Fails at once if a container other than ``old`` (the one that ran before
    nodedra went away, if any) runs."""
    seen: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        nonlocal seen
        seen = container_state(pinned, pod)
        if "running" in seen.get("state", {}) and seen.get("containerID") != old:
            raise AssertionError(f"pod {pod}'s container started while nodedra is down: {seen}")
        waiting = seen.get("state", {}).get("waiting") or {}
        return seen if REFUSAL in waiting.get("message", "") else None

    return poll(
        check,
        90,
        lambda: (
            f"pod {pod}'s container refused ({REFUSAL!r}); its status {seen}; "
            f"events {pod_events(pinned.cp, pinned.namespace, pod)}"
        ),
        0.2,
    )


def wait_running(pinned: Pinned, pod: str, old: str | None = None) -> None:
    """Wait until a container other than ``old`` runs (after the kubelet's back-off, for a
    container that exited)."""
    seen: dict[str, Any] = {}

    def check() -> bool | None:
        nonlocal seen
        seen = container_state(pinned, pod)
        running = "running" in seen.get("state", {})
        return True if running and seen.get("containerID") != old else None

    poll(
        check,
        300,
        lambda: (
            f"a new container of pod {pod} running; its status {seen}; "
            f"events {pod_events(pinned.cp, pinned.namespace, pod)}"
        ),
        0.2,
    )


def test_containers_wait_for_nodedra_and_start_pinned(required: Pinned) -> None:
    """While nodedra is down, neither a new pod's container nor a claim's container that
    exited is created (containerd says why, the kubelet retries); once nodedra is back both
    start on the CPUs nodedra gives them."""
    pinned = required
    pod = pinned.run_claim_pod("claimer")
    cpus, _ = pinned.grants(pinned.claim_of(pod)["metadata"]["uid"])
    shared = pinned.online - cpus
    (report, *_) = wait_reports(pinned.cp, pinned.namespace, "claimer")
    assert parse_cpu_list(report["cpus_allowed_list"]) == cpus, report

    pinned.nodedra.kill()
    # Away: a new pod, and the claim's container exits and is to be started again.
    pinned.create("meanwhile")
    old_claimer = container_state(pinned, "claimer")["containerID"]
    pinned.node.runtime.kill_container(old_claimer.split("://", 1)[-1])

    held = {
        "meanwhile": wait_refused(pinned, "meanwhile"),
        "claimer": wait_refused(pinned, "claimer", old=old_claimer),
    }
    # Neither runs: the new pod's container was never created, the claim's is not again.
    assert "containerID" not in held["meanwhile"], held["meanwhile"]
    assert held["claimer"]["lastState"]["terminated"]["containerID"] == old_claimer
    message = held["meanwhile"]["state"]["waiting"]["message"]
    assert held["meanwhile"]["state"]["waiting"]["reason"] == "CreateContainerError", message

    pinned.start_nodedra()
    back = time.monotonic()
    wait_running(pinned, "meanwhile")
    meanwhile_after = time.monotonic() - back
    wait_running(pinned, "claimer", old=old_claimer)
    claimer_after = time.monotonic() - back
    # Each container's first report, made as its process started: pinned from the start.
    (first, *_) = wait_reports(pinned.cp, pinned.namespace, "meanwhile")
    assert parse_cpu_list(first["cpus_allowed_list"]) == shared, first
    (first, *_) = wait_reports(pinned.cp, pinned.namespace, "claimer")
    assert parse_cpu_list(first["cpus_allowed_list"]) == cpus, first
    assert pinned.runs_on("meanwhile") == shared
    assert pinned.runs_on("claimer") == cpus
    print(
        f"{pinned.node.runtime.name}: refused with {message!r}; "
        f"running {meanwhile_after:.1f} s (new pod) and {claimer_after:.1f} s (restarted "
        f"claim's container) after nodedra was ready again; claim CPUs "
        f"{format_cpu_list(cpus)}, shared {format_cpu_list(shared)}"
    )
