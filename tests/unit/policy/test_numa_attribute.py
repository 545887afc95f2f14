"""``numaNodeAttribute``: the standard NUMA attribute's forms, its aliases, nodedra's own.

The list form is compared with the official helper on every fixture by
tests/integration/test_numa_attribute.py; here its rules, one fixture each.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodedra.lib.attributes import first_values
from nodedra.policy import ConfigError, make_policy, parse_config
from nodedra.policy.numa_attribute import OWN_ATTRIBUTE, nearest
from nodedra.policy.protocol import NUMA_NODE_ATTRIBUTE
from tests.unit.policy.conftest import Host, ask, claim, topology


def test_the_list_names_the_nearest_nodes_of_the_socket_after_the_node() -> None:
    """NPS4: four nodes a socket, all at distance 12 of each other, 32 across sockets."""
    epyc = topology("epyc-2s-nps4")
    assert nearest(epyc, 1) == [1, 0, 2, 3]
    assert nearest(epyc, 4) == [4, 5, 6, 7]


def test_nodes_of_another_socket_at_the_same_distance_are_left_out() -> None:
    """two-socket-smt2-numa4: node 0's nearest are 1 (11) and not 2 and 3 (21)."""
    assert nearest(topology("two-socket-smt2-numa4"), 0) == [0, 1]
    assert nearest(topology("two-socket-smt2-numa4"), 3) == [3, 2]


def test_a_memory_only_node_counts_as_on_the_socket_and_takes_every_nearest_node() -> None:
    snc = topology("snc-memory-only")
    assert not snc.nodes[2].cpus
    assert nearest(snc, 0) == [0, 1]
    assert nearest(snc, 2) == [2, 0, 1]


def test_a_node_alone_is_a_list_of_itself() -> None:
    assert nearest(topology("epyc-2s-nps1"), 1) == [1]
    assert nearest(topology("single-socket-nosmt"), 0) == [0]


def published(policy: str, **setting: Any) -> list[dict[str, Any]]:
    config = {"policy": policy, "numaNodeAttribute": setting}
    p = make_policy(topology("two-socket-smt2-numa4"), parse_config(config))
    p.start(host := Host(), {})
    return host.published[-1]


@pytest.mark.parametrize("policy", ["topology-aware", "static"])
def test_the_scalar_by_default_and_nodedra_s_own_always(policy: str) -> None:
    for device in published(policy):
        attributes = device["attributes"]
        node = attributes[OWN_ATTRIBUTE]
        assert attributes[NUMA_NODE_ATTRIBUTE] == node, device
        assert set(node) == {"int"}


@pytest.mark.parametrize("policy", ["topology-aware", "static"])
def test_the_list_form_and_aliases_on_every_device(policy: str) -> None:
    aliases = ["dra.net/numaNode", "example.com/node"]
    for device in published(policy, form="list", aliases=aliases):
        attributes = device["attributes"]
        node = attributes[OWN_ATTRIBUTE]["int"]
        assert attributes[NUMA_NODE_ATTRIBUTE] == {"ints": [node, node ^ 1]}, device
        assert all(attributes[alias] == {"int": node} for alias in aliases), device


def test_a_claim_s_device_metadata_has_the_node_alone() -> None:
    """Programs read one node from the metadata file, whatever the slices' form."""
    config = {"numaNodeAttribute": {"form": "list"}}
    p = make_policy(topology("two-socket-smt2-numa4"), parse_config(config))
    p.start(Host(), {})
    p.allocate_claim(claim("a"), [ask("cpudevnuma002", cpu="2")])
    (attributes,) = p.result_attributes("a")
    assert attributes[NUMA_NODE_ATTRIBUTE] == {"int": 2}
    assert first_values({"x": {"strings": ["a", "b"]}, "y": {"bool": True}}) == {
        "x": {"string": "a"},
        "y": {"bool": True},
    }


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"form": "lists"}, "form: 'lists' is not one of ['scalar', 'list']"),
        ({"aliases": ["numaNode"]}, "'numaNode' is not a qualified attribute name"),
        ({"aliases": ["dra.net/" + "n" * 33]}, "is not a qualified attribute name"),
        ({"aliases": ["Dra.net/numaNode"]}, "is not a qualified attribute name"),
        ({"aliases": ["resource.kubernetes.io/pcieRoot"]}, "is a standard attribute's name"),
        ({"aliases": ["a.io/n", "a.io/n"]}, "names one attribute twice"),
        ({"aliases": [f"a{i}.io/n" for i in range(5)]}, "a list of at most 4 names"),
        ({"shape": "list"}, "unknown keys ['shape']"),
        ("list", "must be a mapping"),
    ],
)
def test_bad_settings_are_refused_with_where(setting: object, message: str) -> None:
    with pytest.raises(ConfigError, match="numaNodeAttribute") as raised:
        parse_config({"numaNodeAttribute": setting}, "nodedra.yaml")
    assert message in str(raised.value)
    assert str(raised.value).startswith("nodedra.yaml: numaNodeAttribute")
