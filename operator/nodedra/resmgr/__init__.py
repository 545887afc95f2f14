"""The resource manager: the plugin's Owner, the policy's host, the checkpoint's keeper."""

from .checkpoint import Checkpoint, CheckpointError, State
from .containers import reserved_pods
from .manager import ManagerOptions, ResourceManager

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "ManagerOptions",
    "ResourceManager",
    "State",
    "reserved_pods",
]
