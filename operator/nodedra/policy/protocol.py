"""The Policy protocol: what the resource manager and the plugin ask of a policy.

Apart from the flow both policies share (``base.py``): the resource manager and the
containers' pinning depend on what a policy answers, not on how a policy is built; and
the devices' JSON types and the one attribute every policy publishes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .config import PolicyConfig
from .ledger import Grant, Shortfall

if TYPE_CHECKING:  # the policy needs the plugin's types, not the plugin (nor gRPC)
    from nodedra.dra.claims import AllocationResult

Device = dict[str, Any]
Edits = dict[str, Any]
Attributes = dict[str, dict[str, object]]
"""A device's attributes as a ResourceSlice has them: name -> {"int": 0} (or string...)."""

NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"
"""The standard device attribute naming a device's NUMA node (both policies publish it)."""


class PolicyHost(Protocol):
    """What a policy asks of whoever hosts it (the resource manager)."""

    def publish_devices(self, devices: Sequence[Mapping[str, Any]]) -> None:
        """Replace the published devices. Called with the owner's lock held."""
        ...


class Policy(Protocol):
    """A policy as the resource manager and the plugin use it."""

    @property
    def name(self) -> str:
        """The policy's name; the DRA driver is named after it."""
        ...

    @property
    def config(self) -> PolicyConfig:
        """The configuration in force."""
        ...

    def devices(self) -> list[Device]:
        """The devices to publish now, in ResourceSlice JSON."""
        ...

    def start(self, host: PolicyHost, claims: Mapping[str, Any]) -> None:
        """Take back the claims of a checkpoint (``snapshot()``'s form), then publish."""
        ...

    def restore(self, claims: Mapping[str, Any]) -> None:
        """Replace the claims held with those of a checkpoint (``snapshot()``'s form)."""
        ...

    def allocate_claim(
        self, claim: Mapping[str, Any], results: Sequence[AllocationResult]
    ) -> list[Edits]:
        """Grant ``claim``'s results; one CDI container edit per result."""
        ...

    def result_attributes(self, uid: str) -> list[Attributes]:
        """What each result of claim ``uid`` (held) tells its containers: device metadata."""
        ...

    def release_claim(self, uid: str) -> None:
        """Give back what claim ``uid`` holds; unknown claims are fine."""
        ...

    def reconfigure(self, config: PolicyConfig) -> None:
        """Take a new configuration, or refuse it (PolicyError) and keep the old one."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The claims held, as JSON for the checkpoint."""
        ...

    def claim_uids(self) -> frozenset[str]:
        """The UIDs of the claims held."""
        ...

    def grants(self, uid: str) -> tuple[Grant, ...]:
        """What claim ``uid`` holds, one grant per result (KeyError if nothing)."""
        ...

    def usage(self) -> tuple[dict[int, int], dict[int, int]]:
        """CPUs held by claims and grantable CPUs free, per NUMA node."""
        ...

    def shortfalls(self) -> list[Shortfall]:
        """Claims holding capacity their devices do not offer now (a boot with fewer pages)."""
        ...

    def online_cpus(self) -> frozenset[int]:
        """Every CPU of the node that is online, reserved or not."""
        ...

    def allocated_cpus(self) -> frozenset[int]:
        """Every CPU a claim holds."""
        ...

    def isolated_cpus(self) -> frozenset[int]:
        """The online CPUs the kernel isolated from the scheduler (``isolcpus=``)."""
        ...

    def results_in_environment(self, names: Iterable[str]) -> dict[str, frozenset[int]]:
        """The claims and result indexes that environment variables ``names`` stand for."""
        ...
