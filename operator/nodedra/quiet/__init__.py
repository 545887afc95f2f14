"""Quiet CPUs: the host's own work kept off the CPUs that claims hold, while they hold them.

Device interrupts and unbound kernel work, opt-in per node (the configuration's
``quietCPUs``).
"""

from .keeper import RECORD, QuietKeeper, QuietKinds, read_boot_id
from .kernelwork import KernelWork

__all__ = ["RECORD", "KernelWork", "QuietKeeper", "QuietKinds", "read_boot_id"]
