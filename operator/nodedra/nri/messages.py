"""Pods, containers and cpusets as nodedra sees them in NRI's messages.

The runtime's messages carry much more than pinning needs. What is used is read into small
frozen values here, at the boundary: the pod's identity, the container's identity, the CDI
devices the kubelet asked for, the *names* of its environment variables (their values are
never kept: a container could set any value it likes, so nothing may be decided on one),
the cpuset it runs with and the cgroup it runs in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from nodedra.grpc_gen import nri_v1alpha1_pb2 as pb


@dataclass(frozen=True)
class Pod:
    """A pod sandbox."""

    id: str
    uid: str
    """The Kubernetes pod's UID ("" for sandboxes that are not a pod's)."""
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class CPUSet:
    """Where a container runs: cpu lists as the kernel writes them; "" leaves it unchanged."""

    cpus: str
    mems: str = ""


@dataclass(frozen=True)
class Container:
    """A container, as far as pinning cares."""

    id: str
    pod_id: str
    name: str
    cdi_devices: tuple[str, ...]
    """Qualified CDI device names (filled by containerd from 2.3 on)."""
    env_names: frozenset[str]
    """The names of its environment variables, CDI edits included; never their values."""
    cpuset: CPUSet
    """What it runs with now, as the runtime says."""
    cgroups_path: str = ""
    """Its cgroup as the runtime names it: a path, or systemd's ``slice:prefix:name``; ""
    if not told. Only read to show where it runs (``nodedra status``)."""


@dataclass(frozen=True)
class Update:
    """A change of a container's cpuset, for the runtime to make."""

    container_id: str
    cpuset: CPUSet


def pod_of(message: pb.PodSandbox) -> Pod:
    """The pod of an NRI PodSandbox."""
    return Pod(message.id, message.uid, message.namespace, message.name)


def container_of(message: pb.Container) -> Container:
    """The container of an NRI Container."""
    cpu = message.linux.resources.cpu
    return Container(
        id=message.id,
        pod_id=message.pod_sandbox_id,
        name=message.name,
        cdi_devices=tuple(device.name for device in message.CDI_devices),
        env_names=frozenset(entry.partition("=")[0] for entry in message.env),
        cpuset=CPUSet(cpu.cpus, cpu.mems),
        cgroups_path=message.linux.cgroups_path,
    )


def resources(cpuset: CPUSet) -> pb.LinuxResources:
    """The NRI resources that set ``cpuset`` and leave everything else as it is."""
    return pb.LinuxResources(cpu=pb.LinuxCPU(cpus=cpuset.cpus, mems=cpuset.mems))


def container_updates(updates: Iterable[Update]) -> list[pb.ContainerUpdate]:
    """NRI's ContainerUpdate messages for ``updates``."""
    return [
        pb.ContainerUpdate(
            container_id=update.container_id,
            linux=pb.LinuxContainerUpdate(resources=resources(update.cpuset)),
        )
        for update in updates
    ]
