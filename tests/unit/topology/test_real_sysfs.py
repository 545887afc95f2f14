"""read_topology on the sysfs of the machine running the tests."""

from __future__ import annotations

import os

from nodedra.topology import parse_cpu_list, read_topology


def test_this_machine() -> None:
    topology = read_topology()
    assert topology.cpus, "this machine runs on at least one online CPU"
    assert any(cpu in node.cpus for node in topology.nodes.values() for cpu in topology.cpus)
    for cpu_id in topology.cpu_ids:
        assert cpu_id in topology.node_of(cpu_id).cpus
    with open("/sys/devices/system/cpu/online", encoding="ascii") as online:
        assert set(topology.cpu_ids) == parse_cpu_list(online.read())
    # We run on some of the online CPUs, and only on online ones.
    assert os.sched_getaffinity(0) <= set(topology.cpu_ids)
