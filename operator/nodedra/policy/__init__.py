"""Policies: which devices a node publishes and what each claim gets.

A policy never talks to the kubelet, the API server or kopf: it answers the resource
manager, which hosts it and makes its decisions durable.
"""

from nodedra.topology.model import Topology

from .base import ExclusiveCPUPolicy
from .config import POLICIES, ConfigError, PolicyConfig, load_config, parse_config
from .ledger import Grant, PolicyError, Shortfall
from .protocol import Policy, PolicyHost
from .static import StaticPolicy
from .topology_aware import TopologyAwarePolicy

_POLICIES: dict[str, type[ExclusiveCPUPolicy]] = {
    TopologyAwarePolicy.name: TopologyAwarePolicy,
    StaticPolicy.name: StaticPolicy,
}


def make_policy(topology: Topology, config: PolicyConfig) -> ExclusiveCPUPolicy:
    """The policy ``config`` names, for this node; PolicyError if it cannot take it."""
    return _POLICIES[config.policy](topology, config)


__all__ = [
    "POLICIES",
    "ConfigError",
    "ExclusiveCPUPolicy",
    "Grant",
    "Policy",
    "PolicyConfig",
    "PolicyError",
    "PolicyHost",
    "Shortfall",
    "StaticPolicy",
    "TopologyAwarePolicy",
    "load_config",
    "make_policy",
    "parse_config",
]
