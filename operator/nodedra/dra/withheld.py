"""Devices kept off the slices where the API server would make them whole.

A device offered in parts (``allowMultipleAllocations`` and request policies: consumable
capacity) is stored without them by an API server with DRAConsumableCapacity off, and every
claim of it then gets all of it, however little it asks for. With the topology-aware policy
that is a whole NUMA node: on a one-node server every CPU but the reserved ones, which leaves
the node's other containers (kube-proxy, the CNI) on the reserved CPUs for as long as the
claim lives. The gate is alpha and off by default in Kubernetes 1.34 and 1.35 (beta and on by
default from 1.36), so that is what such a cluster does unless its admin acts.

So such devices are withheld unless the owner allows them whole
(``PluginSettings.whole_devices_allowed``). Devices that are whole by nature (the static
policy's CPUs and cores, sized by the admin) use no consumable capacity and are published
either way: withholding them would change nothing a claim gets.

When the server cannot be asked (it does not answer, or answers with an error that tells
nothing about the gate) the pass fails, with an error naming the gate, and is retried:
nothing is published meanwhile, neither whole nor in parts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .kube import KubeAPIError
from .probes import CONSUMABLE_CAPACITY, GateProbe
from .slices import Device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Withheld:
    """Devices not published because the server would make each a whole device."""

    gate: str
    """The feature gate that is off."""
    devices: tuple[str, ...]
    """The devices' names, in the order the policy gave them."""

    def __str__(self) -> str:
        return (
            f"{len(self.devices)} devices withheld ({', '.join(self.devices)}): the API server "
            f"has feature gate {self.gate} off, so a claim of one would take all of it, "
            "however little it asks for"
        )


class WholeDevices:
    """What the publisher applies: devices as the server keeps them, less those withheld.

    ``on_withheld`` is told, from the publishing thread, each time what is withheld changes
    to something (not on every pass): it must not block.
    """

    def __init__(
        self,
        gates: GateProbe,
        *,
        allowed: bool,
        on_withheld: Callable[[Withheld], None] | None = None,
    ) -> None:
        self._gates = gates
        self._allowed = allowed
        self._on_withheld = on_withheld
        self._mu = threading.Lock()
        self._withheld: Withheld | None = None

    def withheld(self) -> Withheld | None:
        """What the last pass withheld; None if nothing."""
        with self._mu:
            return self._withheld

    def adapt(self, devices: Sequence[Device]) -> Sequence[Device]:
        """``devices`` as the server keeps them, without those it would make whole.

        KubeAPIError naming the gate when the server cannot tell whether it is on.
        """
        gate = CONSUMABLE_CAPACITY
        shared = [d for d in devices if gate.uses(d)]
        withheld = None
        if shared and not self._allowed:
            try:
                on = self._gates.on(gate)
            except KubeAPIError as err:
                raise KubeAPIError(
                    err.status,
                    f"cannot tell whether the API server has feature gate {gate.name} on, so "
                    f"devices a claim could take whole are not published until it can: {err}",
                ) from err
            if not on:
                withheld = Withheld(gate.name, tuple(str(d["name"]) for d in shared))
                devices = [d for d in devices if not gate.uses(d)]
        with self._mu:
            before, self._withheld = self._withheld, withheld
        if withheld is not None and withheld != before and self._on_withheld is not None:
            self._on_withheld(withheld)
        return self._gates.as_kept(devices)
