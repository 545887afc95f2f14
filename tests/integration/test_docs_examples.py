"""The examples of docs/latency-sensitive-workloads.md, docs/configuration.md,
docs/hugepages.md and docs/beside-devices.md, as the API server and nodedra take them.

Each YAML block is either a Kubernetes object, created on the real API server with a dry run
and strict field validation (a misspelt field fails), or a nodedra configuration, parsed and
given to its policy on the fixture machine the latency page describes (28 cores of two
threads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from nodedra.policy import make_policy, parse_config
from nodedra.topology import read_topology
from tests.pages import code_blocks
from tests.peers.controlplane import ControlPlane
from tests.reliability.helpers import ROOT, SYSFS

PAGE = ROOT / "docs" / "latency-sensitive-workloads.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
HUGEPAGES = ROOT / "docs" / "hugepages.md"
BESIDE = ROOT / "docs" / "beside-devices.md"
COLLECTIONS = {
    "ResourceClaim": "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims",
    "ResourceClaimTemplate": "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaimtemplates",
    "Pod": "/api/v1/namespaces/{}/pods",
}


def examples(page: Path = PAGE) -> list[dict[str, Any]]:
    return [yaml.safe_load(block) for block in code_blocks(page.read_text(), "yaml")]


def kinds(page: Path = PAGE) -> list[str]:
    """The kinds of the page's examples, sorted; a configuration is ``config of <policy>``."""
    return sorted(e.get("kind") or f"config of {e['policy']}" for e in examples(page))


def test_the_page_has_an_example_of_each_kind() -> None:
    assert kinds() == [
        "Pod",
        "ResourceClaimTemplate",
        "ResourceClaimTemplate",
        "ResourceClaimTemplate",
        "ResourceClaimTemplate",
        "ResourceClaimTemplate",
        "ResourceClaimTemplate",
        "config of static",
        "config of topology-aware",
    ]


@pytest.mark.parametrize(
    "example", [e for e in examples() if "kind" not in e], ids=lambda e: e["policy"]
)
def test_each_configuration_is_taken_on_the_machine_it_is_written_for(
    example: dict[str, Any],
) -> None:
    config = parse_config(example)
    policy = make_policy(read_topology(SYSFS), config)
    assert config.full_physical_cores
    assert len(policy.whole_cores()) == 27, "CPUs 0 and 28 are one core, reserved whole"


def test_the_configuration_page_has_its_examples() -> None:
    assert kinds(CONFIGURATION) == [
        "ResourceClaimTemplate",
        "ResourceClaimTemplate",
        "config of topology-aware",
    ]


@pytest.mark.parametrize(
    "example", [e for e in examples(CONFIGURATION) if "kind" not in e], ids=lambda e: e["policy"]
)
def test_the_configuration_page_s_file_is_taken(example: dict[str, Any]) -> None:
    make_policy(read_topology(SYSFS), parse_config(example))


def test_the_huge_pages_page_s_reservation_is_kept_out_of_claims() -> None:
    """The fixture machine's node 0 has 1024 pages of 2 MiB and 4 of 1 GiB."""
    assert kinds(HUGEPAGES) == ["ResourceClaim", "config of topology-aware"]
    (config,) = [e for e in examples(HUGEPAGES) if "kind" not in e]
    device, *_ = make_policy(read_topology(SYSFS), parse_config(config)).devices()
    offered = {name: c["value"] for name, c in device["capacity"].items() if "hugepages" in name}
    assert offered == {"hugepages_2Mi": str((2048 - 64) << 20), "hugepages_1Gi": str(3 << 30)}


def test_the_beside_page_s_configuration_publishes_the_list_and_the_alias() -> None:
    assert kinds(BESIDE) == [
        "ResourceClaimTemplate",
        "ResourceClaimTemplate",
        "config of topology-aware",
    ]
    (config,) = [e for e in examples(BESIDE) if "kind" not in e]
    policy = make_policy(read_topology(SYSFS), parse_config(config))
    for device in policy.devices():
        attributes = device["attributes"]
        node = attributes["numaNode"]["int"]
        assert attributes["dra.net/numaNode"] == {"int": node}
        assert attributes["resource.kubernetes.io/numaNode"]["ints"][0] == node


@pytest.mark.parametrize(
    "example",
    [e for page in (PAGE, CONFIGURATION, HUGEPAGES, BESIDE) for e in examples(page) if "kind" in e],
    ids=lambda e: e["metadata"]["name"],
)
def test_each_object_is_valid_for_the_api_server(
    control_plane: ControlPlane, namespace: str, example: dict[str, Any]
) -> None:
    collection = COLLECTIONS[example["kind"]].format(namespace)
    created = control_plane.request(
        "POST", f"{collection}?dryRun=All&fieldValidation=Strict", example
    )
    assert (created["kind"], created["metadata"]["name"]) == (
        example["kind"],
        example["metadata"]["name"],
    )
