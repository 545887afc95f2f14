"""What both policies share: the exclusive-CPU allocation flow (the protocol: protocol.py).

A policy decides which devices exist and what a claim gets. The flow around that decision
is the same for every policy that hands out exclusive CPUs: a claim seen before gets the
same answer and nothing more; a new claim gets all of its results or nothing; releasing an
unknown claim is a no-op; a reconfiguration may not take CPUs (or huge pages) that claims
hold. Subclasses say only what their devices are and how one result is granted.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from nodedra.lib.attributes import first_values
from nodedra.topology.cpulist import format_cpu_list
from nodedra.topology.model import Topology

from . import hugepages
from .config import PolicyConfig
from .ledger import Grant, Ledger, PolicyError, Shortfall, grant_edits, results_named
from .protocol import Attributes, Device, Edits, PolicyHost

if TYPE_CHECKING:  # the policy needs the plugin's types, not the plugin (nor gRPC)
    from nodedra.dra.claims import AllocationResult

log = logging.getLogger(__name__)


class ExclusiveCPUPolicy(ABC):
    """The allocation flow of policies that give claims CPUs of their own."""

    name: ClassVar[str]

    def __init__(self, topology: Topology, config: PolicyConfig) -> None:
        self._topology = topology
        self._use(self._check_config(config))
        self._ledger = Ledger()
        self._host: PolicyHost | None = None

    @property
    def config(self) -> PolicyConfig:
        """The configuration in force."""
        return self._config

    @property
    def grantable(self) -> frozenset[int]:
        """The CPUs claims may get: online and not reserved.

        With fullPhysicalCores, only those of cores no reserved CPU splits.
        """
        return self._grantable

    def whole_cores(self) -> list[frozenset[int]]:
        """The cores claims may get with fullPhysicalCores (their online threads), in order.

        A core with a reserved thread is none of them. Empty without fullPhysicalCores.
        """
        return list(self._whole_cores)

    def _use(self, config: PolicyConfig) -> None:
        """Make ``config`` the one in force, with what follows from it on this topology."""
        self._config = config
        self._whole_cores: tuple[frozenset[int], ...] = (
            tuple(_whole_cores(self._topology, config)) if config.full_physical_cores else ()
        )
        self._grantable = (
            frozenset().union(*self._whole_cores)
            if config.full_physical_cores
            else frozenset(self._topology.cpus) - config.reserved_cpus
        )

    # What subclasses say -------------------------------------------------------------

    @abstractmethod
    def devices(self) -> list[Device]:
        """The devices to publish now."""

    @abstractmethod
    def _attributes(self, device: str) -> Attributes:
        """The published attributes of ``device``; PolicyError if it is not one of ours."""

    @abstractmethod
    def _grant(self, result: AllocationResult, earlier: Sequence[Grant]) -> Grant:
        """Grant one result from what neither the ledger's claims nor ``earlier`` hold.

        ``earlier`` are the grants of the same claim's results before this one, not in the
        ledger yet. Raises PolicyError when the result cannot be granted.
        """

    @abstractmethod
    def _mismatch(self, result: AllocationResult, grant: Grant) -> str | None:
        """How ``grant`` (of a claim seen before) is not what ``result`` asks for; None if it is.

        ``result`` is of ``grant``'s device. The answer says what changed, for the kubelet's
        error: the claim's containers cannot start until someone acts on it.
        """

    def _check_node_config(self, config: PolicyConfig) -> None:  # noqa: B027 (optional hook)
        """Refuse what this node cannot take of ``config``; a hook for subclasses."""

    def _check_held(self, ledger: Ledger, config: PolicyConfig) -> None:
        """Refuse ``config`` if it would not grant what ``ledger``'s claims hold.

        Whole cores or single CPUs: a PolicyError says what to do.
        """
        for uid in sorted(ledger.uids()):
            for grant in ledger.grants(uid):
                if not self._granted_under(grant, config):
                    mode = "on" if config.full_physical_cores else "off"
                    raise PolicyError(
                        f"claim {uid} holds CPUs {format_cpu_list(grant.cpus)} of device "
                        f"{grant.device}, which fullPhysicalCores {mode} would not grant: "
                        "switch it back, or release the claims first"
                    )

    def _granted_under(self, grant: Grant, config: PolicyConfig) -> bool:
        """Whether ``grant`` is of a kind ``config`` grants; a hook for subclasses."""
        return True

    def _check_offered(self, config: PolicyConfig) -> None:  # noqa: B027 (optional hook)
        """Refuse ``config`` if it would offer less of a capacity than claims hold.

        Only less than the configuration in force offers: what a boot took already (see
        :meth:`shortfalls`) must not block every other change. A hook for subclasses.
        """

    def shortfalls(self) -> list[Shortfall]:
        """Claims holding capacity their devices do not offer now; a hook for subclasses.

        None where devices offer no capacity beyond their CPUs (CPUs that are not online
        any more are a warning of :meth:`restore`).
        """
        return []

    # The flow --------------------------------------------------------------------------

    def start(self, host: PolicyHost, claims: Mapping[str, Any]) -> None:
        """Take back the claims of a checkpoint, then publish the devices."""
        self.restore(claims)
        self._host = host
        host.publish_devices(self.devices())

    def restore(self, claims: Mapping[str, Any]) -> None:
        """Replace the claims held with a checkpoint's; PolicyError leaves them as they were.

        Also how an instance catches up with what another instance of the driver committed
        during a rolling update.
        """
        ledger = Ledger.from_json(claims)
        self._check_held(ledger, self._config)
        conflict = ledger.holders(self._config.reserved_cpus)
        if conflict:
            raise PolicyError(
                f"reservedCPUs {format_cpu_list(conflict)} are held by claims "
                f"{sorted(set(conflict.values()))} in the checkpoint: reserve other CPUs, "
                "or release those claims first"
            )
        gone = ledger.allocated_cpus() - frozenset(self._topology.cpus)
        if gone:
            log.warning("claims hold CPUs %s which are not online now", format_cpu_list(gone))
        self._ledger = ledger

    def allocate_claim(
        self, claim: Mapping[str, Any], results: Sequence[AllocationResult]
    ) -> list[Edits]:
        """Grant every result or none; a claim seen before gets its grants again."""
        uid = str(claim["metadata"]["uid"])
        if uid in self._ledger:
            grants = self._ledger.grants(uid)
            self._check_same(results, grants)
        else:
            grants = tuple(self._grant_all(results))
            self._ledger.add(uid, grants)
        return [grant_edits(uid, i, grant) for i, grant in enumerate(grants)]

    def result_attributes(self, uid: str) -> list[Attributes]:
        """Each result's device attributes and what it was granted, for the workload.

        ``cpus`` and ``memoryNodes`` (CPU lists, as in ``Cpus_allowed_list``), ``memory``
        (bytes) where the policy accounts memory, and ``hugepages_2Mi`` (bytes) and the like
        for huge pages granted: what a program reads to learn its CPUs, where it would
        otherwise parse the names of environment variables. A list-valued attribute gives
        its first value (the device's own NUMA node, of the list form), which every reader
        of the files takes.
        """
        described = []
        for grant in self._ledger.grants(uid):
            attributes: Attributes = {
                **first_values(self._attributes(grant.device)),
                "cpus": {"string": format_cpu_list(grant.cpus)},
                "memoryNodes": {"string": format_cpu_list(grant.mems)},
            }
            if grant.memory:
                attributes["memory"] = {"int": grant.memory}
            for size, amount in grant.hugepages:
                attributes[hugepages.capacity_name(size)] = {"int": amount}
            described.append(attributes)
        return described

    def release_claim(self, uid: str) -> None:
        """Give back what claim ``uid`` holds; an unknown claim holds nothing."""
        self._ledger.remove(uid)

    def reconfigure(self, config: PolicyConfig) -> None:
        """Take ``config`` unless it takes what claims hold (CPUs, huge pages); republish."""
        if config.policy != self.name:
            raise PolicyError(
                f"configuration is for policy {config.policy}, this is {self.name}: "
                "changing the policy takes a restart"
            )
        checked = self._check_config(config)
        self._check_held(self._ledger, checked)
        held = self._ledger.holders(checked.reserved_cpus)
        if held:
            raise PolicyError(
                f"can't reserve CPUs {format_cpu_list(held)}: held by claims "
                f"{sorted(set(held.values()))}"
            )
        self._check_offered(checked)
        self._use(checked)
        if self._host is not None:
            self._host.publish_devices(self.devices())

    def snapshot(self) -> dict[str, Any]:
        """The claims held, as JSON for the checkpoint."""
        return self._ledger.to_json()

    def claim_uids(self) -> frozenset[str]:
        """The UIDs of the claims held."""
        return self._ledger.uids()

    def grants(self, uid: str) -> tuple[Grant, ...]:
        """What claim ``uid`` holds (KeyError if nothing)."""
        return self._ledger.grants(uid)

    def online_cpus(self) -> frozenset[int]:
        """Every CPU of the node that is online, reserved or not."""
        return frozenset(self._topology.cpus)

    def allocated_cpus(self) -> frozenset[int]:
        """Every CPU a claim holds."""
        return self._ledger.allocated_cpus()

    def isolated_cpus(self) -> frozenset[int]:
        """The online CPUs the kernel isolated from the scheduler (``isolcpus=``)."""
        return self._topology.isolated & frozenset(self._topology.cpus)

    def results_in_environment(self, names: Iterable[str]) -> dict[str, frozenset[int]]:
        """The claims and result indexes our CDI edits' variable ``names`` stand for."""
        return results_named(names)

    def free_cpus(self) -> frozenset[int]:
        """Grantable CPUs nobody holds."""
        return self.grantable - self._ledger.allocated_cpus()

    def usage(self) -> tuple[dict[int, int], dict[int, int]]:
        """CPUs held by claims and grantable CPUs free, per NUMA node."""
        allocated, free = self._ledger.allocated_cpus(), self.free_cpus()
        nodes = self._topology.nodes.values()
        return (
            {n.id: len(n.cpus & allocated) for n in nodes if n.cpus},
            {n.id: len(n.cpus & free) for n in nodes if n.cpus},
        )

    def _grant_all(self, results: Sequence[AllocationResult]) -> list[Grant]:
        grants: list[Grant] = []
        for index, result in enumerate(results):
            try:
                grants.append(self._grant(result, grants))
            except PolicyError as err:
                raise PolicyError(
                    f"result {index} (request {result.request}, device {result.device}): {err}"
                ) from None
        return grants

    def _check_same(self, results: Sequence[AllocationResult], grants: Sequence[Grant]) -> None:
        if len(results) != len(grants):
            raise PolicyError(f"was prepared with {len(grants)} results, now has {len(results)}")
        for index, (result, grant) in enumerate(zip(results, grants, strict=True)):
            if result.device != grant.device:
                why: str | None = f"differs from what it was prepared with: device {grant.device}"
            else:
                try:
                    why = self._mismatch(result, grant)
                except PolicyError as err:  # the result is not one the policy can read now
                    why = str(err)
            if why is not None:
                raise PolicyError(
                    f"result {index} (request {result.request}, device {result.device}): {why}"
                )

    def _check_config(self, config: PolicyConfig) -> PolicyConfig:
        online = frozenset(self._topology.cpus)
        absent = config.reserved_cpus - online
        if absent:
            log.warning(
                "reservedCPUs %s are not online CPUs of this node; ignoring them",
                format_cpu_list(absent),
            )
        if online and not online - config.reserved_cpus:
            raise PolicyError(
                f"reservedCPUs {format_cpu_list(config.reserved_cpus)} reserve every online "
                f"CPU ({format_cpu_list(online)}): nothing would be left for claims"
            )
        if online and config.full_physical_cores and not _whole_cores(self._topology, config):
            raise PolicyError(
                f"reservedCPUs {format_cpu_list(config.reserved_cpus)} split every core: "
                "with fullPhysicalCores nothing would be left for claims"
            )
        self._check_node_config(config)
        return config


def _whole_cores(topology: Topology, config: PolicyConfig) -> list[frozenset[int]]:
    """The cores (their online threads) none of whose threads ``config`` reserves."""
    free = frozenset(topology.cpus) - config.reserved_cpus
    cores = {cpu.core_key: cpu.siblings for cpu in topology.cpus.values()}
    return sorted((threads for threads in cores.values() if threads <= free), key=min)
