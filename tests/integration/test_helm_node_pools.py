"""Node pools of charts/nodedra: a DaemonSet and a ConfigMap per kind of node, never two
nodedra on one node.

Rendered with the real helm (``helm template``; the API server's dry run takes them too); the
DaemonSets' node selectors and required node affinity are evaluated, with Kubernetes'
semantics, for nodes with every combination of the pools' labels. test_deploy runs a pool on a
real node.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodedra.policy import PolicyConfig, load_config
from tests.integration import test_helm_chart
from tests.integration.test_helm_chart import Object, Tools, check_accepted, objects_of
from tests.integration.test_helm_platform_values import (
    POOLS,
    bad_cases,
    daemonsets,
    pod_spec,
    refused,
    render,
)
from tests.peers.controlplane import ControlPlane

#: helm and kubectl (the fixture of test_helm_chart, shared).
tools = test_helm_chart.tools

POOL_LABEL = "nodedra.nri.io/node-pool"


# -- rendering -----------------------------------------------------------------------------------


def matches(requirement: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A node selector requirement (Kubernetes' semantics: NotIn holds where the label is
    missing)."""
    key, operator = requirement["key"], requirement["operator"]
    values = requirement.get("values", [])
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {operator} is not expected in the chart's rendering")


def schedules_on(daemonset: Object, labels: Mapping[str, str]) -> bool:
    """Whether the DaemonSet's pod may run on a node with ``labels`` (its nodeSelector and
    required node affinity: terms ORed, a term's expressions ANDed)."""
    spec = pod_spec(daemonset)
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (
        (spec.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if required is None:
        return True
    return any(
        all(matches(r, labels) for r in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    )


def test_node_pools_render_a_daemonset_and_config_each(tools: Tools, tmp_path: Path) -> None:
    rendered = render(tools, tmp_path, POOLS)
    sets = daemonsets(rendered)
    assert sorted(sets) == ["nodedra", "nodedra-big", "nodedra-static"]
    configs = {c["metadata"]["name"]: c for c in objects_of(rendered, "ConfigMap")}
    assert sorted(configs) == ["nodedra-config", "nodedra-config-big", "nodedra-config-static"]
    loaded: dict[str, PolicyConfig] = {}
    for name, daemonset in sets.items():
        (volume,) = [v for v in pod_spec(daemonset)["volumes"] if v["name"] == "config"]
        config = configs[volume["configMap"]["name"]]
        path = tmp_path / f"{name}.yaml"
        path.write_text(config["data"]["config.yaml"])
        loaded[name] = load_config(path)
        pool = name.removeprefix("nodedra").removeprefix("-")
        labels = daemonset["spec"]["template"]["metadata"]["labels"]
        assert daemonset["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert labels.get(POOL_LABEL) == (pool or None), name
    assert loaded["nodedra"] == PolicyConfig("topology-aware", frozenset({0}), {}, True)
    assert loaded["nodedra-big"] == PolicyConfig(
        "topology-aware", frozenset({0, 1, 2, 3}), {"reservedMemory": 4 * 1024**3}, True
    )
    assert (loaded["nodedra-static"].policy, loaded["nodedra-static"].full_physical_cores) == (
        "static",
        True,
    )
    assert pod_spec(sets["nodedra-big"])["nodeSelector"] == {"node.example.com/size": "big"}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"nodeSelector": {"kubernetes.io/os": "linux"}},
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            },
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["b"]}
                                ]
                            },
                        ]
                    }
                }
            }
        },
    ],
    ids=["alone", "with-node-selector", "with-affinity-terms"],
)
def test_node_pools_never_share_a_node(tools: Tools, tmp_path: Path, extra: dict[str, Any]) -> None:
    """Every node nodedra runs on at all runs exactly one nodedra, whichever pool labels it
    has (both pools' too: the first pool listed takes it)."""
    rendered = render(tools, tmp_path, {**POOLS, **extra})
    sets = daemonsets(rendered)
    choices = {
        "node.example.com/size": [None, "big", "small"],
        "node.example.com/policy": [None, "static"],
        "kubernetes.io/os": [None, "linux"],
        "zone": [None, "a", "b"],
    }
    eligible = 0
    for combination in itertools.product(*choices.values()):
        labels = {k: v for k, v in zip(choices, combination, strict=True) if v is not None}
        running = [name for name, ds in sets.items() if schedules_on(ds, labels)]
        baseline = (
            schedules_on(daemonsets(render(tools, tmp_path, extra))["nodedra"], labels)
            if extra
            else True
        )
        assert len(running) == (1 if baseline else 0), (labels, running)
        if running:
            eligible += 1
            expected = (
                "nodedra-big"
                if labels.get("node.example.com/size") == "big"
                else "nodedra-static"
                if labels.get("node.example.com/policy") == "static"
                else "nodedra"
            )
            assert running == [expected], labels
    assert eligible > 0


def test_node_pools_are_accepted_by_the_api_server(
    tools: Tools, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({**POOLS, "kubeletDir": "/var/lib/k0s/kubelet"}))
    check_accepted(
        tools, control_plane, namespace, "-f", str(path), "--set", "namespace.create=false"
    )


# -- bad values -----------------------------------------------------------------------------------

POOL = {"name": "big", "nodeSelector": {"size": "big"}}

#: Pools the chart refuses, and what it says.
BAD_POOLS: list[tuple[str, dict[str, Any], str]] = [
    ("pools-map", {"nodePools": {"big": POOL}}, "nodePools: is not a list of pools"),
    (
        "pool-key",
        {"nodePools": [{**POOL, "pinning": "off"}]},
        'nodePools[0]: "pinning" is not a pool\'s key',
    ),
    (
        "pool-name",
        {"nodePools": [{**POOL, "name": "Big"}]},
        'nodePools[0]: name "Big" is not a DNS label',
    ),
    (
        "pool-name-twice",
        {"nodePools": [POOL, {**POOL, "nodeSelector": {"size": "huge"}}]},
        'nodePools[1]: name "big" is nodePools[0]\'s already',
    ),
    (
        "pool-label-twice",
        {"nodePools": [POOL, {**POOL, "name": "huge"}]},
        "nodePools[1]: nodeSelector size=big is nodePools[0]'s already",
    ),
    (
        "pool-two-labels",
        {"nodePools": [{**POOL, "nodeSelector": {"size": "big", "zone": "a"}}]},
        "nodePools[0]: nodeSelector must be one label (key: value)",
    ),
    (
        "pool-no-label",
        {"nodePools": [{"name": "big"}]},
        "nodePools[0]: nodeSelector must be one label",
    ),
    (
        "pool-policy",
        {"nodePools": [{**POOL, "policy": "dynamic"}]},
        'nodePools[0].policy: "dynamic" is not one of',
    ),
    (
        "pool-whole-cores",
        {"nodePools": [{**POOL, "fullPhysicalCores": "yes"}]},
        'nodePools[0].fullPhysicalCores: "yes" is not true or false',
    ),
]


@pytest.mark.parametrize(("values", "message"), bad_cases(BAD_POOLS))
def test_bad_pools_are_refused(
    tools: Tools, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    assert message in refused(tools, tmp_path, values)
