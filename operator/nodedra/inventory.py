"""What a node has and what each policy would publish for it: ``nodedra topology``.

An administrator deciding on reserved CPUs, or wondering why a claim did not fit, wants to
see the node as nodedra sees it, without running anything against a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from nodedra.policy import POLICIES, PolicyConfig, make_policy
from nodedra.topology import Topology, format_cpu_list


def inventory(topology: Topology, config: PolicyConfig) -> dict[str, Any]:
    """The topology's JSON plus, per policy, the devices it would publish under ``config``.

    ``config``'s reserved CPUs, node-allocatable switch and NUMA attribute apply to every
    policy; its
    options and whole cores only to its own policy.
    """
    devices = {}
    for name in POLICIES:
        own = name == config.policy
        each = PolicyConfig(
            name,
            config.reserved_cpus,
            config.options if own else {},
            config.node_allocatable,
            config.full_physical_cores and own,
            config.numa_attribute,
        )
        policy = make_policy(topology, each)
        devices[name] = policy.devices()
    return {**topology.to_json(), "devices": devices}


def render_json(data: dict[str, Any]) -> str:
    """``nodedra topology --json``: one JSON object."""
    return json.dumps(data, indent=2)


def render_text(topology: Topology, data: dict[str, Any]) -> str:
    """``nodedra topology``: the same, for people."""
    return "\n".join(_text(topology, data)) + "\n"


def _text(topology: Topology, data: dict[str, Any]) -> Iterator[str]:
    online = format_cpu_list(topology.cpus)
    yield (
        f"CPUs: {len(topology.cpus)} online ({online}), "
        f"offline: {format_cpu_list(topology.offline) or 'none'}, "
        f"isolated: {format_cpu_list(topology.isolated) or 'none'}"
    )
    yield (
        f"packages: {len(topology.packages())}, cores: {len(topology.cores())}, "
        f"threads per core: {topology.threads_per_core}, "
        f"L3 caches: {len(topology.l3_caches()) or 'not shown by the kernel'}"
    )
    for node in topology.nodes.values():
        hugepages = ", ".join(f"{n}x{size >> 10}KiB" for size, n in node.hugepages.items() if n)
        caches = {c for c in (topology.cpus[c].l3_cache for c in node.cpus) if c is not None}
        yield (
            f"NUMA node {node.id}: CPUs {format_cpu_list(node.cpus) or 'none'}, "
            f"memory {node.memory / 2**30:.1f} GiB, "
            f"distances {','.join(map(str, node.distances.values()))}"
            + (f", L3 caches {format_cpu_list(caches)}" if caches else "")
            + (f", hugepages {hugepages}" if hugepages else "")
        )
    for policy, devices in data["devices"].items():
        yield ""
        yield f"{policy} devices ({len(devices)}):"
        for device in devices:
            yield f"  {device['name']}  {_describe(device)}"


def _describe(device: dict[str, Any]) -> str:
    parts = [
        f"{name.rsplit('/', 1)[-1]}={next(iter(value.values()))}"
        for name, value in device.get("attributes", {}).items()
    ]
    parts += [f"{name}={c['value']}" for name, c in device.get("capacity", {}).items()]
    return " ".join(parts)
