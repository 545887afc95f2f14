"""The runtime-facing plumbing: NRI's multiplexed ttrpc socket, its messages, the plugin loop.

Like ``nodedra.dra`` it decides nothing: which cpuset a container gets is its owner's.
"""

from .messages import Container, CPUSet, Pod, Update
from .plugin import (
    DEFAULT_SOCKET,
    EVENT_MASK,
    PINNING_MODES,
    EventObserver,
    NRIPlugin,
    PluginOptions,
    RuntimeOwner,
    check_index,
)

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
