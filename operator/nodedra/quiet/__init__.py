"""Quiet CPUs: the host's own work kept off the CPUs that claims hold, while they hold them.

Device interrupts, unbound kernel work and the host's processes (systemd's slices), opt-in
per node (the configuration's ``quietCPUs``).
"""

from pathlib import Path

from .keeper import RECORD, QuietKeeper, read_boot_id
from .kernelwork import KernelWork
from .slices import HostProcesses
from .systemd import SYSTEM_BUS
from .work import AllWork, HostWork, QuietKinds


def host_work(
    online: frozenset[int], irq_dir: Path, workqueue_dir: Path, system_bus: Path = SYSTEM_BUS
) -> AllWork:
    """Every kind of the host's work, from where the host's files and system bus are."""
    return AllWork([KernelWork(irq_dir, workqueue_dir), HostProcesses(online, system_bus)])


__all__ = [
    "RECORD",
    "SYSTEM_BUS",
    "AllWork",
    "HostWork",
    "KernelWork",
    "QuietKeeper",
    "QuietKinds",
    "host_work",
    "read_boot_id",
]
