"""The runtime-facing plumbing: NRI's multiplexed ttrpc socket, its messages, the plugin loop.

Like ``nodedra.dra`` it decides nothing: which cpuset a container gets is its owner's.
"""

from .events import EVENT_MASK, EventObserver, RuntimeOwner
from .messages import Container, CPUSet, Pod, Update
from .plugin import DEFAULT_SOCKET, PINNING_MODES, NRIPlugin, PluginOptions, check_index

__all__ = [
    "DEFAULT_SOCKET",
    "EVENT_MASK",
    "PINNING_MODES",
    "CPUSet",
    "Container",
    "EventObserver",
    "NRIPlugin",
    "PluginOptions",
    "Pod",
    "RuntimeOwner",
    "Update",
    "check_index",
]
