"""Devices withheld rather than granted a whole NUMA node at a time: saying so.

Where the API server has DRAConsumableCapacity off it drops a claim's capacity request, and
a claim of one CPU gets its whole topology-aware device: every CPU of a NUMA node but the
reserved ones, which on a one-node server leaves the node's other containers (kube-proxy,
the CNI) on the reserved CPUs for as long as the claim lives. The plugin therefore
withholds those devices unless the admin allows them (``nodedra.dra.withheld``), and a node
that publishes nothing needs a person: nodedra says so where one looks, in ``/readyz``
(not ready), the log, an Event on the Node and ``nodedra_devices_withheld{gate}``. The
static policy's devices are whole by nature and never withheld.
"""

from __future__ import annotations

import logging
import threading

from nodedra.dra import Withheld
from nodedra.nodeevents import NodeEvents

log = logging.getLogger(__name__)

REASON = "WholeNUMANodeDevicesWithheld"
"""The reason of the Event on the Node."""
ACTION = "WithholdDevices"
OPT_IN = "--allow-whole-numa-node-devices=true (NODEDRA_ALLOW_WHOLE_NUMA_NODE_DEVICES)"
"""The setting that publishes them anyway."""


def problem(withheld: Withheld) -> str:
    """What is withheld, why, and the two ways out: the gate, or the opt-in."""
    return (
        f"{withheld}, a whole NUMA node. {withheld.gate} is alpha and off by default in "
        "Kubernetes 1.34 and 1.35, beta and on by default from 1.36: turn it on in the API "
        f"server, the scheduler and the kubelet, then restart nodedra; or set {OPT_IN} to "
        "publish them anyway, each claim then taking every CPU of its NUMA node but the "
        "reserved ones"
    )


def counts(withheld: Withheld | None) -> dict[str, int]:
    """Gate -> devices withheld, for ``nodedra_devices_withheld{gate}``."""
    return {} if withheld is None else {withheld.gate: len(withheld.devices)}


def report(withheld: Withheld, events: NodeEvents) -> None:
    """Log what is withheld and record it as a Warning Event on the Node (best-effort)."""
    note = problem(withheld)
    log.warning("%s", note)
    events.warning(REASON, ACTION, note)


def report_in_background(withheld: Withheld, events: NodeEvents) -> None:
    """:func:`report` in a thread of its own.

    Told from the slice publisher's thread: an API server slow to take Events must hold up
    neither publishing nor start-up.
    """
    threading.Thread(
        target=report, args=(withheld, events), name="node-events-withheld", daemon=True
    ).start()
