"""The checks kept by the running agent: at start, again and again, said where one looks.

``nodedra run`` runs the checks before it connects to the runtime, then from its periodic
handler: the kubelet's files on every call (one small read each), what the API server
knows every ``CLUSTER_PERIOD`` seconds. A check that turns ``warn`` or ``fail`` is logged
and recorded as a Warning Event on the Node; one that turns ``ok`` again is logged. Failures
make ``/readyz`` answer not ready, with each failure and its fix, and
``nodedra_preflight_checks{check,status}`` says where every check stands.

A failing CPU manager check holds pinning (:meth:`Preflight.holding`): claims are refused
with the conflict and the steps out of it, and containers keep the cpusets the kubelet
gives them. Since the check is made again, nodedra proceeds as soon as the admin has moved
the node off the kubelet's CPU manager, without a restart (in a pod: see
:mod:`nodedra.preflight.kubelet` on a replaced state file).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client import Gauge

from nodedra.nodeevents import NodeEvents

from .checks import STATUSES, Check
from .gather import ControlPlane, Inputs, NodeFacts, cluster_checks, kubelet_checks

log = logging.getLogger(__name__)

CLUSTER_PERIOD = 300.0
"""Seconds between two rounds of the checks that ask the API server."""
CPU_MANAGER = "kubelet-cpu-manager"
PINNING_CHECKS = frozenset({CPU_MANAGER, "container-runtime", "other-cpu-drivers"})
"""Checks that matter only where nodedra pins containers."""
ACTION = "Preflight"
REASONS = {
    CPU_MANAGER: "KubeletCPUManagerConflict",
    "container-runtime": "ContainerRuntimeUnsupported",
    "other-cpu-drivers": "OtherCPUDriver",
}
"""The reasons of the Events on the Node; other checks: ``Preflight<Status>``."""


class Preflight:
    """The last verdict of every check, made again as time goes."""

    def __init__(
        self,
        inputs: Inputs,
        api: NodeFacts,
        node_name: str,
        *,
        pinning: bool,
        control: ControlPlane,
        events: NodeEvents | None = None,
        gauge: Gauge | None = None,
        kubelet_asked: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inputs = inputs
        self._api = api
        self._node = node_name
        self._pinning = pinning
        self._control = control
        self._events = events
        self._clock = clock
        self._mu = threading.Lock()
        self._kubelet: list[Check] = []
        self._cluster: list[Check] = []
        self._asked: float | None = None
        self._kubelet_asked = kubelet_asked
        self._gauge = gauge
        """``nodedra_preflight_checks{check,status}``, if kept."""

    def results(self) -> list[Check]:
        """Every check's last verdict (none before the first :meth:`check`)."""
        with self._mu:
            return [*self._kubelet, *self._cluster]

    def check(self) -> list[Check]:
        """Make the checks again (those asking the API server when due); report changes."""
        kubelet = kubelet_checks(self._inputs, self._kubelet_asked())
        now = self._clock()
        cluster = None
        if self._asked is None or now - self._asked >= CLUSTER_PERIOD:
            cluster = cluster_checks(self._api, self._node, self._control)
            self._asked = now
        with self._mu:
            before = {c.name: c for c in (*self._kubelet, *self._cluster)}
            self._kubelet = kubelet
            if cluster is not None:
                self._cluster = cluster
            results = [*self._kubelet, *self._cluster]
        changed = [c for c in results if before.get(c.name) != c]
        for check in changed:
            self._gauge_set(check)
        self._report([c for c in changed if _news(c, before.get(c.name))], before)
        return results

    def holding(self) -> str | None:
        """Why claims and pinning are held (the kubelet's CPU manager), or None."""
        if not self._pinning:
            return None
        with self._mu:
            found = next((c for c in self._kubelet if c.name == CPU_MANAGER), None)
        if found is None or found.status != "fail":
            return None
        return f"{found.detail}. To fix: {found.fix}"

    def problems(self) -> list[str]:
        """The failures that make nodedra not ready, each with its fix."""
        return [
            f"{c.name}: {c.detail}. To fix: {c.fix}"
            for c in self.results()
            if c.status == "fail" and (self._pinning or c.name not in PINNING_CHECKS)
        ]

    def _gauge_set(self, check: Check) -> None:
        if self._gauge is None:
            return
        for status in STATUSES:
            self._gauge.labels(check.name, status).set(1 if status == check.status else 0)

    def _report(self, changed: list[Check], before: Mapping[str, Check]) -> None:
        for check in changed:
            if check.status in ("warn", "fail"):
                level = logging.ERROR if check.status == "fail" else logging.WARNING
                log.log(
                    level,
                    "preflight %s: %s: %s (fix: %s)",
                    check.status,
                    check.name,
                    check.detail,
                    check.fix,
                )
            elif check.status == "ok" and before.get(check.name) is not None:
                log.info("preflight ok again: %s: %s", check.name, check.detail)
            else:
                log.info("preflight %s: %s: %s", check.status, check.name, check.detail)
        worth = [c for c in changed if c.status in ("warn", "fail")]
        if worth and self._events is not None:
            threading.Thread(
                target=_post, args=(worth, self._events), name="node-events-preflight", daemon=True
            ).start()


def _news(check: Check, before: Check | None) -> bool:
    """Whether ``check`` is news: new, or another status than before (not a detail)."""
    return before is None or before.status != check.status


def _post(checks: list[Check], events: NodeEvents) -> None:
    """Record each as a Warning Event on the Node (best-effort, off the caller's thread)."""
    for check in checks:
        reason = REASONS.get(check.name, f"Preflight{check.status.capitalize()}")
        events.warning(reason, ACTION, f"{check.detail}. To fix: {check.fix}")
