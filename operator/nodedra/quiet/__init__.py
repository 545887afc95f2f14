"""Quiet CPUs: the host's own work kept off the CPUs that claims hold, while they hold them.

Device interrupts, unbound kernel work and the host's processes (systemd's slices), opt-in
per node (the configuration's ``quietCPUs``).
"""

from pathlib import Path

from .irqbalance import RUN_DIR as IRQBALANCE_DIR
from .irqbalance import IrqBalance
from .keeper import RECORD, QuietKeeper, read_boot_id
from .kernelwork import KernelWork
from .slices import HostProcesses
from .systemd import SYSTEM_BUS
from .work import AllWork, HostWork, QuietKinds


def host_work(
    online: frozenset[int],
    irq_dir: Path,
    workqueue_dir: Path,
    system_bus: Path = SYSTEM_BUS,
    irqbalance_dir: Path | None = IRQBALANCE_DIR,
) -> AllWork:
    """Every kind of the host's work, from where the host's files, bus and sockets are.

    irqbalance comes first: whether it runs decides how interrupts are steered.
    """
    irqbalance = IrqBalance(irqbalance_dir, online)
    return AllWork(
        [
            irqbalance,
            KernelWork(irq_dir, workqueue_dir, balanced=irqbalance.running),
            HostProcesses(online, system_bus),
        ]
    )


__all__ = [
    "IRQBALANCE_DIR",
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
